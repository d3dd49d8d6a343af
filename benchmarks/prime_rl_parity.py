"""prime-rl's RL loss and gradient against the local trainer's, on one step's real rollouts and real weights
(issue 39, item 2; docs/prime-rl.md).

The rollouts prime-rl saved for a step (``<output_dir>/run_default/rollouts/step_<S>/train/{effective,all}/
traces.jsonl``) are rebuilt into the samples its trainer got, through prime-rl's own code with our algorithm
(``trace_to_samples``, `PredictAlgorithm`'s ``finalize_rollout`` / ``finalize_group``, the zero-advantage filter,
the trainer's ``prepare_sample``). One forward of the model the step started from gives the trainer's logprobs
(temperature-scaled, shifted as prime-rl's trainer shifts them); then the same logprobs go through prime-rl's
``compute_loss`` with the rendered ``[trainer.loss]`` and through the local trainer's ``predict_loss``, each with
its own backward: their losses and the gradient norms over the model's parameters must agree within the dtype's
tolerance. With ``--trainer-metrics`` prime-rl's own logged grad norm for the step is printed beside them (its
packing and kernels differ, so that comparison is looser). CE-only samples are counted, with their weights (alpha).

Runs in an interpreter with prime-rl's runtime (its venv, or envs/prime-rl-offline-node.sh's site on PYTHONPATH):

    python benchmarks/prime_rl_parity.py [--prime-rl SRC --verifiers VF_SRC] --config CONFIG --traces TRACES.jsonl \
        --model DIR [--trainer-metrics OUTPUT_DIR/metrics.jsonl --step S] [--device cuda --dtype bfloat16] [--out J]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

STUBBED = ("wandb",)  # imported by prime-rl's utils, never called on this path


def logged_loss_and_grad_norm(metrics: Path, step: int) -> dict[str, float]:
    """prime-rl's own loss and grad-norm values of ``step`` from its trainer's metrics.jsonl. The trainer writes a
    step as several records (perf, optim, loss, time, system), so they are merged: the last alone holds neither."""
    logged: dict[str, float] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == step:
            logged |= {k: v for k, v in record.items() if "loss" in k or "grad_norm" in k}
    return logged


def rebuild_samples(
    traces: Path, alpha: float, temperature: float, tokenizer_dir: str
) -> tuple[list[Any], dict[str, Any]]:
    """The trainer's samples of one step from prime-rl's saved traces (failed rollouts dropped, as its sink does)."""
    from prime_rl.configs.algorithm import AlgoConfig
    from prime_rl.orchestrator.algo import build_algorithm
    from prime_rl.orchestrator.filters import ZeroAdvantageFilter, apply_filters
    from prime_rl.orchestrator.trajectories import trace_to_samples
    from prime_rl.orchestrator.types import Rollout
    from prime_rl.trainer.batch import prepare_sample
    from pydantic import TypeAdapter
    from tokenizers import Tokenizer

    groups: dict[str, list[Any]] = {}
    failed = 0
    for line in traces.read_text().splitlines():
        record = json.loads(line)
        if not record.get("ok"):
            failed += 1
            continue
        r = Rollout.model_validate(record)
        r.env_name = record["info"].get("env_name", "predict_mbpp")
        r.samples = trace_to_samples(r, env_name=r.env_name)
        groups.setdefault(record["info"].get("group_id", r.id), []).append(r)
    config = TypeAdapter(AlgoConfig).validate_python({"type": "predict", "alpha": alpha, "tokenizer": tokenizer_dir})
    algo = build_algorithm(config, policy_pool=None)
    algo.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))

    async def score() -> None:
        for group in groups.values():
            for r in group:
                await algo.finalize_rollout(r)
            await algo.finalize_group(group)
            apply_filters([ZeroAdvantageFilter(name="zero_advantage", enforce=True)], group)

    asyncio.run(score())
    samples = []
    for group in groups.values():
        for r in group:
            if r.is_filtered:
                continue
            for s in r.samples:
                s.temperatures = [temperature] * len(s.token_ids)
                samples.append(prepare_sample(s, seq_len=1 << 20))
    info = {"groups": len(groups), "rollouts": sum(map(len, groups.values())), "failed_dropped": failed}
    return samples, info


def trainer_logprobs(model: Any, samples: list[Any], device: str) -> list[Any]:
    """Per sample: logprob of token t given its prefix at the sample's temperatures, position 0 padded (prime-rl's
    ``shift_tensor_right``); graph kept for the backward."""
    import torch

    out = []
    for s in samples:
        ids = torch.tensor([s.input_ids], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        temps = torch.tensor(s.temperatures[1:], device=device, dtype=torch.float32).unsqueeze(-1)
        lp = torch.log_softmax(logits / temps, dim=-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        out.append(torch.cat([lp.new_zeros(1), lp]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prime-rl", default=None, help="the patched prime-rl tree (default: the installed prime_rl)")
    ap.add_argument("--verifiers", default=None, help="verifiers at prime-rl's pin (default: the installed one)")
    ap.add_argument("--config", required=True, help="the study config the run was rendered from")
    ap.add_argument("--run", default="B", help="the run (its alpha)")
    ap.add_argument("--traces", required=True, type=Path)
    ap.add_argument("--model", required=True, help="HF folder of the weights the step started from")
    ap.add_argument("--trainer-metrics", type=Path, default=None)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    repo = Path(__file__).resolve().parents[1]
    prl = args.prime_rl
    trees = [f"{prl}/src", f"{prl}/packages/prime-rl-configs/src"] if prl else []
    sys.path[:0] = [str(repo / "src"), *([args.verifiers] if args.verifiers else []), *trees]
    for name in STUBBED:
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = mock.MagicMock(name=name)
    import torch
    from prime_rl.configs.trainer import LossConfig
    from prime_rl.trainer.rl.loss import compute_loss, setup_rl_loss_fn
    from pydantic import TypeAdapter
    from transformers import AutoModelForCausalLM

    from predict.config import load_config
    from predict.env.runner import default_tokenizer_dir
    from predict.runs import resolve_run
    from predict.train.loss import LossConfig as LocalLossConfig
    from predict.train.loss import predict_loss
    from predict.train.prime_rl.configs import loss_table, rl_settings, train_sampling

    cfg = load_config(args.config)
    design = rl_settings(cfg)
    alpha = float(resolve_run(cfg, args.run).alpha)
    temperature = train_sampling(cfg, design)["temperature"]  # the train sink stamps it on every token
    samples, info = rebuild_samples(args.traces, alpha, temperature, str(default_tokenizer_dir()))
    if not samples:
        raise SystemExit(f"{args.traces}: no sample survives (every rollout failed or had zero advantage)")
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device)
    model.train()

    def stream(s: Any, key: str, default: float | None = None) -> Any:
        value = getattr(s, key)
        if value is None:
            value = [default] * len(s.input_ids) if default is not None else s.loss_mask
        return torch.tensor(value, device=args.device, dtype=torch.float32 if key != "loss_mask" else torch.bool)

    rl_w = [stream(s, "rl_weights") * stream(s, "loss_mask") for s in samples]
    ce_w = [stream(s, "ce_weights", 0.0) for s in samples]
    n_rl = max(int(sum(int((w != 0).sum()) for w in rl_w)), 1)
    n_ce = max(int(sum(int((w != 0).sum()) for w in ce_w)), 1)

    def grad_norm() -> float:
        norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
        return float(torch.stack(norms).norm())

    def prime_rl() -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        new = trainer_logprobs(model, samples, args.device)
        loss, _ = compute_loss(
            trainer_logprobs=new,
            inference_logprobs=[stream(s, "inference_logprobs") for s in samples],
            ref_logprobs=None,
            advantages=[stream(s, "advantages") for s in samples],
            loss_mask=[stream(s, "loss_mask") for s in samples],
            rl_weights=[stream(s, "rl_weights", 1.0) for s in samples],
            ce_weights=[stream(s, "ce_weights", 0.0) for s in samples],
            ref_kl_weights=None,
            rl_loss_fn=setup_rl_loss_fn(TypeAdapter(LossConfig).validate_python(loss_table(design))),
            rl_scale=n_rl,
            ce_scale=n_ce,
            ref_kl_scale=1,
        )
        loss.backward()
        return float(loss.detach()), grad_norm()

    def local() -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        new = trainer_logprobs(model, samples, args.device)
        width = max(len(x) for x in new)

        def pad(rows: list[Any]) -> Any:
            return torch.stack([torch.nn.functional.pad(r.float(), (0, width - len(r))) for r in rows])

        batch = {"logprobs": pad([stream(s, "inference_logprobs") for s in samples]),
                 "advantages": pad([stream(s, "advantages") for s in samples]),
                 "rl_weights": pad(rl_w), "ce_weights": pad(ce_w)}
        loss, _ = predict_loss(pad(new), batch, LocalLossConfig(design.eps_low, design.eps_high, design.kl_coef),
                               n_rl=n_rl, n_ce=n_ce)
        loss.backward()
        return float(loss.detach()), grad_norm()

    p_loss, p_norm = prime_rl()
    l_loss, l_norm = local()
    ce_values = sorted({round(float(v), 6) for w in ce_w for v in w[w != 0].tolist()})
    result: dict[str, Any] = {
        **info, "samples": len(samples), "rl_tokens": n_rl, "ce_tokens": n_ce, "ce_weights": ce_values,
        "alpha": alpha, "dtype": args.dtype, "device": args.device,
        "prime_rl": {"loss": p_loss, "grad_norm": p_norm}, "local": {"loss": l_loss, "grad_norm": l_norm},
        "loss_rel_diff": abs(p_loss - l_loss) / max(abs(l_loss), 1e-12),
        "grad_norm_rel_diff": abs(p_norm - l_norm) / max(l_norm, 1e-12),
    }
    if args.trainer_metrics is not None:
        result["prime_rl_logged"] = logged_loss_and_grad_norm(args.trainer_metrics, args.step)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""PredictAlgorithm through prime-rl's own orchestrator code at the pin, on the CPU.

Run by tests/test_prime_rl_integration.py in an interpreter that has prime-rl's runtime dependencies (prime-rl's
own venv, or any with torch, msgspec, loguru, ...): build_algorithm from the patched registry and AlgoConfig union,
trace_to_samples on a real verifiers Trace (prime-rl's Rollout), finalize_rollout / finalize_group (advantage and
loss-routing stamping), the real zero-advantage filter, and the trainer's prepare_sample on every sample that
ships; then prime-rl's own compute_loss on those samples with the rendered [trainer.loss] beside the local
trainer's predict_loss (`loss_parity`), and prime-rl's TrainSource over the rendered taskset of each seed
(`task_order`). Prints one JSON object.

    python tests/prime_rl_real_flow.py <patched prime-rl source> <verifiers source at prime-rl's pin>
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

STUBBED = ("wandb",)  # imported by prime-rl's utils, never called on this path


def main(prl: str, vf_src: str) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[1]
    # Ours first: a verifiers checkout has its own top-level `tests` package, which must not shadow this repository's.
    sys.path[:0] = [str(repo / "src"), str(repo), vf_src, f"{prl}/src", f"{prl}/packages/prime-rl-configs/src"]
    for name in STUBBED:
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = mock.MagicMock(name=name)
    import verifiers.v1 as vf
    from prime_rl.configs.algorithm import AlgoConfig
    from prime_rl.orchestrator.algo import ALGORITHM_CLASSES, build_algorithm
    from prime_rl.orchestrator.filters import ZeroAdvantageFilter, apply_filters
    from prime_rl.orchestrator.trajectories import trace_to_samples
    from prime_rl.orchestrator.types import Rollout
    from prime_rl.trainer.batch import prepare_sample
    from pydantic import TypeAdapter
    from tokenizers import Tokenizer

    from predict.env.runner import default_tokenizer_dir
    from predict.train.prime_rl.algorithm import PredictAlgorithm
    from tests.prime_rl_fixtures import episode_result, trace_nodes

    tok = Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def rollout(reward: float) -> Any:
        result = episode_result()
        nodes = [
            vf.MessageNode(
                parent=n["parent"],
                message={"role": n["role"], "content": "x"},
                sampled=n["sampled"],
                token_ids=n["token_ids"],
                mask=n["mask"],
                logprobs=n["logprobs"],
            )
            for n in trace_nodes(result, enc, scaffold=enc("<|im_start|>assistant\n"))
        ]
        r = Rollout(
            task={"type": "mbpp", "data": {"id": "mbpp/7", "prompt": "p"}},
            agent={"config": {}},
            nodes=nodes,
            info={"agent_result": result},
            env_name="predict_mbpp",
            rewards={"tests_pass": {"score": reward}},
        )
        r.samples = trace_to_samples(r, env_name=r.env_name)
        return r

    out: dict[str, Any] = {"registered": ALGORITHM_CLASSES["predict"] is PredictAlgorithm}

    shipped: list[Any] = []  # the micro-batches prime-rl's trainer would get, in order

    async def flow(alpha: float, rewards: list[float]) -> list[dict[str, Any]]:
        config = TypeAdapter(AlgoConfig).validate_python({"type": "predict", "alpha": alpha, "tokenizer": "t"})
        algo = build_algorithm(config, policy_pool=None)
        algo.tokenizer = tok  # setup() would load it with transformers from config.tokenizer
        group = [rollout(x) for x in rewards]
        for r in group:
            await algo.finalize_rollout(r)
        await algo.finalize_group(group)
        apply_filters([ZeroAdvantageFilter(name="zero_advantage", enforce=True)], group)
        rows = []
        for r in group:
            for s in r.samples:
                s.temperatures = [1.0] * len(s.token_ids)  # what the train sink does next
                shipped.append(prepare_sample(s, seq_len=1 << 20))  # the trainer accepts every sample
            rl = [s for s in r.samples if any(s.mask)]
            rows.append(
                {
                    "filtered": r.is_filtered,
                    "n_rl": len(rl),
                    "n_ce": len(r.samples) - len(rl),
                    "rl_zeroed": sum(m and w == 0 for s in rl for m, w in zip(s.mask, s.rl_weights, strict=True)),
                    "advantages": sorted(set(r.advantages)) if r.advantages is not None else None,
                }
            )
        return rows

    out["mixed"] = asyncio.run(flow(0.5, [1.0, 0.0]))
    out["loss_parity"] = loss_parity(list(shipped))
    out["task_order"] = {"42": task_order(42), "43": task_order(43), "42 again": task_order(42)}
    out["equal"] = asyncio.run(flow(0.5, [1.0, 1.0]))
    out["alpha0_equal"] = asyncio.run(flow(0.0, [1.0, 1.0]))
    return out


def task_order(seed: int, n_tasks: int = 12, pulls: int = 30) -> list[int]:
    """The task ids prime-rl's own TrainSource dispatches (2.5 epochs) from the rendered taskset of `seed`."""
    from types import SimpleNamespace

    from prime_rl.orchestrator.train_source import TrainSource

    from predict.config import REPO_ROOT, load_config
    from predict.env.taskset import MbppTaskset, MbppTasksetConfig
    from predict.train.prime_rl.configs import rl_config

    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    table = rl_config(cfg, "A", seed, model="/m", tasks="/rl.parquet", output_dir="/o")
    taskset = table["orchestrator"]["train"]["source"][0]["env"]["taskset"]
    rows = [{"task_id": 100 + i, "text": f"t{i}", "test_list": [f"assert f({i})"]} for i in range(n_tasks)]
    tasks = list(MbppTaskset.from_rows(rows, MbppTasksetConfig.model_validate({**taskset, "path": None})).load())
    env = SimpleNamespace(
        name="predict_mbpp",
        tasks=tasks,
        num_tasks=len(tasks),
        requires_group_scoring=False,
        config=SimpleNamespace(group_size=8, ratio=1),
    )
    source = TrainSource([env])
    return [source.next_example(available_permits=1)["task"].data.task_id for _ in range(pulls)]


def loss_parity(batches: list[Any]) -> dict[str, Any]:
    """The same shipped samples through prime-rl's own compute_loss (with the rendered ``[trainer.loss]``) and the
    local trainer's predict_loss: loss and gradient (w.r.t. the trainer's logprobs) for the paper design, a
    variant with the KL term on, and prime-rl's default loss (which must differ: the check can fail)."""
    import torch
    from prime_rl.configs.trainer import LossConfig
    from prime_rl.trainer.rl.loss import compute_loss, setup_rl_loss_fn
    from pydantic import TypeAdapter

    from predict.config import REPO_ROOT, load_config
    from predict.train.loss import LossConfig as OurLossConfig
    from predict.train.loss import predict_loss
    from predict.train.prime_rl.configs import loss_table, rl_settings

    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    design = rl_settings(cfg)
    gen = torch.Generator().manual_seed(0)
    streams = []
    for mb in batches:
        n = len(mb.input_ids)
        q = torch.tensor(mb.inference_logprobs, dtype=torch.float64)
        # the trainer's logprobs: off the sampling ones by up to +-0.5 nats, so clipping happens
        new = (q + (torch.rand(n, generator=gen, dtype=torch.float64) - 0.5)).clamp(max=-1e-3)
        streams.append(
            {
                "new": new,
                "q": q,
                "adv": torch.tensor(mb.advantages, dtype=torch.float64),
                "mask": torch.tensor(mb.loss_mask, dtype=torch.bool),
                "rl": torch.tensor(mb.rl_weights if mb.rl_weights is not None else mb.loss_mask, dtype=torch.float64),
                "ce": torch.tensor(mb.ce_weights if mb.ce_weights is not None else [0.0] * n, dtype=torch.float64),
            }
        )
    n_rl = int(sum(((s["mask"]) & (s["rl"] != 0)).sum() for s in streams))
    n_ce = int(sum((s["ce"] != 0).sum() for s in streams))

    def prime(table: dict[str, Any]) -> tuple[float, Any]:
        fn = setup_rl_loss_fn(TypeAdapter(LossConfig).validate_python(table))
        new = [s["new"].clone().requires_grad_(True) for s in streams]
        loss, _ = compute_loss(
            trainer_logprobs=new,
            inference_logprobs=[s["q"] for s in streams],
            ref_logprobs=None,
            advantages=[s["adv"] for s in streams],
            loss_mask=[s["mask"] for s in streams],
            rl_weights=[s["rl"] for s in streams],
            ce_weights=[s["ce"] for s in streams],
            ref_kl_weights=None,
            rl_loss_fn=fn,
            rl_scale=n_rl,
            ce_scale=n_ce,
            ref_kl_scale=1,
        )
        loss.backward()
        return float(loss), torch.cat([x.grad for x in new])

    def ours(eps_low: float, eps_high: float, kl_coef: float) -> tuple[float, Any]:
        width = max(len(s["new"]) for s in streams)

        def pad(key: str, value: float = 0.0) -> Any:
            rows = [
                torch.nn.functional.pad(s[key].to(torch.float64), (0, width - len(s[key])), value=value)
                for s in streams
            ]
            return torch.stack(rows)

        # the local trainer's batch: rl weight only where the token was sampled (prime-rl's mask & rl weight)
        rl = torch.stack([torch.nn.functional.pad(s["rl"] * s["mask"], (0, width - len(s["rl"]))) for s in streams])
        new = pad("new", -1.0).requires_grad_(True)
        batch = {"logprobs": pad("q", -1.0), "advantages": pad("adv"), "rl_weights": rl, "ce_weights": pad("ce")}
        loss, _ = predict_loss(new, batch, OurLossConfig(eps_low, eps_high, kl_coef))
        loss.backward()
        grad = torch.cat([new.grad[i, : len(s["new"])] for i, s in enumerate(streams)])
        return float(loss), grad

    result: dict[str, Any] = {"n_rl": n_rl, "n_ce": n_ce, "samples": len(streams)}
    for name, kl in (("paper", design.kl_coef), ("kl", 0.05)):
        table = loss_table(design.__class__(**{**design.__dict__, "kl_coef": kl}))
        p_loss, p_grad = prime(table)
        o_loss, o_grad = ours(design.eps_low, design.eps_high, kl)
        result[name] = {
            "prime_rl_loss": p_loss,
            "local_loss": o_loss,
            "loss_diff": abs(p_loss - o_loss),
            "grad_max_diff": float((p_grad - o_grad).abs().max()),
            "grad_norm": float(o_grad.norm()),
        }
    d_loss, d_grad = prime({"type": "default"})
    o_loss, o_grad = ours(design.eps_low, design.eps_high, design.kl_coef)
    result["prime_rl_default"] = {
        "loss_diff": abs(d_loss - o_loss),
        "grad_max_diff": float((d_grad - o_grad).abs().max()),
    }
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))

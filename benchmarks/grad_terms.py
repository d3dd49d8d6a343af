"""What measuring the RL and CE terms' gradients costs a training step (`predict.train.grad_terms`), side by side.

    PYTHONPATH=src python benchmarks/grad_terms.py [--repeat 7] [--old-ref 9882a9f] [--out benchmarks/grad_terms_cpu.json]

The study's tiny Qwen3 (hidden 64, 2 layers, the real 151,936-token vocabulary) on the CPU, float32, one torch
thread (what a local `predict rl` job gets), ``micro_batch_tokens`` 4096 as in config/local.yaml. One Arm B-shaped
step: ``rollouts`` RL samples (``--seq`` tokens, the last ``--sampled`` of them with rl weight and a non-zero
advantage) each followed by ``--ce-per-rollout`` CE-only samples (a ``--ce-prefix``-token prefix, then 4 label
tokens with ce weight alpha 1), interleaved as `build_samples` returns them. Shapes: ``local`` (2 rollouts:
config/local.yaml's group 2 x 1 task) and ``signal`` (16 rollouts: the learning-signal run's 2 tasks x 8).

Side by side, interleaved round by round, CPU time per `Trainer.step` (process time: a shared machine's load skews
it less; wall time is recorded too), median over ``--repeat`` rounds after a warm-up:

* ``off``: `Trainer.step` with ``grad_terms=False`` (the step every run takes when ``rl.grad_terms_every`` skips it);
* ``on``: the same step measured (``grad_terms=True``): one copy of the gradient after the rl micro-batches, three
  reductions after the ce ones;
* ``probe``: the CPU time inside the probe's two calls of each measured step (`TermProbe.at_boundary`: the copy;
  `TermProbe.measure`: the reductions), read by a clock around them: on a shared machine the difference of two
  step medians is noise of several percent, this is the cost itself;
* ``old`` (with ``--old-ref``): the trainer of that commit (`git show REF:src/predict/train/trainer.py`), which
  packs rl and ce samples into shared micro-batches; the price of packing them apart, which every mixed step now pays.

Rules: ratios, never a timed assertion; the JSON (``--out``) keeps the shape, the times and the norms the measured
step saw.

Seen on the shared 2-core CPU box (2026-12-02, torch 2.13 CPU, 9 rounds; ``benchmarks/grad_terms_cpu.json``): inside
the probe 0.039 s a step, 3.0 % of the ``local`` step (1.28 s, 6.4k tokens, 2 micro-batches) and 0.042 s, 0.42 % of
the ``signal`` step (9.84 s, 51k tokens, 14 micro-batches): the copy and reductions scale with the weights (19.5M),
not the tokens. The medians of whole steps, measured / unmeasured x1.06 and x1.09, and unmeasured / old x0.91 and
x0.94, are the box's noise (other jobs on both cores; wall time ran 2-4x CPU time), not the probe.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SHAPES = {"local": 2, "signal": 16}
"""Rollouts per step of each shape."""


def step_samples(rollouts: int, seq: int, sampled: int, ce_per_rollout: int, ce_prefix: int) -> list[Any]:
    import torch

    from predict.train.sample import TrainSample

    gen = torch.Generator().manual_seed(0)
    out: list[Any] = []
    for r in range(rollouts):
        ids = torch.randint(0, 151000, (seq,), generator=gen).tolist()
        w = [0.0] * (seq - sampled) + [1.0] * sampled
        adv = 1.0 if r % 2 else -1.0
        out.append(TrainSample(token_ids=ids, mask=[x > 0 for x in w], logprobs=[0.0] * seq,
                               advantages=[adv * x for x in w], rl_weights=w, ce_weights=[0.0] * seq, kind="rl"))
        for c in range(ce_per_rollout):
            n = ce_prefix + 4
            ce_ids = ids[: ce_prefix - 10 * c] + torch.randint(0, 151000, (n - ce_prefix + 10 * c,), generator=gen).tolist()
            out.append(TrainSample.ce_only(ce_ids, [0.0] * (len(ce_ids) - 4) + [1.0] * 4, "ce"))
    return out


def old_trainer_class(ref: str) -> Any:
    """`Trainer` as commit `ref` had it (its module loaded under its own name beside today's)."""
    source = subprocess.run(["git", "show", f"{ref}:src/predict/train/trainer.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "trainer_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("predict_trainer_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Trainer


def timed(fn: Any) -> tuple[float, float, Any]:
    t, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - t, time.perf_counter() - w, out


PROBE_CPU_S: list[float] = []
"""CPU seconds spent inside `TermProbe.at_boundary` and `TermProbe.measure`, call by call (`time_the_probe`)."""


def time_the_probe() -> None:
    """Wrap the probe's two calls with a clock: the cost of measuring, read directly, not as the difference of two
    noisy step times."""
    from predict.train.grad_terms import TermProbe

    for method in ("at_boundary", "measure"):
        inner = getattr(TermProbe, method)

        def timed_method(self: Any, inner: Any = inner) -> None:
            t = time.process_time()
            inner(self)
            PROBE_CPU_S.append(time.process_time() - t)

        setattr(TermProbe, method, timed_method)


def bench_shape(name: str, args: argparse.Namespace, model_dir: Path, old_cls: Any) -> dict[str, Any]:
    from predict.train.trainer import Trainer

    samples = step_samples(SHAPES[name], args.seq, args.sampled, args.ce_per_rollout, args.ce_prefix)
    kwargs = {"lr": 1e-6, "weight_decay": 0.0, "grad_clip": 1.0, "device": "cpu", "dtype": "float32",
              "micro_batch_tokens": 4096, "seed": 0}
    trainers = {"off": Trainer(model_dir, **kwargs), "on": Trainer(model_dir, **kwargs)}
    # sampling logprobs near the policy's (ratios on both sides of 1, few clipped), as a step of real rollouts has
    for s, lp in zip(samples, trainers["off"].token_logprobs(samples, weighted_only=True), strict=True):
        if s.kind == "rl":
            s.logprobs = [x + 0.1 * math.sin(i) if w else 0.0 for i, (x, w) in enumerate(zip(lp, s.rl_weights, strict=True))]
    if old_cls is not None:
        trainers["old"] = old_cls(model_dir, **kwargs)
    run = {"off": lambda t: t.step(samples, grad_terms=False), "on": lambda t: t.step(samples, grad_terms=True),
           "old": lambda t: t.step(samples)}
    cpu: dict[str, list[float]] = {k: [] for k in trainers}
    wall: dict[str, list[float]] = {k: [] for k in trainers}
    seen: dict[str, Any] = {}
    probe: list[float] = []
    for round_ in range(args.repeat + 1):  # round 0: warm-up
        for key, trainer in trainers.items():
            PROBE_CPU_S.clear()
            c, w, m = timed(lambda trainer=trainer, key=key: run[key](trainer))
            if round_:
                cpu[key].append(c)
                wall[key].append(w)
                if key == "on":
                    probe.append(sum(PROBE_CPU_S))
            if key == "on":
                seen = {k: m.get(k) for k in ("grad_norm", "rl_grad_norm", "ce_grad_norm", "rl_ce_grad_cosine",
                                              "n_micro_batches")}
            elif key in ("off", "old"):
                seen[f"n_micro_batches_{key}"] = m["n_micro_batches"]
    med = {k: statistics.median(v) for k, v in cpu.items()}
    out = {"shape": name, "rollouts": SHAPES[name], "n_samples": len(samples),
           "n_tokens": sum(len(s.token_ids) for s in samples), "step_cpu_s": med,
           "step_wall_s": {k: statistics.median(v) for k, v in wall.items()},
           "measured_over_unmeasured": med["on"] / med["off"], "probe_cpu_s": statistics.median(probe),
           "probe_share_of_unmeasured_step": statistics.median(probe) / med["off"], "norms_seen": seen}
    if "old" in med:
        out["unmeasured_over_old"] = med["off"] / med["old"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--seq", type=int, default=1200, help="tokens of one rollout's RL sample")
    p.add_argument("--sampled", type=int, default=150, help="of them sampled (rl weight 1)")
    p.add_argument("--ce-per-rollout", type=int, default=2)
    p.add_argument("--ce-prefix", type=int, default=1000, help="tokens of a CE sample before its label")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--old-ref", help="also time the trainer of this commit (packing rl and ce samples together)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import torch
    from predict.serve import default_cache_dir

    from predict.tiny_model import cached_tiny_qwen3

    torch.set_num_threads(1)
    time_the_probe()
    model_dir = Path(cached_tiny_qwen3(default_cache_dir() / "models", seed=0))
    old_cls = old_trainer_class(args.old_ref) if args.old_ref else None
    results = []
    for name in args.shapes:
        r = bench_shape(name, args, model_dir, old_cls)
        results.append(r)
        t = r["step_cpu_s"]
        line = (f"{name}: {r['n_tokens']} tokens, {r['n_samples']} samples; step {t['off']:.3f} s unmeasured, "
                f"{t['on']:.3f} s measured: x{r['measured_over_unmeasured']:.3f}; inside the probe "
                f"{r['probe_cpu_s']:.4f} s = {100 * r['probe_share_of_unmeasured_step']:.2f}% of a step")
        if "old" in t:
            line += f"; old trainer {t['old']:.3f} s (unmeasured / old x{r['unmeasured_over_old']:.3f})"
        print(line + f"; norms {r['norms_seen']}")
    if args.out:
        meta = {"what": "Trainer.step CPU time with and without the RL/CE gradient-term probe (predict.train.grad_terms)",
                "model": "tiny Qwen3 (hidden 64, 2 layers, vocab 151936), float32, 1 torch thread, CPU",
                "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                "repeat": args.repeat, "old_ref": args.old_ref,
                "shape_args": {k: getattr(args, k) for k in ("seq", "sampled", "ce_per_rollout", "ce_prefix")},
                "date": time.strftime("%Y-%m-%d"), "results": results}
        args.out.write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()

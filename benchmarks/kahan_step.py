"""The optimizer step alone at the Qwen3-4B shape, on one GPU: `KahanAdamW` (bf16 and float32 moments) beside torch's
fused AdamW on bf16 weights (the liger loop's optimizer, which loses small updates).

    python benchmarks/kahan_step.py [--optim-file OLD.py ...] [--out f.json]

Per optimizer, on the 398 tensors of Qwen3-4B (4.02B weights, bf16, random gradients), the median of 8 steps after 3:

* ``launch_s``: the step's time on the CPU (the Python loop and one kernel launch per parameter), the GPU idle;
* ``gpu_s``: the kernels' time on the GPU, timed with CUDA events behind a 0.3 s sleep kernel so that launching never
  starves it;
* ``step_s``: the step from an idle GPU to its end (the larger of the two, when nothing else is queued);
* ``peak_gib``: weights, gradients and the optimizer's state.

In a training step the launches overlap the end of the backward (the trainer reads the gradient norm after queuing
the optimizer), so ``gpu_s`` is what a step pays while the CPU is ahead. ``--optim-file`` adds another version of
`predict/train/optim.py` (e.g. ``git show REV:src/predict/train/optim.py > old.py``) beside the current one.
``bits_equal``: the compiled int32 rounding hash against the int64 formula, at weight indices around 2^31 and 2^32.
Results: ``kahan_step_h200.json``, docs/training.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
H, INTER, VOCAB, LAYERS = 2560, 9728, 151936, 36  # Qwen3-4B, tied embeddings
LAYER = [(4096, H), (1024, H), (1024, H), (H, 4096), (INTER, H), (INTER, H), (H, INTER), (H,), (H,), (128,), (128,)]
SHAPES = [(VOCAB, H)] + LAYER * LAYERS + [(H,)]


def load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def bench(torch: Any, make: Any, steps: int = 8, warmup: int = 3) -> dict[str, float]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    params = [torch.randn(s, device="cuda", dtype=torch.bfloat16).mul_(0.02) for s in SHAPES]
    for p in params:
        p.grad = torch.randn_like(p).mul_(1e-3)
    opt = make(params)
    t0 = time.perf_counter()
    opt.step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        opt.step()
    launch, total, gpu = [], [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        launch.append(t1 - t0)
        total.append(time.perf_counter() - t0)
        torch.cuda._sleep(600_000_000)  # ~0.3 s of GPU work queued first: the launches below never starve it
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        opt.step()
        b.record()
        torch.cuda.synchronize()
        gpu.append(a.elapsed_time(b) / 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**30
    del opt, params
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    def median(x: list[float]) -> float:
        return sorted(x)[len(x) // 2]

    return {"first_step_s": first, "launch_s": median(launch), "gpu_s": median(gpu), "step_s": median(total),
            "peak_gib": peak}


def bits_equal(torch: Any, optim: Any) -> bool:
    """The compiled int32 hash gives the unsigned 32-bit hash's bits (computed in int64) past the int32 wrap points."""
    like = torch.empty(1 << 20, device="cuda")
    seed = torch.tensor(float(optim.rounding_seed(7, 1)), device="cuda")
    hashed = torch.compile(optim._random_bits, dynamic=True, fullgraph=True)
    for start in (0, 2**31 - 500_000, 2**32 - 300_000, 3 * 2**31 + 17):
        x = (torch.arange(like.numel(), device="cuda", dtype=torch.int64) + start) & 0xFFFFFFFF ^ int(seed)
        x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
        x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
        ref = ((x >> 16) ^ x) & 0xFFFF
        if not torch.equal(hashed(like, optim.first_index_tensor(start, "cuda"), seed).long(), ref):
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--optim-file", type=Path, action="append", default=[], help="another optim.py to time beside")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    sys.path.insert(0, str(REPO / "src"))
    optim = load("optim_current", REPO / "src" / "predict" / "train" / "optim.py")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(), "weights": sum(
                                  torch.Size(s).numel() for s in SHAPES), "tensors": len(SHAPES),
                              "bits_equal": bits_equal(torch, optim), "optimizers": {}}
    runs: dict[str, Any] = {
        "torch fused AdamW (bf16 moments, updates lost)": lambda ps: torch.optim.AdamW(
            ps, lr=1e-6, weight_decay=0.0, fused=True
        ),
        "KahanAdamW bf16 moments": lambda ps: optim.KahanAdamW(ps, lr=1e-6, weight_decay=0.0),
        "KahanAdamW float32 moments": lambda ps: optim.KahanAdamW(ps, lr=1e-6, weight_decay=0.0, moments="float32"),
    }
    for i, path in enumerate(args.optim_file):
        other = load(f"optim_other_{i}", path)
        runs[f"{path.name}: KahanAdamW (its default moments)"] = lambda ps, m=other: m.KahanAdamW(
            ps, lr=1e-6, weight_decay=0.0
        )
    for name, make in runs.items():
        result["optimizers"][name] = row = bench(torch, make)
        print(f"{name:<52} launch {row['launch_s'] * 1e3:6.1f} ms  GPU {row['gpu_s'] * 1e3:6.1f} ms  "
              f"step {row['step_s'] * 1e3:6.1f} ms  peak {row['peak_gib']:5.1f} GiB", flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

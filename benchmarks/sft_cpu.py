"""The local SFT's CPU hot spots, side by side: each path against the one it replaced, on the same tensors.

Rules: a ratio, never a timed assertion; one torch thread (what `predict sft --threads 1` gives each arm's job on
the embedded default's 2 cores); CPU time per call (process time), so a shared machine's load skews it less.

* ``lm_head``: `ChunkedLMLoss` forward + backward of one SFT step's weighted positions (860 tokens, the tiny model's
  hidden 64, the real Qwen3 vocabulary of 151,936), the eager path (whole-chunk logits, `_lse_target`,
  `_grad_logits_inplace`) against the vocabulary tiles of `_TiledLogits`; the gradients' largest relative
  difference is printed beside the times.
* ``adamw``: one AdamW step over the tiny model's 19.5M float32 weights, torch's foreach against fused.

    PYTHONPATH=src python benchmarks/sft_cpu.py [--tokens 860] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from predict.train import trainer
from predict.train.loss import LossConfig

VOCAB, HIDDEN = 151936, 64


def cpu_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: first-touch allocations and the reused scratch buffer
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - start) / repeat


def lm_head(tokens: int, repeat: int) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, HIDDEN, generator=gen)
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.3).requires_grad_()
    targets = torch.randint(0, VOCAB, (tokens,), generator=gen)
    zeros = torch.zeros(tokens)
    streams = {"logprobs": zeros, "advantages": zeros, "rl_weights": zeros, "ce_weights": torch.ones(tokens)}

    def step(tiled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        original = trainer._tiled
        trainer._tiled = lambda t: tiled and original(t)
        try:
            h = hidden.clone().requires_grad_()
            loss = trainer.ChunkedLMLoss.apply(h, weight, targets, streams, LossConfig(), 0, tokens, 1024, {})
            return torch.autograd.grad(loss, (h, weight))
        finally:
            trainer._tiled = original

    eager, tiled = step(False), step(True)
    diff = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(tiled, eager, strict=True))
    t_eager, t_tiled = cpu_seconds(lambda: step(False), repeat), cpu_seconds(lambda: step(True), repeat)
    print(f"lm_head fwd+bwd, {tokens} tokens x {VOCAB} vocab: eager {t_eager:.3f} s, vocabulary tiles "
          f"{t_tiled:.3f} s: {t_eager / t_tiled:.2f}x (gradients differ by {diff:.1e} relative)")


def adamw(repeat: int) -> None:
    params = [torch.randn(VOCAB, HIDDEN, requires_grad=True) for _ in range(2)]
    for p in params:
        p.grad = torch.randn_like(p)
    times = {}
    for fused in (False, True):
        opt = torch.optim.AdamW(params, lr=1e-3, fused=fused)
        times[fused] = cpu_seconds(opt.step, repeat)
    print(f"AdamW step, {sum(p.numel() for p in params) / 1e6:.1f}M weights: foreach {times[False]:.3f} s, fused "
          f"{times[True]:.3f} s: {times[False] / times[True]:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=860, help="weighted positions of one step (arm B's mean: ~860)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    lm_head(args.tokens, args.repeat)
    adamw(args.repeat)


if __name__ == "__main__":
    main()

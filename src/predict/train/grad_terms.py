"""Gradient interference, measured: the gradient norm of the RL term, of the CE term, and their cosine, per step.

The writeup asserts that RL and CE "coexist cleanly"; these columns of the per-step metrics (`predict.train.
metrics`: ``rl_grad_norm``, ``ce_grad_norm``, ``rl_ce_grad_cosine``) measure it. Rules they follow:

* **What.** A step's loss is RL + CE (`predict.train.loss`): RL = the rl tokens' part (clipped surrogate, plus the
  KL when ``kl_coef`` is on) / N_rl, CE = the alpha-weighted NLL of the ce tokens / N_ce. ``g_rl`` = grad RL and
  ``g_ce`` = grad CE over every trainable parameter (one network: every parameter is shared by both terms), before
  clipping, on the step's own whole batch, so ``g_rl + g_ce`` is the gradient whose norm is ``grad_norm``.
* **How, at no extra backward pass.** No sample carries both an rl and a ce weight (rl samples have ce weight 0,
  Arm B's CE samples rl weight 0: `predict.train.from_rollouts`) and the documents of a packed row never attend to each
  other, so a micro-batch of rl samples adds only to ``g_rl`` and one of ce samples only to ``g_ce``. On a step with
  both, the trainer packs its rl samples first and its ce samples after them, never in one micro-batch
  (`term_groups`); this order holds whether the step is measured or not, so measuring never changes the update.
  `TermProbe` copies the accumulated gradient once the rl micro-batches are done (``g_rl``, exact) and after the ce
  ones takes ``g_ce = g - g_rl``: exact up to the rounding of accumulating onto ``g_rl`` in the gradient's dtype
  (float32 on the CPU: ~1e-7 relative; bfloat16 on a GPU: ~3 significant digits of the larger term), far below what
  a norm ratio or a cosine is read for. Cost: one copy of the gradient into buffers kept from the first measured
  step on (memory: one more gradient, 2 bytes a weight in bfloat16, ~8 GB at 4B), one subtraction and three or four
  dot products a parameter; ``benchmarks/grad_terms.py`` measures it against an unmeasured step.
* **One term only** (Arm A, alpha 0, a step whose rl samples were all skipped): the other term's norm is 0 and the
  one present is ``grad_norm``; the cosine is null (undefined for a zero vector), as it is whenever a norm is 0.
* **The update is untouched.** The probe reads gradients and never writes them, and draws no random numbers: the
  weights, AdamW moments and bf16 compensation after a step are bit-identical with and without it
  (tests/test_grad_terms.py).
* **Schedule**: ``rl.grad_terms_every`` = k measures steps k, 2k, ...; 0 never. Its one default is in
  predict.config.models.RLSettings (`probe_every` reads it there). An unmeasured step, or one with a sample carrying both weights
  (none is built today), leaves the three columns null.
* **Paper backend.** prime-rl does not measure them: its custom-loss hook (``[trainer.loss] type = "custom"``,
  `predict.train.prime_rl.loss`) is a function of one sample's rl logprobs returning that sample's rl loss sum; it
  never sees the CE term (prime-rl's fixed ``ce_loss_fn``), the parameters or their gradients, and the one backward
  of the summed loss, FSDP's reduce-scatter and the clipping happen after it in ``trainer/rl/train.py``. Splitting the
  gradient by term needs a change to that loop, not the hook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from predict.train.step_metrics import GRAD_TERM_COLUMNS

__all__ = ["GRAD_TERM_COLUMNS", "TermProbe", "probe_step", "term_groups"]

def probe_step(every: int, step: int) -> bool:
    """Whether step `step` (1-based) is measured: every `every`-th step (``rl.grad_terms_every``); never at 0, and
    never with `every` 0."""
    return every > 0 and step % every == 0


def _term(sample: Any) -> str:
    rl, ce = sample.n_rl_tokens > 0, sample.n_ce_tokens > 0
    return "both" if rl and ce else "rl" if rl else "ce" if ce else "none"


def term_groups(samples: Sequence[Any]) -> list[list[int]]:
    """Sample indices in packing order: ``[rl-bearing, ce-only]`` (each in the given order) when the step has both
    kinds, else ``[all]``, so a step with one kind (SFT, Arm A, alpha 0) packs exactly as it always did."""
    ce_only = [i for i, s in enumerate(samples) if _term(s) == "ce"]
    rest = [i for i, s in enumerate(samples) if _term(s) != "ce"]
    if ce_only and any(_term(samples[i]) in ("rl", "both") for i in rest):
        return [rest, ce_only]
    return [list(range(len(samples)))]


class TermProbe:
    """The per-term gradient norms of a trainer's steps (see the module docstring); one per `Trainer`.

    Per step: ``begin`` with the step's samples and packing groups, ``at_boundary`` once the first group's
    micro-batches are done (with two groups), ``measure`` after the last backward and before clipping (which scales
    the gradient in place), ``columns`` with the step's pre-clip ``grad_norm``. The copy of the RL gradient goes
    into buffers allocated once: a fresh gradient-sized allocation every step cost more than the copy itself
    (CPU page faults; 75 ms against 13 ms for 9.7M float32 weights)."""

    def __init__(self, params: Sequence[Any]) -> None:
        self.params = list(params)
        self.buffers: list[Any] | None = None
        self.begin([], [[]])

    def begin(self, samples: Sequence[Any], groups: Sequence[Sequence[int]]) -> None:
        terms = {_term(s) for s in samples} - {"none"}
        self.separable = "both" not in terms
        self.only = next(iter(terms)) if len(terms) == 1 else None  # "rl" / "ce": one term, no copy needed
        self.two_groups = len(groups) == 2
        self.copied: list[bool] | None = None  # per parameter: its RL gradient is in its buffer
        self.result: dict[str, float | None] | None = None

    def at_boundary(self) -> None:
        if not (self.two_groups and self.separable):
            return
        import torch

        if self.buffers is None:
            self.buffers = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.copied = []
        for p, buf in zip(self.params, self.buffers, strict=True):
            if p.grad is not None:
                buf.copy_(p.grad)
            self.copied.append(p.grad is not None)

    def measure(self) -> None:
        """|g_rl|^2, |g_ce|^2 and <g_rl, g_ce> per parameter, in float32 without a temporary in float32 training:
        ``d = g_rl - g`` (= -g_ce) overwrites the copy. The dot product comes from whichever of ``<g_rl, g> -
        |g_rl|^2`` and ``-<g, d> - |d|^2`` cancels less (the smaller term's), so a cosine of a tiny term and a
        large one keeps float32's precision."""
        if self.copied is None:
            return
        import torch

        rl_sq, ce_sq, dot = 0.0, 0.0, 0.0
        for p, buf, copied in zip(self.params, self.buffers or [], self.copied, strict=True):
            if p.grad is None:
                continue
            g = p.grad.detach().reshape(-1).float()  # float32 grads: g itself, no copy
            if not copied:  # no rl micro-batch reached this parameter: all of it is the CE term's
                ce_sq += torch.dot(g, g)
                continue
            a = buf.reshape(-1).float()
            aa, ag = torch.dot(a, a), torch.dot(a, g)
            d = a.sub_(g)
            cc = torch.dot(d, d)
            rl_sq, ce_sq = rl_sq + aa, ce_sq + cc
            dot = dot + (ag - aa if aa <= cc else -torch.dot(g, d) - cc)
        self.copied = None
        rl_sq, ce_sq, dot = (float(x) for x in (rl_sq, ce_sq, dot))
        self.result = {"rl_grad_norm": math.sqrt(rl_sq), "ce_grad_norm": math.sqrt(ce_sq),
                       "rl_ce_grad_cosine": dot / math.sqrt(rl_sq * ce_sq) if rl_sq > 0 and ce_sq > 0 else None}

    def columns(self, grad_norm: float) -> dict[str, float | None]:
        if self.result is not None:
            return self.result
        if not self.separable:
            return dict.fromkeys(GRAD_TERM_COLUMNS)
        rl = grad_norm if self.only == "rl" else 0.0
        ce = grad_norm if self.only == "ce" else 0.0
        return {"rl_grad_norm": rl, "ce_grad_norm": ce, "rl_ce_grad_cosine": None}

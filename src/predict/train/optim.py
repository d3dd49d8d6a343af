"""`KahanAdamW`: AdamW for bfloat16 (or float16) weights whose small updates are kept, not rounded away.

Rules it follows:

* Why it exists: bfloat16 holds 8 significant bits. An AdamW update of about ``lr`` (1e-6 in the paper's RL) on a
  weight of 0.02 is far below half a unit in the last place (6e-5), so plain AdamW on bf16 weights (torch's, fused
  or not) rounds nearly every update away. Measured on one H200, Qwen3-4B shape: 1.9 % of a layer's weights moved.
* The fix is Kahan-compensated summation (as in optimi): every low-precision weight ``p`` carries a buffer ``c`` of
  its own dtype holding what rounding took from it; the next update adds it back first. ``p + c`` follows the
  float32 sum of all updates to about 16 significant bits, deterministically, for 2 bytes a weight (a float32
  master copy costs 4 and a second weight copy in the step). Nothing is lost; a weight's bf16 value moves once its
  accumulated update reaches half an ulp. `effective_weight` gives ``p + c``.
* The moments (exp_avg, exp_avg_sq) of a bf16 weight are bf16 too, rounded *stochastically* (``moments =
  "bfloat16"``, the default): up or down at random, up with the probability of the fraction of an ulp, so that a
  second moment with beta2 = 0.999, which moves by 0.1 % a step (a quarter of bf16's resolution), follows its float32
  course in expectation instead of sticking (rounded to nearest it would stick). Float32 moments (``moments =
  "float32"``) cost 4 more bytes a weight, 15 GiB at the 4B shape, which the SFT memory target (1.1x the plain bf16
  loop's) cannot afford. The weight itself stays Kahan-compensated, so what the moments' rounding adds is noise in
  the step size (`tests/test_train_bf16.py` measures it), not lost updates. The random bits are a hash of the
  weight's index among all the optimizer's weights and of the step: no generator state, so a resumed run rounds
  exactly as an unbroken one. Float16 weights keep float32 moments (bf16's range, fp16's precision: no use).
* The arithmetic is torch's AdamW (decoupled weight decay, bias corrections, eps added after the square root), in
  float32. On CUDA one fused kernel per parameter (torch.compile, dynamic shapes: a single compile serves every
  parameter; the hyperparameters travel as a device tensor, so an lr schedule never recompiles); elsewhere, or if
  compiling fails, the same function runs eagerly.
* A float32 parameter gets no buffer (``p + c`` would be ``p``): the trainer keeps torch's own AdamW for float32, so
  the CPU/float32 path stays bit-for-bit what it was.
* `state_dict` / `load_state_dict` carry the buffers and the moments exactly (torch's loader would cast
  every state tensor to the parameter's dtype), so a resumed run continues as if never stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Literal

import torch

__all__ = ["KahanAdamW", "effective_weight", "first_index_tensor", "rounding_seed"]

_log = logging.getLogger(__name__)


def _random_bits(like: torch.Tensor, offset: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """16 random bits (int32 in [0, 65536)) for each element of the flat tensor `like`: Thomas Mueller's 32-bit
    integer hash of the element's index among all the optimizer's weights (`offset`, an int32 tensor holding the
    parameter's first index modulo 2^32, plus its index in `like`) mixed with `seed` (a scalar tensor holding an
    integer below 2^24). Stateless: the same weight at the same step gets the same bits on any run, device or resume.

    In int32, not int64: a GPU multiplies 64-bit integers in several instructions, and the hash is most of the
    kernel's arithmetic. Additions and products wrap modulo 2^32 and the shifts are made logical by a mask, so the
    bits are those of the unsigned 32-bit hash (`tests/test_train_bf16.py` checks them against it in int64)."""
    x = (torch.arange(like.numel(), device=like.device, dtype=torch.int32) + offset) ^ seed.to(torch.int32)
    x = (((x >> 16) & 0xFFFF) ^ x) * 0x45D9F3B
    x = (((x >> 16) & 0xFFFF) ^ x) * 0x45D9F3B
    return (((x >> 16) & 0xFFFF) ^ x) & 0xFFFF


def first_index_tensor(start: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A parameter's first weight index as `_random_bits` takes it: modulo 2^32, in an int32 scalar tensor."""
    return torch.tensor((start + 2**31) % 2**32 - 2**31, dtype=torch.int32, device=device)


def _store(dst: torch.Tensor, value: torch.Tensor, offset: torch.Tensor, seed: torch.Tensor) -> None:
    """``dst.copy_(value)``; into bf16, rounded stochastically: the 16 bits bf16 drops from the float32 value get
    random bits added before they are cut, which carries into the kept bits with the probability of their fraction
    (sign and magnitude are separate in a float, so this holds for negative values too)."""
    if dst.dtype != torch.bfloat16:
        dst.copy_(value)
        return
    bits = (value.view(torch.int32) + _random_bits(value, offset, seed)) & -65536
    dst.copy_(bits.view(torch.float32))  # exact: the low 16 bits are zero


def _step_kahan(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    c: torch.Tensor,
    hyper: torch.Tensor,
    offset: torch.Tensor,
) -> None:
    """One AdamW update of a flattened low-precision parameter with its compensation buffer, in place.

    hyper (float32, p's device): lr, beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay, bias_correction1,
    sqrt(bias_correction2) (the differences come from float64 as in torch: 1 - float32(0.999) is 1.3e-5 off), and
    the step's two rounding seeds (`rounding_seed`) for bf16 moments. `offset`: where the parameter's weights start
    among all the optimizer's (the rounding's index), an int32 tensor (`_first_index`): passed as a Python int, the
    compiled kernel took 1.6x the GPU time at the 4B shape, even with float32 moments, which never hash
    (`benchmarks/kahan_step_h200.json`). The step uses the moments' float32 values; only what is stored is rounded.
    """
    lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd, bc1, bc2_sqrt, seed_m, seed_v = hyper.unbind(0)
    gf = g.float()
    mf = m.float().lerp(gf, one_minus_beta1)
    vf = v.float() * beta2 + gf * gf * one_minus_beta2
    pf = p.float()
    update = -lr * wd * pf - (lr / bc1) * mf / (vf.sqrt() / bc2_sqrt + eps)
    y = update + c.float()  # the update plus what earlier roundings took
    new_p = (pf + y).to(p.dtype)
    c.copy_(y - (new_p.float() - pf))  # what this rounding took (new_p - pf is exact: both are bf16 values)
    p.copy_(new_p)
    _store(m, mf, offset, seed_m)
    _store(v, vf, offset, seed_v)


class CompiledOrEager:
    """`fn` compiled once by torch.compile (with `options`) on CUDA; `eager` (default `fn`, the same arithmetic) on
    the CPU, and for good once compiling fails (any compiler error is logged, never raised)."""

    def __init__(self, fn: Any, what: str, *, eager: Any = None, **options: Any) -> None:
        self.fn, self.what, self.eager, self.options = fn, what, eager or fn, options
        self.compiled: Any = None
        self.failed = False

    def __call__(self, *args: torch.Tensor) -> Any:
        if not args[0].is_cuda or self.failed:
            return self.eager(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, **self.options)
        try:
            return self.compiled(*args)
        except Exception as e:
            _log.warning("torch.compile of %s failed (%s); using eager", self.what, e)
            self.failed = True
            return self.eager(*args)


# emulate_precision_casts: inductor otherwise keeps ``(pf + y).to(bf16).float()`` in float32 inside the fused kernel,
# and the compensation then records nothing (seen on CPU: c off by a whole update).
_KERNEL = CompiledOrEager(
    _step_kahan, "the Kahan AdamW step", dynamic=True, fullgraph=True, options={"emulate_precision_casts": True}
)


Moments = Literal["bfloat16", "float32"]


def rounding_seed(step: int, moment: int) -> int:
    """The stochastic rounding's seed of one moment (0: exp_avg, 1: exp_avg_sq) at `step`: a 24-bit mix (exact in
    the float32 tensor that carries it), the same on every run."""
    return ((step * 0x9E3779B1) ^ ((moment + 1) * 0xC2B2AE3D)) & 0xFFFFFF


class KahanAdamW(torch.optim.Optimizer):
    """AdamW whose low-precision parameters keep every update (see the module docstring). `moments`: the dtype of a
    bf16 parameter's moments ("bfloat16", stochastically rounded, or "float32"); other dtypes keep float32 ones."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        moments: Moments = "bfloat16",
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"KahanAdamW: bad hyperparameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        if moments not in ("bfloat16", "float32"):
            raise ValueError(f"KahanAdamW: moments must be 'bfloat16' or 'float32', not {moments!r}")
        self.moments = moments
        # (group, position) -> (first index, that index modulo 2^32 as an int32 tensor on the weight's device)
        self._first_indices: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def moment_dtype(self, p: torch.Tensor) -> torch.dtype:
        """The dtype `p`'s moments are kept in."""
        return torch.bfloat16 if p.dtype == torch.bfloat16 and self.moments == "bfloat16" else torch.float32

    def _first_index(self, key: tuple[int, int], p: torch.Tensor, start: int) -> torch.Tensor:
        """`first_index_tensor` of `start`, where `p`'s weights start among all the optimizer's, on p's device, made
        once (a copy to the GPU per parameter and step would cost more than the kernel)."""
        cached = self._first_indices.get(key)
        if cached is None or cached[0] != start:
            cached = (start, first_index_tensor(start, p.device))
            self._first_indices[key] = cached
        return cached[1]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        offset = 0  # where each parameter's weights start among all the optimizer's: the rounding's index
        for g, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            hyper: dict[tuple[torch.device, int], torch.Tensor] = {}  # one small tensor per device and step
            for i, p in enumerate(group["params"]):
                start, offset = offset, offset + p.numel()
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("KahanAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    dtype = self.moment_dtype(p)
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
                if p.dtype != torch.float32 and "compensation" not in state:
                    state["compensation"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = int(state["step"])
                key = (p.device, step)
                if key not in hyper:
                    values = [
                        group["lr"],
                        beta1,
                        1 - beta1,
                        beta2,
                        1 - beta2,
                        group["eps"],
                        group["weight_decay"],
                        1 - beta1**step,
                        (1 - beta2**step) ** 0.5,
                        rounding_seed(step, 0),
                        rounding_seed(step, 1),
                    ]
                    # from pinned memory, not blocking: a plain copy to the GPU waits for all queued work (the
                    # backward), which would leave the GPU idle while this loop launches its ~400 kernels
                    pinned = torch.tensor(values, dtype=torch.float32, pin_memory=p.is_cuda)
                    hyper[key] = pinned.to(p.device, non_blocking=True)
                comp = state.get("compensation")
                if comp is None:  # float32: plain AdamW (a scratch buffer, rounding takes nothing)
                    comp = torch.zeros_like(p)
                _KERNEL(
                    p.view(-1),
                    p.grad.reshape(-1),
                    state["exp_avg"].view(-1),
                    state["exp_avg_sq"].view(-1),
                    comp.view(-1),
                    hyper[key],
                    self._first_index((g, i), p, start),
                )
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loader, then the state tensors again as saved (its loader casts them to each parameter's dtype);
        moments saved in another dtype (a state of torch's AdamW, or of the other `moments`) are cast to this one's."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params, strict=True):
            for key, value in state_dict["state"].get(pid, {}).items():
                if isinstance(value, torch.Tensor) and key != "step":
                    dtype = self.moment_dtype(p) if key in ("exp_avg", "exp_avg_sq") else value.dtype
                    self.state[p][key] = value.to(device=p.device, dtype=dtype, copy=True)


def effective_weight(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    """The weight the optimizer holds, in float32: ``p + c`` under `KahanAdamW`, ``p`` otherwise."""
    comp = optimizer.state.get(p, {}).get("compensation") if isinstance(optimizer, KahanAdamW) else None
    return p.detach().float() + (comp.float() if comp is not None else 0.0)

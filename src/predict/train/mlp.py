"""The decoder's SwiGLU MLP with its down projection's input made again in the backward, not kept.

Rules it follows:

* What it saves: ``down_proj(silu(gate) * up)`` keeps three [tokens, intermediate] tensors for its backward when
  run as modules (gate and up for the activation's gradient, the product for down_proj's weight gradient). Here one
  autograd function holds gate and up only and multiplies them again in the backward: at the Qwen3-4B shape that is
  19 KB a token a layer, 5.3 GiB of an 8,192-token micro-batch's activations (about a sixth), for one elementwise
  pass over the MLP's width (about 1 % of a step).
* What it computes is what the modules compute: the same products in the same order (liger's SwiGLU kernels when
  liger is importable, torch's otherwise), so losses and gradients do not change (`tests/test_train_mlp.py`).
* Where: the trainer installs it on a GPU (`recompute_mlp_inputs`), beside liger's kernels; on the CPU the MLP stays
  as transformers wrote it (the embedded default is small; nothing there needs the memory).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["SwiGLUDown", "recompute_mlp_inputs"]


@functools.cache
def _liger_swiglu() -> tuple[Any, Any] | None:
    """liger's SwiGLU forward and backward kernels, looked up once; None where liger is not importable."""
    try:
        from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward
    except ImportError:
        return None
    return swiglu_forward, swiglu_backward


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    liger = _liger_swiglu() if gate.is_cuda else None
    return liger[0](gate, up)[2] if liger else F.silu(gate) * up


def _silu_mul_backward(
    gate: torch.Tensor, up: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    liger = _liger_swiglu() if gate.is_cuda else None
    if liger:  # writes the two gradients into gate's and up's buffers (theirs to use: the graph is done with them)
        return liger[1](gate, up, grad)
    with torch.enable_grad():  # torch's own derivative of silu(gate) * up
        gate, up = gate.detach().requires_grad_(), up.detach().requires_grad_()
        grad_gate, grad_up = torch.autograd.grad(F.silu(gate) * up, (gate, up), grad)
    return grad_gate, grad_up


class SwiGLUDown(torch.autograd.Function):
    """``F.linear(silu(gate) * up, weight)``, keeping gate and up (and the weight) for the backward."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up, weight)
        return F.linear(_silu_mul(gate, up), weight)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gate, up, weight = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        product = _silu_mul(gate, up)  # the input down_proj saw, made again
        width = product.shape[-1]
        grad_weight = grad_out.reshape(-1, grad_out.shape[-1]).t() @ product.reshape(-1, width)
        del product
        grad_product = grad_out @ weight
        grad_gate, grad_up = _silu_mul_backward(gate, up, grad_product)
        return grad_gate, grad_up, grad_weight


def _forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return SwiGLUDown.apply(self.gate_proj(x), self.up_proj(x), self.down_proj.weight)


def recompute_mlp_inputs(model: torch.nn.Module) -> int:
    """Give every SwiGLU MLP of `model` (a module with gate_proj, up_proj and a bias-free down_proj, activation silu)
    the forward above; returns how many it changed."""
    changed = 0
    for module in model.modules():
        projections = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(p, torch.nn.Linear) for p in projections) or projections[2].bias is not None:
            continue
        config = getattr(module, "config", None)
        if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
            continue
        module.forward = types.MethodType(_forward, module)
        changed += 1
    return changed

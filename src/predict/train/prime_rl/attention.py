"""FlashAttention-2 as built into PyTorch, behind the name prime-rl's trainer imports from the flash-attn wheel.

Used only where the study config says ``prime_rl.attn: flash_attention_2_torch``: `predict prime-rl-setup` then
applies ``workflow/prime-rl/torch-attention.patch`` (`configs.attention_patches`), which makes prime-rl's trainer
take `flash_attn_varlen_func` from here when the flash-attn wheel is absent, and imports ``ring_flash_attn`` (which
imports that wheel at module level) only where context parallelism uses it. The rendered TOMLs keep
``attn = "flash_attention_2"``: prime-rl's own FA2 code path, with PyTorch's copy of the FA2 kernels
(``torch.nn.attention.varlen.varlen_attn``: forward and backward, bf16/fp16, SM80+).

Why it exists: a machine that can install no flash-attn wheel (flash-attn's PyPI release is a source archive that
compiles for hours; flash-attn-3's wheels are on PyTorch's test index only; vLLM's bundled FA3 has no backward)
still runs prime-rl's trainer on the same code path. Measured choices and what was ruled out: docs/prime-rl.md.

Rules it follows:
* the contract of ``flash_attn.flash_attn_varlen_func`` as prime-rl calls it (``models/layers/attn.py`` at the pin):
  packed ``q`` ``[total_q, heads, dim]``, ``k``/``v`` ``[total_k, kv_heads, dim]``, cumulative lengths, maximum
  lengths, ``causal``, ``window_size=(left, right)`` (-1 = unbounded), ``softmax_scale``; returns ``[total_q, heads,
  dim]``;
* grouped-query attention as flash-attn does it: query head ``h`` reads key/value head ``h // (heads // kv_heads)``
  (the key/value heads are repeated before the kernel call);
* on a CUDA tensor PyTorch's kernel; elsewhere (the CPU tests) the same attention one sequence at a time through
  ``scaled_dot_product_attention`` with an explicit mask, so the plumbing is testable without a GPU and the GPU
  kernel can be checked against it on the machine (``benchmarks/prime_rl_gpu.py attention``).
"""

from __future__ import annotations

from typing import Any


def _window(causal: bool, window_size: tuple[int, int] | list[int] | None) -> tuple[int, int]:
    """flash-attn's (left, right) window with ``causal`` folded in: causal means right = 0."""
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    if causal:
        right = 0
    return left, right


def repeat_kv(k: Any, heads: int) -> Any:
    """``[tokens, kv_heads, dim]`` -> ``[tokens, heads, dim]``, each key/value head serving its group of query heads."""
    kv_heads = k.shape[1]
    if kv_heads == heads:
        return k
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
    return k.repeat_interleave(heads // kv_heads, dim=1)


def reference_varlen_attention(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, window: tuple[int, int], scale: float | None
) -> Any:
    """The same attention one sequence at a time (any device): scaled dot product with flash-attn's window mask
    (query i of a sequence attends key j when ``i + offset - left <= j <= i + offset + right``, offset = len_k -
    len_q: bottom-right aligned, as flash-attn does)."""
    import torch
    import torch.nn.functional as F

    left, right = window
    out = torch.empty_like(q)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    spans_q, spans_k = zip(starts_q[:-1], starts_q[1:], strict=True), zip(starts_k[:-1], starts_k[1:], strict=True)
    for (q0, q1), (k0, k1) in zip(spans_q, spans_k, strict=True):
        if q1 == q0:
            continue
        qi = torch.arange(q1 - q0, device=q.device)[:, None] + ((k1 - k0) - (q1 - q0))
        kj = torch.arange(k1 - k0, device=q.device)[None, :]
        allowed = torch.ones_like(qi - kj, dtype=torch.bool)
        if left >= 0:
            allowed &= kj >= qi - left
        if right >= 0:
            allowed &= kj <= qi + right
        attn = F.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1), attn_mask=allowed, scale=scale
        )
        out[q0:q1] = attn.transpose(0, 1)
    return out


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | list[int] | None = (-1, -1),
    **unsupported: Any,
) -> Any:
    """``flash_attn.flash_attn_varlen_func`` on PyTorch's built-in FA2 kernel (module doc)."""
    import torch

    if dropout_p:
        raise ValueError("flash_attention_2_torch: attention dropout is not supported (prime-rl trains without it)")
    used = {name: value for name, value in unsupported.items() if value not in (None, False, 0, 0.0)}
    if used:
        raise ValueError(f"flash_attention_2_torch: unsupported flash-attn arguments {sorted(used)}")
    window = _window(causal, window_size)
    heads = q.shape[1]
    k, v = repeat_kv(k, heads), repeat_kv(v, heads)
    if not q.is_cuda:
        return reference_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, window=window, scale=softmax_scale)
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(
        q,
        k,
        v,
        cu_seqlens_q.to(torch.int32),
        cu_seqlens_k.to(torch.int32),
        int(max_seqlen_q),
        int(max_seqlen_k),
        scale=softmax_scale,
        window_size=window,
    )

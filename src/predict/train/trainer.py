"""`Trainer`: the one compact trainer of SFT and the local RL trainer (plain torch + transformers, CPU or one GPU).

One optimizer step (`Trainer.step`) takes a list of `TrainSample`s and

* packs them, in order, into micro-batches of at most ``micro_batch_tokens`` tokens (one packed row each; a sample
  longer than that gets a micro-batch of its own). Documents in a row never attend to each other: positions restart
  at 0 for every sample and the attention (`packed_attention`, registered as ``predict_packed``) runs per document:
  flash-attention varlen on CUDA (``torch.nn.attention.varlen``), a causal SDPA call per document elsewhere. A step
  with both rl and ce-only samples packs its rl samples first and its ce samples after them, never in one
  micro-batch, so the gradient's RL and CE terms can be read apart (`predict.train.grad_terms`, ``grad_terms``);
* computes the loss `predict.train.loss.predict_loss` with N_rl / N_ce counted over the WHOLE step, so gradient
  accumulation over micro-batches equals one big batch;
* never materialises ``[T, vocab]`` logits for a sequence: the lm_head runs only on positions that carry a weight, in
  chunks of ``logit_chunk_tokens``; since the loss is a sum of per-token terms over known counts, each chunk's
  gradient (w.r.t. its hidden states and the lm_head weight) is computed in the forward pass and the chunk's logits
  are freed at once (`ChunkedLMLoss`, the fused-linear-loss idea of liger-kernel, here with our own loss);
* clips the gradient norm and takes one AdamW step: torch's (fused on CUDA) on float32 weights; on bfloat16/float16
  weights `predict.train.optim.KahanAdamW`, whose compensation buffer keeps the updates that rounding to 8
  significant bits would drop (plain AdamW on bf16 weights at lr 1e-6 moved 1.9 % of them on a 4B model); its
  moments are bf16, stochastically rounded.

On CUDA, liger-kernel's RMSNorm, SwiGLU and RoPE kernels are patched in when it is importable (``liger=None``:
auto), and each MLP keeps gate and up only for its backward (`predict.train.mlp`). A micro-batch with no rl weight
and one ce weight (SFT) is exactly a summed cross-entropy, so there liger's fused linear cross-entropy replaces
`ChunkedLMLoss`; everything else (GRPO ratios need per-token logprobs) goes through `ChunkedLMLoss`.

`token_logprobs` gives per-token logprobs without gradient (same chunking). `save_checkpoint` writes an HF folder
(weights in the base checkpoint's dtype + tokenizer files) that vLLM and transformers load; `save_state` /
`Trainer.resume` save and restore weights (training dtype, exact), AdamW state, step count and RNG states, so a
killed run continues from its last saved state. Both write to a temp folder and rename it into place.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predict.serving import weight_sync
from predict.train.grad_terms import TermProbe, term_groups
from predict.train.loss import LossConfig, predict_loss
from predict.train.mlp import recompute_mlp_inputs
from predict.train.optim import CompiledOrEager, KahanAdamW
from predict.train.sample import TrainSample
from predict.train.saves import HostCopies, Snapshot, atomic_dir, settle_dir

__all__ = ["ATTN_IMPLEMENTATION", "ChunkedLMLoss", "Trainer", "pack_micro_batches", "packed_attention"]

ATTN_IMPLEMENTATION = "predict_packed"
STATE_FILE = "trainer.json"
#: Tokenizer files copied into every checkpoint (whichever of them the source has).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------------------------------------------
# Packed attention: documents of one row never see each other.
# --------------------------------------------------------------------------------------------------------------
try:
    from torch.nn.attention.varlen import varlen_attn as _VARLEN
except ImportError:
    _VARLEN = None
_VARLEN_PARAMS = set(inspect.signature(_VARLEN).parameters) if _VARLEN is not None else set()


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each document of a packed row.

    query [B, H, T, D], key/value [B, Hkv, T, D]; ``cu_seqlens`` (int32 [n+1]) are the document boundaries in the
    flattened B*T tokens (without them the whole row is one document). Returns [B, T, H, D] as transformers expects.
    """
    b, h, t, d = query.shape
    hkv = key.shape[1]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, (b + 1) * t, t, dtype=torch.int32, device=query.device)
        max_seqlen = t
    n_docs = cu_seqlens.numel() - 1
    if max_seqlen is not None and n_docs * int(max_seqlen) == b * t:
        # Documents of one length (max_seqlen x count = all tokens): one batched causal SDPA call, the fastest
        # kernel for that shape (cuDNN / flash on CUDA).
        seq = int(max_seqlen)
        q, k, v = (x.transpose(1, 2).reshape(n_docs, seq, x.shape[1], d).transpose(1, 2) for x in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=hkv != h
        )
        return out.transpose(1, 2).reshape(b, t, h, d), None
    if query.is_cuda and _VARLEN is not None:
        q, k, v = (x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (query, key, value))
        extra: dict[str, Any] = {"scale": scaling}
        if hkv != h:
            if "enable_gqa" in _VARLEN_PARAMS:
                extra["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
        if "is_causal" in _VARLEN_PARAMS:
            extra["is_causal"] = True
        else:
            extra["window_size"] = (-1, 0)
        out = _VARLEN(q, k, v, cu_seqlens, cu_seqlens, int(max_seqlen), int(max_seqlen), **extra)
        return out.reshape(b, t, h, d), None
    # One causal SDPA call per document (CPU, or no varlen kernel), on 4-d [1, H, len, D] views: 3-d inputs fall
    # back to the math kernel on the CPU (a [len, len] mask built and reduced per call, 2.3x slower).
    q, k, v = (x.transpose(0, 1).reshape(1, x.shape[1], b * t, d) for x in (query, key, value))
    bounds = cu_seqlens.tolist()
    out = torch.cat(
        [
            torch.nn.functional.scaled_dot_product_attention(
                q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True, scale=scaling, enable_gqa=hkv != h
            )
            for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        ],
        dim=2,
    )
    return out[0].reshape(h, b, t, d).permute(1, 2, 0, 3), None


# --------------------------------------------------------------------------------------------------------------
# Chunked lm_head + loss: the gradient of each chunk is taken in the forward pass.
# --------------------------------------------------------------------------------------------------------------
_SUMMED = ("loss", "rl_loss", "ce_loss", "kl")


def _lse_target(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(x, dim=-1)
    return lse, x.gather(1, targets[:, None]).squeeze(1) - lse


def _grad_logits(logits: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """g * (onehot(targets) - softmax(logits)): the gradient of sum(g * logprob[target]) w.r.t. the logits."""
    x = torch.exp(logits.to(lse.dtype) - lse[:, None]) * (-g[:, None])
    return x.scatter_add(1, targets[:, None], g[:, None]).to(logits.dtype)


def _grad_logits_inplace(
    logits: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """`_grad_logits` reusing the logits buffer when it is already float32+ (the eager path)."""
    if logits.dtype != lse.dtype:
        return _grad_logits(logits, lse, g, targets)
    logits.sub_(lse[:, None]).exp_().mul_(-g[:, None])
    return logits.scatter_add_(1, targets[:, None], g[:, None])


# The elementwise part of the chunked loss, compiled into one pass over the logits on CUDA.
_LSE_TARGET = CompiledOrEager(_lse_target, "the chunked loss", dynamic=True)
_GRAD_LOGITS = CompiledOrEager(_grad_logits, "the chunked loss", eager=_grad_logits_inplace, dynamic=True)


def _chunk_logprobs(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    logits = h @ weight.T
    lse, lp = _LSE_TARGET(logits, targets)
    return logits, lse, lp


#: CPU: elements of one vocabulary tile of a chunk's logits (2 MiB of float32), small enough to stay in cache while
#: it is reduced, scaled and multiplied back.
_TILE_ELEMENTS = 1 << 19
_SCRATCH: dict[torch.dtype, torch.Tensor] = {}


def _tiled(t: torch.Tensor) -> bool:
    """The CPU path of the chunked loss: float32/float64 weights off CUDA (bf16 keeps the promoting eager path)."""
    return not t.is_cuda and t.dtype in (torch.float32, torch.float64)


def _scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """One reused buffer per dtype: a fresh [tokens, vocab] allocation costs its page faults on every chunk."""
    buf = _SCRATCH.get(dtype)
    if buf is None or buf.numel() < numel:
        _SCRATCH[dtype] = buf = torch.empty(numel, dtype=dtype)
    return buf[:numel]


class _TiledLogits:
    """One chunk's logits on the CPU, one vocabulary tile ``[rows, tokens]`` at a time, each tile in cache.

    Pass 1 (the constructor): a tile's logits, its max per token, ``exp(logit - max)`` in place and its sum, so
    lse needs no second read of the logits; ``lp`` = target logit - lse. Pass 2 (`backward`): each stored tile
    times ``-g * exp(max - lse)`` is ``-g * softmax``, multiplied back into the hidden and weight gradients; the
    one-hot part ``g`` is added at the targets. Three matmuls and one exp per logit, the same sums as the eager
    path (`_lse_target`, `_grad_logits`) up to float rounding. ``keep=False`` (logprobs only) reuses one tile.
    """

    def __init__(self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, keep: bool) -> None:
        n, vocab = h.shape[0], weight.shape[0]
        rows = max(1, _TILE_ELEMENTS // max(n, 1))
        self.starts = list(range(0, vocab, rows))
        self.rows, self.h, self.weight, self.targets = rows, h, weight, targets
        self.buf = _scratch(n * (vocab if keep else min(rows, vocab)), h.dtype)
        self.keep = keep
        tile_max = torch.empty(len(self.starts), n, dtype=h.dtype)
        tile_sum = torch.empty_like(tile_max)
        for j, a in enumerate(self.starts):
            x = self._tile(a)
            torch.mm(weight[a : a + x.shape[0]], h.T, out=x)
            torch.amax(x, 0, out=tile_max[j])
            torch.sum(x.sub_(tile_max[j]).exp_(), 0, out=tile_sum[j])
        self.tile_max = tile_max
        self.lse = torch.logsumexp(tile_max + tile_sum.log(), 0)
        self.lp = (h * weight[targets]).sum(1) - self.lse

    def _tile(self, a: int) -> torch.Tensor:
        n = self.h.shape[0]
        rows = min(self.rows, self.weight.shape[0] - a)
        at = n * a if self.keep else 0
        return self.buf[at : at + n * rows].view(rows, n)

    def backward(self, g: torch.Tensor, grad_h: torch.Tensor, grad_w: torch.Tensor | None) -> None:
        """grad_h = d sum(g * lp) / d h (overwritten); grad_w += d sum(g * lp) / d weight."""
        h, weight, targets = self.h, self.weight, self.targets
        scale = (self.tile_max - self.lse).exp_().mul_(-g)
        grad_h.copy_(g[:, None] * weight[targets])
        for j, a in enumerate(self.starts):
            x = self._tile(a).mul_(scale[j])
            w = weight[a : a + x.shape[0]]
            grad_h.addmm_(x.T, w)
            if grad_w is not None:
                grad_w[a : a + x.shape[0]].addmm_(x, h)
        if grad_w is not None:
            grad_w.index_add_(0, targets, g[:, None] * h)


class ChunkedLMLoss(torch.autograd.Function):
    """loss = predict_loss(log_softmax(hidden @ weight.T)[targets]) over selected positions, chunk by chunk.

    hidden [N, H] (only positions with a weight), weight [V, H], streams [N] (float). The metrics of the whole call
    are written into ``out_metrics``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        streams: dict[str, torch.Tensor],
        config: LossConfig,
        n_rl: int,
        n_ce: int,
        chunk: int,
        out_metrics: dict[str, float],
    ) -> torch.Tensor:
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        n_clipped = 0.0
        tiled = _tiled(weight)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            tgt = targets[s : s + chunk]
            if tiled:
                tiles = _TiledLogits(h, weight, tgt, keep=True)
                lp = tiles.lp
            else:
                logits, lse, lp = _chunk_logprobs(h, weight, tgt)
            lp = lp.detach().requires_grad_()
            with torch.enable_grad():
                part = {k: v[s : s + chunk][None] for k, v in streams.items()}
                loss, m = predict_loss(lp[None], part, config, n_rl=n_rl, n_ce=n_ce)
                (g,) = torch.autograd.grad(loss, lp)
            total += loss.detach()
            for k in _SUMMED:
                if k in m:
                    out_metrics[k] = out_metrics.get(k, 0.0) + m[k]
            n_clipped += m["clip_frac"] * max(m["n_rl_tokens"], 1)
            if tiled:
                tiles.backward(g.to(h.dtype), grad_h[s : s + chunk], grad_w)
                continue
            # d lp / d logits = onehot - softmax
            dl = _GRAD_LOGITS(logits, lse, g.to(lse.dtype), tgt).to(weight.dtype)
            del logits
            grad_h[s : s + chunk] = dl @ weight
            if grad_w is not None:
                grad_w.addmm_(dl.T, h)
        out_metrics["n_clipped"] = out_metrics.get("n_clipped", 0.0) + n_clipped
        ctx.save_for_backward(grad_h, grad_w)  # grad_w None: the weight needs no gradient
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        g = grad_out.to(grad_h.dtype)
        return grad_h * g, (grad_w * g if grad_w is not None else None), None, None, None, None, None, None, None


@torch.no_grad()
def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """log_softmax(hidden @ weight.T)[targets] in float32, chunk by chunk: [N]."""
    out = torch.empty(hidden.shape[0], dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
    for s in range(0, hidden.shape[0], chunk):
        h, tgt = hidden[s : s + chunk], targets[s : s + chunk]
        out[s : s + chunk] = (
            _TiledLogits(h, weight, tgt, keep=False).lp if _tiled(weight) else _chunk_logprobs(h, weight, tgt)[2]
        )
    return out


# --------------------------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------------------------
def pack_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Sample indices, in order, grouped into micro-batches of at most ``max_tokens`` tokens (a longer sample alone)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if cur and used + n > max_tokens:
            batches.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        batches.append(cur)
    return batches


@dataclass
class _Packed:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    cu_seqlens: torch.Tensor  # int32 [n+1]
    max_seqlen: int
    hidden_index: torch.Tensor  # [N] row positions whose hidden state predicts a selected token
    targets: torch.Tensor  # [N]
    streams: dict[str, torch.Tensor]  # [N] each
    sel_doc: np.ndarray  # [N] which sample of the row each selected token belongs to
    sel_pos: np.ndarray  # [N] its position in that sample
    uniform_ce: float | None = None  # the one ce weight of the selected positions when none has an rl weight (SFT)


_STREAM_COLS = ("logprobs", "advantages", "rl_weights", "ce_weights")


def _pack(samples: Sequence[TrainSample], device: torch.device, *, weighted_only: bool) -> _Packed:
    """One packed row, selecting every position >= 1, or only those with an rl or ce weight > 0."""
    lens = np.array([len(s.token_ids) for s in samples], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lens)])
    ids = np.concatenate([np.asarray(s.token_ids, dtype=np.int64) for s in samples])
    pos = np.arange(len(ids), dtype=np.int64) - np.repeat(cu[:-1], lens)
    cols = {k: np.concatenate([np.asarray(getattr(s, k), dtype=np.float32) for s in samples]) for k in _STREAM_COLS}
    chosen = pos > 0
    if weighted_only:
        chosen &= (cols["rl_weights"] > 0) | (cols["ce_weights"] > 0)
    at = np.flatnonzero(chosen)
    doc = np.repeat(np.arange(len(samples)), lens)[at]

    ce_sel, rl_sel = cols["ce_weights"][at], cols["rl_weights"][at]
    uniform = ce_sel.size and not rl_sel.any() and ce_sel.min() == ce_sel.max() > 0
    uniform_ce = float(ce_sel[0]) if uniform else None

    def put(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    return _Packed(
        input_ids=put(ids[None], torch.long),
        position_ids=put(pos[None], torch.long),
        cu_seqlens=put(cu, torch.int32),
        max_seqlen=int(lens.max(initial=0)),
        hidden_index=put(at - 1, torch.long),
        targets=put(ids[at], torch.long),
        streams={k: put(v[at], torch.float32) for k, v in cols.items()},
        sel_doc=doc,
        sel_pos=pos[at],
        uniform_ce=uniform_ce,
    )


# --------------------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------------------
def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "gpu":
        return torch.device("cuda")
    return torch.device(device)


class Trainer:
    """One model + AdamW. See the module docstring for what a step does.

    model_dir: HF folder (or hub id in the local cache) to start from; ``model`` (optional) an already built
    ``Qwen3ForCausalLM``-like model to train instead of loading one (benchmarks), ``model_dir`` then only names
    where the tokenizer comes from.
    dtype: "float32" | "bfloat16" | "auto" (float32 on CPU, bfloat16 on CUDA): the parameters' dtype.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lr: float,
        weight_decay: float,
        grad_clip: float,
        device: str,
        dtype: str,
        micro_batch_tokens: int,
        seed: int,
        betas: tuple[float, float] = (0.9, 0.999),
        loss_config: LossConfig | None = None,
        logit_chunk_tokens: int | None = None,
        liger: bool | None = None,
        model: Any = None,
    ) -> None:
        from transformers import AttentionInterface, AutoModelForCausalLM

        self.model_dir = str(model_dir)
        self.device = _resolve_device(device)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or auto, not {dtype!r}")
        self.dtype = dtype
        self.lr = lr
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.loss_config = loss_config or LossConfig()
        self.logit_chunk_tokens = logit_chunk_tokens or (8192 if self.device.type == "cuda" else 1024)
        self.step_count = 0
        self._init_kwargs = {
            "lr": lr,
            "weight_decay": weight_decay,
            "betas": list(betas),
            "grad_clip": grad_clip,
            "dtype": dtype,
            "micro_batch_tokens": micro_batch_tokens,
            "seed": seed,
            "loss_config": asdict(self.loss_config),
            "logit_chunk_tokens": self.logit_chunk_tokens,
        }
        _seed_everything(seed)
        AttentionInterface.register(ATTN_IMPLEMENTATION, packed_attention)
        self.save_dtype = _source_dtype(self.model_dir) or (_config_dtype(model.config) if model is not None else None)
        self.save_dtype = self.save_dtype or dtype
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(
                self.model_dir, dtype=_DTYPES[dtype], attn_implementation=ATTN_IMPLEMENTATION
            )
        else:
            model.config._attn_implementation = ATTN_IMPLEMENTATION
        self.model = model.to(self.device, _DTYPES[dtype])
        self.model.config.use_cache = False
        self.liger = False
        self._fused_ce: Any = None  # liger's fused linear CE for pure-CE steps (see `step`)
        self._term_probe: TermProbe | None = None  # made by the first step that measures the gradient terms
        self._host_copies = HostCopies()  # `save`'s buffers off the device, reused from save to save
        self._offload_copies = HostCopies()  # offload_optimizer_state's own buffers (a save may be writing from its)
        self.optimizer_offloaded = False  # whether the optimizer's state waits off the device
        self._writer: Any = None  # `save`'s writer thread, made by the first save in the background
        self._pending: Any = None  # the save it is writing
        self.written: dict[Any, dict[str, float]] = {}  # `take_written`: tagged saves written, and how long each took
        if liger is not False and self.device.type == "cuda":
            self.liger = _apply_liger(self.model)
            if liger and not self.liger:
                raise RuntimeError("liger=True but liger_kernel is not importable")
            if self.liger and self.loss_config.kl_coef == 0:
                from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

                self._fused_ce = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        if self.device.type == "cuda":  # the MLP's widest activation made again in the backward (train/mlp.py)
            recompute_mlp_inputs(self.model)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: torch.optim.Optimizer
        if dtype == "float32":
            # fused on the CPU too: one pass over the 19M weights of the tiny model instead of ~10 (11x faster)
            self.optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=True)
        else:  # below float32 plain AdamW rounds small updates away
            self.optimizer = KahanAdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)

    def checkpoint_activations(self, layers: int | None = None) -> None:
        """rl.activation_checkpointing: each decoder layer keeps only its input and runs its forward again in the
        backward, so a micro-batch's activations shrink from every layer's (~4 MB a token at the 4B shape) to one
        layer's plus the layer inputs, for a third more update time (benchmarks/log/gpu.md). The recomputed forward is
        the same kernels on the same inputs, so the update is the same (tests/test_train_trainer.py checks the weights).
        `layers` (rl.activation_checkpointing_layers): only the first that many decoder layers recompute; the others
        keep their activations, trading memory for update time (None: all of them).
        How a step runs, not what it computes: not part of the saved state; the RL driver sets it from the config on
        every start and resume."""
        enable = getattr(self.model, "activation_checkpointing_enable", None)  # transformers >= 5.25's name
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if layers is not None:
            for i, layer in enumerate(self.model.model.layers):
                layer.gradient_checkpointing = i < layers

    # -- the optimizer's state off the device between updates ----------------------------------------------------
    def offload_optimizer_state(self) -> int:
        """rl.offload_optimizer: the optimizer's state tensors (moments, Kahan buffers) move off the device into
        `HostCopies` buffers of their own (pinned on CUDA, made once and reused; never `save`'s, which a background
        save may still be writing from), and the device's cached blocks go back to the driver, so a colocated server
        can use that memory while it generates. `step` brings them back after its backward
        (`reload_optimizer_state`). The bytes moved (0 when there is no state yet or it is already off the device)."""
        if self.optimizer_offloaded:
            return 0
        moved = 0
        for key, state, name, t in self._optimizer_tensors():
            state[name] = self._offload_copies.copy(key, t)
            moved += t.numel() * t.element_size()
        if moved and self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # the copies are done before their device blocks are reused
            torch.cuda.empty_cache()
        self.optimizer_offloaded = moved > 0
        return moved

    def reload_optimizer_state(self) -> None:
        """The state `offload_optimizer_state` moved, back on the trainer's device in fresh tensors (the host buffers
        stay for the next offload); nothing when it is on the device."""
        if not self.optimizer_offloaded:
            return
        for _, state, name, t in self._optimizer_tensors():
            state[name] = t.to(self.device, non_blocking=True, copy=True)
        self.optimizer_offloaded = False

    def _optimizer_tensors(self) -> Iterator[tuple[tuple[int, str], dict[str, Any], str, torch.Tensor]]:
        """(key, the parameter's state, name, tensor) of every per-parameter state tensor (0-d step counters are
        left where they are)."""
        for i, p in enumerate(self.model.parameters()):
            state = self.optimizer.state.get(p)
            for name, t in (state or {}).items():
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    yield (i, name), state, name, t

    # -- forward ------------------------------------------------------------------------------------------
    def _hidden(self, p: _Packed) -> torch.Tensor:
        out = self.model.model(
            input_ids=p.input_ids,
            position_ids=p.position_ids,
            cu_seqlens=p.cu_seqlens,
            max_seqlen=p.max_seqlen,
            use_cache=False,
        )
        return out.last_hidden_state[0]

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    # -- training -----------------------------------------------------------------------------------------
    def step(
        self, samples: Sequence[TrainSample], *, lr: float | None = None, grad_terms: bool = False
    ) -> dict[str, float]:
        """One optimizer step over all ``samples``; returns the step's metrics. `grad_terms`: also measure the RL
        and CE terms' gradient norms and cosine (`predict.train.grad_terms`; the update is the same either way)."""
        if not samples:
            raise ValueError("Trainer.step: no samples")
        t0 = time.perf_counter()
        lr = self.lr if lr is None else lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        n_rl = sum(s.n_rl_tokens for s in samples)
        n_ce = sum(s.n_ce_tokens for s in samples)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        # A step with rl and ce samples packs the rl ones first, never both in one micro-batch, measured or not
        # (`term_groups`): the gradient after the first group is then the RL term's.
        groups = term_groups(samples)
        per_group = [[[idx[i] for i in b] for b in pack_micro_batches([len(samples[i].token_ids) for i in idx],
                                                                       self.micro_batch_tokens)] for idx in groups]
        batches = [b for g in per_group for b in g]
        probe = None
        if grad_terms:
            self._term_probe = probe = self._term_probe or TermProbe(self.model.parameters())
            probe.begin(samples, groups)
        for k, group in enumerate(batches):
            if probe is not None and k == len(per_group[0]):
                probe.at_boundary()
            p = _pack([samples[i] for i in group], self.device, weighted_only=True)
            if p.hidden_index.numel() == 0:
                continue
            hidden = self._hidden(p).index_select(0, p.hidden_index)
            if self._fused_ce is not None and n_rl == 0 and (ce_w := p.uniform_ce) is not None:
                # Pure CE (SFT) with one weight: liger's fused linear cross-entropy is exactly this loss, summed.
                loss = self._fused_ce(self.lm_head_weight, hidden, p.targets) * (ce_w / max(n_ce, 1))
                part = float(loss.detach())
                metrics["loss"] = metrics.get("loss", 0.0) + part
                metrics["ce_loss"] = metrics.get("ce_loss", 0.0) + part
                loss.backward()
                continue
            loss = ChunkedLMLoss.apply(
                hidden,
                self.lm_head_weight,
                p.targets,
                p.streams,
                self.loss_config,
                n_rl,
                n_ce,
                self.logit_chunk_tokens,
                metrics,
            )
            loss.backward()
        if probe is not None:
            probe.measure()  # before clipping, which scales the gradient in place
        # The norm stays a tensor until the optimizer's kernels are queued: reading it waits for the GPU, which
        # would then idle while the optimizer's per-parameter launches are made.
        if self.grad_clip and self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
        # rl.offload_optimizer: the state waited off the device since the last step, and comes back only now, once
        # the backward has freed the activations: the two never share the device, so the update's peak is that of a
        # first step, which has no state yet (the 4B rehearsal's single step measured only that one).
        self.reload_optimizer_state()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        grad_norm = float(norm)
        self.step_count += 1
        n_clipped = metrics.pop("n_clipped", 0.0)
        out = {k: float(metrics.get(k, 0.0)) for k in ("loss", "rl_loss", "ce_loss")}
        if self.loss_config.kl_coef:
            out["kl"] = float(metrics.get("kl", 0.0))
        out |= {
            "clip_frac": n_clipped / max(n_rl, 1),
            "n_rl_tokens": float(n_rl),
            "n_ce_tokens": float(n_ce),
            "n_tokens": float(sum(len(s.token_ids) for s in samples)),
            "n_samples": float(len(samples)),
            "n_micro_batches": float(len(batches)),
            "grad_norm": grad_norm,
            "lr": float(lr),
            "step": float(self.step_count),
            "time_s": time.perf_counter() - t0,
        }
        if probe is not None:
            out |= probe.columns(grad_norm)
        return out

    @torch.no_grad()
    def token_logprobs(self, samples: Sequence[TrainSample], *, weighted_only: bool = False) -> list[list[float]]:
        """Per-token logprobs under the current weights: out[i][t] = log p(token_ids[t] | token_ids[:t]).

        Position 0 is 0.0; with ``weighted_only`` only positions with an rl or ce weight are computed (others 0.0).
        """
        was_training = self.model.training
        self.model.eval()
        out: list[list[float]] = [[0.0] * len(s.token_ids) for s in samples]
        for group in pack_micro_batches([len(s.token_ids) for s in samples], self.micro_batch_tokens):
            p = _pack([samples[i] for i in group], self.device, weighted_only=weighted_only)
            if p.hidden_index.numel() == 0:
                continue
            hidden = self._hidden(p).index_select(0, p.hidden_index)
            lp = chunked_logprobs(hidden, self.lm_head_weight, p.targets, self.logit_chunk_tokens).cpu().tolist()
            for d, t, v in zip(p.sel_doc.tolist(), p.sel_pos.tolist(), lp, strict=True):
                out[group[d]][t] = v
        self.model.train(was_training)
        return out

    # -- checkpoints --------------------------------------------------------------------------------------
    def _copy_tokenizer(self, dst: Path) -> None:
        src = Path(self.model_dir)
        found = [name for name in TOKENIZER_FILES if (src / name).is_file()]
        if found:
            for name in found:
                shutil.copyfile(src / name, dst / name)
            return
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(self.model_dir).save_pretrained(dst)

    def _write_model(self, dst: Path, state: dict[str, torch.Tensor], dtype: str) -> None:
        self.model.save_pretrained(dst, state_dict=dict(state))  # it drops tied keys from the dict it is given
        cfg_path = dst / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("_attn_implementation_autoset", None)
        cfg.pop("attn_implementation", None)
        if "torch_dtype" in cfg:
            cfg["torch_dtype"] = dtype
        cfg["dtype"] = dtype
        cfg["use_cache"] = True
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        self._copy_tokenizer(dst)

    def handoff_state(self) -> dict[str, torch.Tensor]:
        """What `save_checkpoint` would write, as tensors on the model's device (`predict.serving.weight_sync`, rule 2)."""
        return weight_sync.handoff_state(self.model, _DTYPES[self.save_dtype])

    def save_checkpoint(self, out_dir: str | Path) -> Path:
        """HF folder (weights in the base checkpoint's dtype + tokenizer), written atomically."""
        self.save(checkpoint=out_dir)
        return Path(out_dir)

    def save_state(self, out_dir: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Everything a resumed run needs: weights (training dtype), AdamW state, step, RNG; atomic."""
        self.save(state=out_dir, extra=extra)
        return Path(out_dir)

    def save(
        self,
        *,
        checkpoint: str | Path | None = None,
        state: str | Path | None = None,
        extra: dict[str, Any] | None = None,
        background: bool = False,
        tag: Any = None,
    ) -> float:
        """Save an HF checkpoint and/or the resumable state as they are now; returns the seconds the caller waited.

        The tensors are first copied off the device (`HostCopies`); the files are then written from those copies, each
        folder into a temp folder renamed into place. With ``background`` the writing runs on the trainer's writer
        thread while the caller goes on training (as torchtitan's asynchronous checkpointing does): the caller waits
        only for the copies and for the previous save still being written (one at a time: its buffers are reused), and
        `wait_saves` waits for the last one and raises what failed there. A kill while a folder is written leaves the
        previous one whole (`settle_dir`). The bytes are those of a save in the foreground: one writer for both.
        ``tag`` names the save in `written` once its folders are written (the RL driver: the step). A state saved with
        a checkpoint in its own dtype links the checkpoint's files instead of writing them again (8 GB at 4B)."""
        if checkpoint is None and state is None:
            return 0.0
        t0 = time.perf_counter()
        self.wait_saves()
        dtypes = list(dict.fromkeys([*([self.save_dtype] if checkpoint is not None else []),
                                     *([self.dtype] if state is not None else [])]))
        copies = self._host_copies
        snap = Snapshot({d: self._weights_copy(d) for d in dtypes})
        if state is not None:
            snap.optimizer = copies.tree("optimizer", self.optimizer.state_dict())
            snap.rng = _rng_state()
            snap.info = {"step": self.step_count, "model_dir": self.model_dir, "save_dtype": self.save_dtype,
                         "kwargs": self._init_kwargs, "extra": json.loads(json.dumps(extra or {}))}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the copies are in the buffers before training moves on
        paths = (Path(checkpoint) if checkpoint is not None else None, Path(state) if state is not None else None)
        if background:
            from concurrent.futures import ThreadPoolExecutor

            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-save")
            self._pending = self._writer.submit(self._write, snap, *paths, tag)
        else:
            self._write(snap, *paths, tag)
        return time.perf_counter() - t0

    def _weights_copy(self, dtype: str) -> dict[str, torch.Tensor]:
        """The model's state dict off the device in `dtype`; a tied lm_head is the embedding's one copy."""
        out: dict[str, torch.Tensor] = {}
        seen: dict[int, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            key = v.data_ptr()
            if key not in seen:
                seen[key] = self._host_copies.copy(("model", dtype, k), v, _DTYPES[dtype])
            out[k] = seen[key]
        return out

    def wait_saves(self) -> dict[str, float]:
        """Wait for a save still being written (`save` with ``background``); its error, if it failed, is raised here.
        Returns the seconds its folders took to write ({"checkpoint": s, "state": s}; {} when none was pending)."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else {}

    def take_written(self) -> dict[Any, dict[str, float]]:
        """{tag: seconds each folder took to write} of the tagged saves written since the last call."""
        out, self.written = self.written, {}
        return out

    def _write(self, snap: Snapshot, checkpoint: Path | None, state: Path | None, tag: Any = None) -> dict[str, float]:
        took: dict[str, float] = {}
        if checkpoint is not None:
            t = time.perf_counter()
            with atomic_dir(checkpoint) as tmp:
                self._write_model(tmp, snap.weights[self.save_dtype], self.save_dtype)
                tmp.chmod(0o755)
            took["checkpoint"] = time.perf_counter() - t
        if state is not None:
            t = time.perf_counter()
            with atomic_dir(state) as tmp:
                if checkpoint is not None and self.dtype == self.save_dtype:  # the same files: linked, written once
                    for f in checkpoint.iterdir():
                        try:
                            os.link(f, tmp / f.name)
                        except OSError:  # a file system without hard links
                            shutil.copy2(f, tmp / f.name)
                else:
                    self._write_model(tmp, snap.weights[self.dtype], self.dtype)
                torch.save(snap.optimizer, tmp / "optimizer.pt")
                torch.save(snap.rng, tmp / "rng.pt")
                (tmp / STATE_FILE).write_text(json.dumps(snap.info, indent=2) + "\n")  # last: the folder is whole
            took["state"] = time.perf_counter() - t
        if tag is not None:
            self.written[tag] = took
        return took

    @staticmethod
    def read_state_info(state_dir: str | Path) -> dict[str, Any] | None:
        settle_dir(Path(state_dir))  # a save killed between its renames: the last whole state goes back first
        path = Path(state_dir) / STATE_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    @classmethod
    def resume(cls, state_dir: str | Path, *, device: str, **overrides: Any) -> Trainer:
        """A trainer exactly as `save_state` left it, on `device` (where this job runs: not part of the state);
        ``overrides`` replace other constructor arguments."""
        state_dir = Path(state_dir)
        info = cls.read_state_info(state_dir)
        if info is None:
            raise FileNotFoundError(f"{state_dir}: no {STATE_FILE} (not a saved trainer state)")
        kwargs = {**info["kwargs"], "device": device}
        kwargs["loss_config"] = LossConfig(**kwargs["loss_config"])
        kwargs["betas"] = tuple(kwargs["betas"])
        kwargs.update(overrides)
        trainer = cls(state_dir, **kwargs)
        trainer.model_dir = info["model_dir"] if Path(info["model_dir"]).exists() else str(state_dir)
        trainer.save_dtype = info["save_dtype"]
        trainer.optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt", map_location=trainer.device))
        trainer.step_count = int(info["step"])
        _set_rng_state(torch.load(state_dir / "rng.pt", weights_only=False))
        trainer.state_extra = info.get("extra", {})
        return trainer


# --------------------------------------------------------------------------------------------------------------
def _source_dtype(model_dir: str) -> str | None:
    """The dtype a checkpoint stores its weights in (config.json), without loading it."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        try:
            from transformers import AutoConfig

            return _config_dtype(AutoConfig.from_pretrained(model_dir))
        except Exception:  # not a local folder nor a cached hub id: the caller falls back to the model's dtype
            return None
    cfg = json.loads(path.read_text())
    d = cfg.get("dtype") or cfg.get("torch_dtype")
    return d if d in _DTYPES else None


def _config_dtype(config: Any) -> str | None:
    d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(d, torch.dtype):
        d = str(d).removeprefix("torch.")
    return d if d in _DTYPES else None


def _apply_liger(model: Any) -> bool:
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    except ImportError:
        return False
    apply_liger_kernel_to_qwen3(
        rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model
    )
    return True


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""The trainer's side of an in-memory weight handoff to a running vLLM server (`VLLMServer.push_weights`).

Rules it follows:

1. **One config key** picks the path, ``rl.weight_sync`` (`resolve_mode`): ``folder`` (write the HF folder, the
   server reloads it), ``memory`` (hand the weights over without files), ``auto`` (the default: ``memory``, the
   fastest path on both devices). On the CPU ``memory`` is a POSIX shared-memory file in ``/dev/shm``; on a GPU it
   is CUDA IPC handles to flat staging buffers of at most ``bucket_bytes`` each (verl's and OpenRLHF's colocated
   path), which the server's worker maps and copies from: no host copy, no serialisation.
2. **What is handed over is what a checkpoint would hold**: the model's state dict in the checkpoint's dtype, a
   tensor that shares storage with an earlier one (a tied lm_head) left out as ``save_pretrained`` does, so a
   handoff and a folder reload of the same weights serve the same tokens.
3. **The manifest** (names, dtypes, shapes, buffer and byte offset of each tensor; each buffer's size and where it
   lives) is what the worker checks whole before it loads anything (`predict.vllm_worker_ext.check_manifest`).
   Offsets are 64-byte aligned, so every view is aligned for its dtype.
4. The buffers are the sender's: reused from step to step while the sizes stay, freed by `close` (the shared-memory
   file is unlinked). A handoff lives only until the next; nothing in it is needed to resume a run (the trainer
   state is), so a kill between a handoff and a step's end loses nothing.
"""

from __future__ import annotations

import base64
import math
import mmap
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MODES = ("auto", "memory", "folder")
DEFAULT_MODE = "auto"
ALIGN = 64
DEFAULT_BUCKET_BYTES = 1 << 30  # 1 GiB: ~8 buckets for Qwen3-4B in bf16; verl's default bucket is of this order
SHM_DIR = Path("/dev/shm")


def resolve_mode(mode: str | None) -> str:
    """``memory`` or ``folder`` for the config value `mode` (None: the default)."""
    mode = mode or DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"rl.weight_sync must be one of {', '.join(MODES)}, not {mode!r}")
    return "folder" if mode == "folder" else "memory"


def handoff_state(model: Any, dtype: Any) -> dict[str, Any]:
    """The tensors a checkpoint of `model` would hold, in `dtype` on the model's device (rule 2)."""
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue  # tied to an earlier tensor (lm_head to embed_tokens): save_pretrained writes it once too
        seen.add(key)
        state[name] = tensor.detach().to(dtype=dtype)
    return state


def _layout(state: Mapping[str, Any], bucket_bytes: int | None) -> tuple[list[dict[str, Any]], list[int]]:
    """Each tensor's buffer and offset, and each buffer's size: buckets of at most `bucket_bytes` (one if None)."""
    tensors: list[dict[str, Any]] = []
    sizes = [0]
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if bucket_bytes is not None and sizes[-1] and sizes[-1] + n > bucket_bytes:
            sizes.append(0)
        tensors.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "buffer": len(sizes) - 1, "offset": sizes[-1]})  # fmt: skip
        sizes[-1] += math.ceil(n / ALIGN) * ALIGN
    return tensors, sizes


class WeightHandoff:
    """Buffers of the trainer process that the server's worker reads the weights from (rules 3 and 4)."""

    def __init__(self, tag: str = "policy", *, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.tag = f"predict-weights-{os.getpid()}-{tag}"
        self.bucket_bytes = bucket_bytes
        self._shm: mmap.mmap | None = None
        self._shm_path: Path | None = None
        self._gpu: list[Any] = []

    def write(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Copy `state` (tensors all on the CPU or all on one GPU) into the buffers; returns the manifest."""
        import torch

        devices = {t.device.type for t in state.values()}
        if len(devices) != 1:
            raise ValueError(f"a weight handoff needs its tensors on one device, not {sorted(devices)}")
        if devices == {"cuda"}:
            tensors, sizes = _layout(state, self.bucket_bytes)
            buffers = self._gpu_buffers(torch, sizes, next(iter(state.values())).device)
            meta = [{"cuda_ipc": _ipc_handle(b), "nbytes": n} for b, n in zip(buffers, sizes, strict=True)]
        else:
            tensors, sizes = _layout(state, None)
            buffers = [self._shm_buffer(torch, sizes[0])]
            meta = [{"shm": str(self._shm_path), "nbytes": sizes[0]}]
        for spec, t in zip(tensors, state.values(), strict=True):
            n = t.numel() * t.element_size()
            flat = buffers[spec["buffer"]][spec["offset"] : spec["offset"] + n]
            flat.view(t.dtype).view(t.shape).copy_(t)
        if devices == {"cuda"}:
            torch.cuda.current_stream().synchronize()  # the receiver reads on its own stream
        return {"tensors": tensors, "buffers": meta}

    def _shm_buffer(self, torch: Any, nbytes: int) -> Any:
        if self._shm is None or len(self._shm) != nbytes:
            self.close()
            self._shm_path = SHM_DIR / self.tag
            fd = os.open(self._shm_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, nbytes)
                self._shm = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
        return torch.frombuffer(memoryview(self._shm), dtype=torch.uint8)

    def _gpu_buffers(self, torch: Any, sizes: list[int], device: Any) -> list[Any]:
        if [b.numel() for b in self._gpu] != sizes:
            self._gpu = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
        return self._gpu

    def close(self) -> None:
        """Free the buffers (the shared-memory file is unlinked; a reader's open mapping stays valid)."""
        if self._shm is not None:
            try:
                self._shm.close()
            except BufferError:  # a tensor view still alive: the mapping goes when it is collected
                pass
            self._shm = None
        if self._shm_path is not None:
            self._shm_path.unlink(missing_ok=True)
            self._shm_path = None
        self._gpu = []

    def __enter__(self) -> WeightHandoff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ipc_handle(buffer: Any) -> str:
    """The CUDA IPC handle of `buffer` as torch's ``rebuild_cuda_tensor`` arguments, pickled, base64 (JSON-safe)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return base64.b64encode(pickle.dumps(args)).decode()

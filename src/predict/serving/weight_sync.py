"""The trainer's side of an in-memory weight handoff to a running vLLM server (`VLLMServer.push_weights`).

Rules it follows:

1. **One config key** picks the path, ``rl.weight_sync`` (`resolve_mode`): ``folder`` (write the HF folder, the
   server reloads it), ``memory`` (hand the weights over without files), ``auto`` (the default: ``memory``, the
   fastest path on both devices). On the CPU ``memory`` is one POSIX shared-memory file in ``/dev/shm`` the tensors
   are copied into; on a GPU it is a CUDA IPC handle per tensor (vLLM's own ``ipc`` weight-transfer engine does the
   same, unpacked): the server's worker maps the trainer's tensors and copies from them, device to device, with no
   staging copy when the training dtype is the checkpoint's, no host copy and no serialisation.
2. **What is handed over is what a checkpoint would hold**: the model's state dict in the checkpoint's dtype, a
   tensor that shares storage with an earlier one (a tied lm_head) left out as ``save_pretrained`` does, so a
   handoff and a folder reload of the same weights serve the same tokens.
3. **The manifest** (names, dtypes, shapes, buffer and byte offset of each tensor; each buffer's size and where it
   lives) is what the worker checks whole before it loads anything (`predict.serving.worker_ext.check_manifest`).
   Offsets are 64-byte aligned, so every view is aligned for its dtype.
4. The buffers are the sender's: the shared-memory file is reused from step to step while its size stays and is
   unlinked by `close`; the GPU tensors handed over are kept alive until the next `write` (the receiver has copied
   them by then: a handoff is synchronous). A handoff lives only until the next; nothing in it is needed to resume a run (the trainer
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

from predict.config import allowed_values
from predict.config.models import RLSettings

MODES = allowed_values(RLSettings, "weight_sync")  # auto, memory, folder
ALIGN = 64
SHM_DIR = Path("/dev/shm")


def resolve_mode(mode: str) -> str:
    """``memory`` or ``folder`` for the config value `mode` (config rl.weight_sync)."""
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


def _layout(state: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Each tensor's offset in one buffer, and the buffer's size."""
    tensors: list[dict[str, Any]] = []
    size = 0
    for name, t in state.items():
        tensors.append({"name": name, "dtype": _dtype_name(t), "shape": list(t.shape), "buffer": 0, "offset": size})
        size += math.ceil(t.numel() * t.element_size() / ALIGN) * ALIGN
    return tensors, size


def _dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


class WeightHandoff:
    """Buffers of the trainer process that the server's worker reads the weights from (rules 3 and 4)."""

    def __init__(self, tag: str = "policy") -> None:
        self.tag = f"predict-weights-{os.getpid()}-{tag}"
        self._shm: mmap.mmap | None = None
        self._shm_path: Path | None = None
        self._gpu: list[Any] = []

    def write(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Hand over `state` (tensors all on the CPU or all on GPUs): returns the manifest the worker reads."""
        import torch

        devices = {t.device.type for t in state.values()}
        if len(devices) != 1:
            raise ValueError(f"a weight handoff needs its tensors on one kind of device, not {sorted(devices)}")
        if devices == {"cuda"}:
            self._gpu = [t.contiguous().view(-1).view(torch.uint8) for t in state.values()]  # kept alive (rule 4)
            torch.cuda.current_stream().synchronize()  # the receiver reads them on its own stream
            tensors = [{"name": name, "dtype": _dtype_name(t), "shape": list(t.shape), "buffer": i, "offset": 0}
                       for i, (name, t) in enumerate(state.items())]
            meta = [{"cuda_ipc": _ipc_handle(b), "nbytes": b.numel()} for b in self._gpu]
            return {"tensors": tensors, "buffers": meta}
        tensors, size = _layout(state)
        buffer = self._shm_buffer(torch, size)
        for spec, t in zip(tensors, state.values(), strict=True):
            n = t.numel() * t.element_size()
            buffer[spec["offset"] : spec["offset"] + n].view(t.dtype).view(t.shape).copy_(t)
        return {"tensors": tensors, "buffers": [{"shm": str(self._shm_path), "nbytes": size}]}

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

"""The trainer's saves as folders that are whole or absent: written into a temp folder renamed into place
(`atomic_dir`), put right after a kill (`settle_dir`), and written from copies taken off the device between steps
(`HostCopies`, `Snapshot`), so `predict.train.trainer.Trainer.save` can write them beside the next steps."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["HostCopies", "Snapshot", "atomic_dir", "settle_dir"]


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """A fresh folder to write into that then replaces ``final`` (a reader sees the old folder or the new one, never
    half of one). A kill between its two renames leaves ``final`` missing and the old folder beside it: `settle_dir`
    puts it back."""
    settle_dir(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    yield tmp
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _pid_alive(name: str) -> bool:
    try:
        os.kill(int(name.rsplit("-", 1)[1]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def settle_dir(final: Path) -> None:
    """What a save killed mid-way left beside ``final``: where ``final`` is missing, the folder it was renamed to
    (``.{name}.old-{pid}``, complete: only a finished folder is ever renamed there) goes back; half-written
    ``.{name}.tmp-{pid}`` folders and leftover old ones of dead processes are deleted (a 4B trainer state is 32 GB)."""
    if not final.parent.is_dir():
        return
    leftovers = sorted(final.parent.glob(f".{final.name}.old-*")) + sorted(final.parent.glob(f".{final.name}.tmp-*"))
    for path in leftovers:
        if not path.name.endswith(f"-{os.getpid()}") and _pid_alive(path.name):
            continue  # another live process is writing it
        if ".old-" in path.name and not final.exists():
            path.rename(final)
        else:
            shutil.rmtree(path, ignore_errors=True)


class HostCopies:
    """Copies of the trainer's tensors off the device, taken between steps so the files are written from them while
    training goes on. On CUDA they land in pinned buffers made once and reused by every later save (the copy runs at
    the link's speed: 32 GB of 4B state in about 1.5 s on an H100, against 41.6 s to write it); on the CPU each is a
    fresh copy (the live tensor moves on, so never the tensor itself)."""

    def __init__(self) -> None:
        self.buffers: dict[Any, torch.Tensor] = {}

    def copy(self, key: Any, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = t.detach()
        dtype = dtype or t.dtype
        if t.device.type != "cuda":
            return t.to(dtype=dtype, copy=True)
        buf = self.buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != dtype:
            buf = self.buffers[key] = torch.empty(t.shape, dtype=dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        return buf

    def tree(self, key: Any, value: Any) -> Any:
        """The same nested dicts, lists and tuples with every tensor copied (an optimizer's state_dict)."""
        if isinstance(value, torch.Tensor):
            return self.copy(key, value)
        if isinstance(value, dict):
            return {k: self.tree((key, k), v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.tree((key, i), v) for i, v in enumerate(value))
        return value


@dataclass
class Snapshot:
    """One save's content, off the device: what `predict.train.trainer.Trainer` (its `_write`) puts in the files."""

    weights: dict[str, dict[str, torch.Tensor]]
    """dtype name -> the model's state dict in that dtype (the checkpoint's and the state's; one when they agree)."""
    optimizer: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    info: dict[str, Any] | None = None

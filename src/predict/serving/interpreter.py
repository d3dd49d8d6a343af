"""Which interpreter serves the model (config ``serving.python``), and does it import vLLM? Checked before any job.

vLLM lives in its own environment (it pins openai 3.x, verifiers needs openai<3), so every serving job starts
the server with the interpreter ``serving.python`` names. A wrong value would only show on the first serving
job, after its queue wait and model download, as ``No module named 'vllm'`` in a server log; the
``check_serving`` rule (``predict check-serving``, `predict.serving.stage`) runs this check once, on the submitting machine, before any
serving job is submitted, and fails with one line naming ``serving.python`` and the interpreter.

Rules:

* ``serving.python`` is a path (absolute, or relative to the working directory, which is the repository root
  under Snakemake: jobs run there too), or a bare command name looked up on PATH;
* null means what :class:`predict.serving.server.VLLMServer` does with it: the repository's ``.venv-vllm`` on the CPU
  when present, else the interpreter running this (the job's own environment);
* the interpreter must import ``vllm`` (``python -c "import vllm"``, with the server's environment cleaned of
  our PYTHONPATH/VIRTUAL_ENV exactly as the server gets it). Its version is recorded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from predict.config import ConfigError
from predict.serving.server import base_environment, default_python

__all__ = ["ServingPythonError", "check_serving_python", "resolve_serving_python"]

_HOW_TO_FIX = (
    "build the vLLM environment with `PREDICT_VLLM=gpu bash envs/install.sh` (GPU; `bash envs/install.sh` for the "
    "CPU build) or `conda env create -p .venv-vllm -f envs/vllm-gpu.yaml`, or point serving.python at an "
    "interpreter that has vLLM"
)

# vLLM may log to stdout on import, so the answer is marked.
_PROBE = "import sys, vllm; print('predict-probe', getattr(vllm, '__version__', 'unknown'), sys.executable, sep='\\t')"


class ServingPythonError(ConfigError):
    """``serving.python`` does not name an interpreter that imports vLLM."""


def _describe(value: str | None) -> str:
    return "serving.python: null (the job's own interpreter)" if value is None else f"serving.python: {value!r}"


def resolve_serving_python(value: str | None, device: Literal["cpu", "gpu"] = "gpu") -> str:
    """The interpreter a serving job will run for ``serving.python = value``, as an absolute path."""
    if value is None:
        return str(Path(default_python(device)).absolute())
    if os.sep in value or (os.altsep and os.altsep in value):
        path = Path(value).expanduser().absolute()
        if not path.exists():
            raise ServingPythonError(f"{_describe(value)}: {path} does not exist; {_HOW_TO_FIX}")
        if not os.access(path, os.X_OK) or path.is_dir():
            raise ServingPythonError(f"{_describe(value)}: {path} is not an executable file; {_HOW_TO_FIX}")
        return str(path)
    found = shutil.which(value)
    if found is None:
        raise ServingPythonError(f"{_describe(value)}: no command {value!r} on PATH; {_HOW_TO_FIX}")
    return str(Path(found).absolute())


def check_serving_python(
    value: str | None, device: Literal["cpu", "gpu"] = "gpu", timeout_s: float = 300.0
) -> dict[str, Any]:
    """Resolve ``serving.python`` and import vLLM with it; raise :class:`ServingPythonError` if that fails.

    Returns what was checked: the config value, the interpreter, the vLLM version and how long the import took.
    """
    python = resolve_serving_python(value, device)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=base_environment(),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ServingPythonError(
            f"{_describe(value)}: `{python} -c 'import vllm'` did not finish in {timeout_s:g} s"
        ) from None
    except OSError as e:
        raise ServingPythonError(f"{_describe(value)}: cannot run {python}: {e}; {_HOW_TO_FIX}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit code {proc.returncode}"
        raise ServingPythonError(f"{_describe(value)}: {python} cannot import vllm ({why}); {_HOW_TO_FIX}")
    answer = [ln.split("\t") for ln in proc.stdout.splitlines() if ln.startswith("predict-probe\t")]
    version, executable = answer[-1][1:3] if answer and len(answer[-1]) >= 3 else ("unknown", python)
    return {
        "serving.python": value,
        "interpreter": python,
        "interpreter_executable": executable,
        "vllm_version": version,
        "device": device,
        "import_s": round(time.perf_counter() - t0, 3),
        "checker": sys.executable,
        "time": time.strftime("%FT%T%z"),
    }


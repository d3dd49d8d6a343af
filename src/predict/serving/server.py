"""Start and stop a vLLM OpenAI-compatible server for one checkpoint, leaving no process behind.

vLLM lives in its own virtualenv (it pins openai 3.x, verifiers needs openai<3), so the server is
always a *subprocess* run by a configured interpreter (``serving.python``); nothing here imports vLLM.

Guarantees:

* binds 127.0.0.1 only; a free port is picked when none is given (and re-picked if it was taken
  in the meantime);
* server output goes to a log file, never to a pipe that could fill up and stall the server;
* :meth:`VLLMServer.start` returns only once ``GET /health`` and ``GET /v1/models`` answer; if the
  process exits early it raises at once with the log's last lines; if it raises, no process is left;
* the server runs in its own session / process group under a tiny stdlib-only supervisor (the group
  leader, run by the same interpreter); :meth:`VLLMServer.stop` sends SIGTERM to the group, waits,
  then SIGKILLs the group.  The leader is not reaped until the group is dead (so its pid, which is
  the group id, cannot be recycled meanwhile).  An ``atexit`` hook and a SIGTERM/SIGHUP handler
  (installed only where the default handler is in place) stop servers still running;
* if this process dies without cleaning up (SIGKILL, OOM), the supervisor notices (``PR_SET_PDEATHSIG``
  at once, or its parent pid changing, checked twice a second) and takes the whole group down.  Why
  a supervisor: PDEATHSIG on the API server alone is not enough; vLLM's EngineCore and
  multiprocessing resource tracker were seen surviving it as orphans holding the KV cache.
* the exception, by design: the server a local run's jobs share (:class:`SharedServer`, config
  ``serving.shared``) outlives the job that started it; its supervisor stops it once no job has leased it for
  ``idle_s`` seconds, and the workflow stops it when the run ends (:func:`stop_shared_server`).

CPU defaults are the fastest start measured on the 2-core CPU machines (vLLM's CPU build): ``--enforce-eager``
(torch.compile start-up costs ~60-80 s and recompiles for every new checkpoint path),
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine in the API process: ~25 s to healthy instead of ~38 s),
``VLLM_CPU_KVCACHE_SPACE=1`` GiB, OpenMP bound to all cores this process may use with none reserved.
``--enable-scale-out`` is on by default so ``/inference/v1/generate`` (token ids in/out) works, with
a small ASGI middleware (``GenerateTokenCompat`` in :mod:`predict.serving.worker_ext`) that adds the
``"token": "token_id:<id>"`` field the verifiers 0.4 train client requires in its logprobs.

Evaluation that repeats (same checkpoint, config, hardware and vLLM version -> the same rows): a GPU server for
evaluation runs batch-invariant (``VLLM_BATCH_INVARIANT=1``, config ``serving.batch_invariant``, default on), so a
request's numerics do not depend on the requests batched beside it; where that is unavailable (the CPU build,
or the key off) evaluation sends one request at a time (`evaluation_concurrency`), the cheapest setting measured
to repeat on the CPU (benchmarks/eval_repeat.py). `serving_identity` is what such a result depends on.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from predict.config.models import ServingSettings, SharedServerSettings
from predict.outputs import read_json, write_text
from predict.serving.model_identity import model_identity
from predict.serving.process import (
    SUPERVISOR,
    cpu_list,
    cpu_server_environment,
    free_port,
    lock_fd,
    pdeathsig_preexec,
    process_start,
    stop_group,
)

__all__ = ["GENERATE_COMPAT_MIDDLEWARE", "SERVED_NAME", "WORKER_EXT_CLS", "SharedServer", "VLLMServer", "VLLMServerError",
           "base_environment", "default_cache_dir", "default_python", "stop_shared_server"]

log = logging.getLogger(__name__)

#: The name every pipeline server serves its checkpoint under (rollouts, evaluation, training): one name, so a
#: server shared between jobs (`SharedServer`) answers each of them, and records never depend on which server ran.
SERVED_NAME = "policy"

#: Module name under which worker_ext.py is copied for the server's interpreter (see _worker_ext_dir).
_WORKER_EXT_MODULE = "predict_vllm_worker_ext"
WORKER_EXT_CLS = f"{_WORKER_EXT_MODULE}.RLWorkerExt"
GENERATE_COMPAT_MIDDLEWARE = f"{_WORKER_EXT_MODULE}.GenerateTokenCompat"

_REPO_ROOT = Path(__file__).resolve().parents[3]

@functools.cache
def _knows_scale_out_flag(python: str) -> bool:
    """Whether the vLLM that `python` imports has ``--enable-scale-out``: newer vLLM (0.32 here) registers the token-in/out
    endpoints (``/inference/v1/generate``) only with it, vLLM 0.26 always and refuses the unknown flag. Read from its
    command-line modules' source (importing vLLM takes seconds); where none is found, the flag is given."""
    probe = "import importlib.util as u; s = u.find_spec('vllm'); print(s.submodule_search_locations[0] if s else '')"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, env=base_environment())
    except (OSError, subprocess.SubprocessError):
        return True
    root = Path(out.stdout.strip() or "/nonexistent") / "entrypoints"
    sources = list(root.glob("**/cli_args.py"))
    return not sources or any("enable_scale_out" in f.read_text(errors="replace") for f in sources)


class VLLMServerError(RuntimeError):
    """The server failed to start, died, or an admin request failed."""


class _PortInUse(VLLMServerError):
    pass


def serving_settings(serving: ServingSettings | Mapping[str, Any]) -> ServingSettings:
    """The ``serving`` section as its model: a stage's typed section as it is; a mapping (a caller not typed yet, a
    test's hand-made section) validated, its defaults filled in."""
    return serving if isinstance(serving, ServingSettings) else ServingSettings.model_validate(dict(serving))


def default_cache_dir() -> Path:
    """``<repo>/.cache`` (git-ignored) in a source checkout, else ``~/.cache/predict``."""
    in_repo = (_REPO_ROOT / "pyproject.toml").is_file() and (_REPO_ROOT / "src" / "predict").is_dir()
    return _REPO_ROOT / ".cache" if in_repo else Path.home() / ".cache" / "predict"


def default_python(device: Literal["cpu", "gpu"]) -> str:
    """Interpreter for the server: ``<repo>/.venv-vllm/bin/python`` on CPU when present, else ours."""
    if device == "cpu":
        cand = _REPO_ROOT / ".venv-vllm" / "bin" / "python"
        if cand.exists():
            return str(cand)
    return sys.executable


def base_environment() -> dict[str, str]:
    """Our environment as any process of the vLLM env gets it (the server, `predict.serving.interpreter`'s probe): our
    interpreter's PYTHONPATH/PYTHONHOME/VIRTUAL_ENV must not leak into the other venv; no usage statistics."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    return env


def _tail(path: Path, lines: int = 40, max_bytes: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(data.splitlines()[-lines:])


def _served_models(root_url: str) -> dict[str, Any] | None:
    """The ``/v1/models`` answer once ``/health`` is 200, else None; raises OSError or JSONDecodeError while the
    server does not answer."""
    with urllib.request.urlopen(root_url + "/health", timeout=5) as r:
        if r.status != 200:
            return None
    with urllib.request.urlopen(root_url + "/v1/models", timeout=10) as r:
        return json.loads(r.read())


def _worker_ext_dir(cache_dir: Path) -> Path:
    """A directory holding only ``predict_vllm_worker_ext.py``, for the server's PYTHONPATH.

    Why a copy instead of ``src/`` on PYTHONPATH: importing ``predict.serving.worker_ext`` would run
    ``predict/__init__.py`` inside the vLLM env, which must never start depending on our pipeline's
    packages (verifiers, openai<3).  The copy is rewritten only when its content changed.
    """
    dst = cache_dir / "vllm_worker_ext" / f"{_WORKER_EXT_MODULE}.py"
    text = Path(__file__).with_name("worker_ext.py").read_text()
    if not dst.exists() or dst.read_text() != text:
        write_text(text, dst)  # atomic: a concurrently starting server never imports half a file
    return dst.parent


# --- process-wide cleanup -------------------------------------------------------------------------

_LIVE: set[VLLMServer] = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it


def _stop_all(timeout_s: float = 5.0) -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for s in servers:
        with contextlib.suppress(Exception):
            s.stop(timeout_s=timeout_s)


def _on_fatal_signal(signum: int, frame: FrameType | None) -> None:
    # Stop our servers, then die of the same signal as if no handler had been installed.
    _stop_all(timeout_s=3.0)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@functools.cache  # once per process
def _install_cleanup_handlers() -> None:
    atexit.register(_stop_all)
    # SIGTERM/SIGHUP would otherwise kill us without running atexit.  Only replace the default
    # handler (never someone else's), and only from the main thread (signal.signal requires it).
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _on_fatal_signal)


# --- the server -----------------------------------------------------------------------------------


class VLLMServer:
    """A vLLM OpenAI server for one checkpoint, as a subprocess.  Use as a context manager::

        with VLLMServer(model_dir, max_model_len=4096, startup_timeout_s=300) as srv:
            client = OpenAI(base_url=srv.base_url, api_key="x")
            ... client.chat.completions.create(model=srv.model_name, ...)

    Arguments:
        model: checkpoint folder (or a Hub id already in the local HF cache; the server runs offline).
        python: interpreter with vLLM installed (config ``serving.python``); default :func:`default_python`.
        device: "cpu" adds the vLLM-CPU fast-start flags/env; "gpu" adds none of them.
        port: fixed port, or None for a free one.
        served_model_name: the ``model`` name clients send; default the model string as given to vLLM.
        max_model_len: ``--max-model-len`` (config ``serving.max_model_len``).
        extra_args: appended to the command line (after ours, so they can override).
        env: extra environment for the server (applied last).
        log_path: server stdout+stderr; default ``<cache>/logs/vllm-<time>-<port>.log``.
        startup_timeout_s: how long :meth:`start` waits for health (config ``serving.startup_timeout_s``).
        enable_scale_out: ``--enable-scale-out`` (``/inference/v1/generate`` with token ids).
        generate_token_compat: with scale-out, add the ``GenerateTokenCompat`` middleware so the
            verifiers/renderers train client accepts ``/inference/v1/generate`` logprobs.
        worker_extension: load :mod:`predict.serving.worker_ext` (``VLLM_SERVER_DEV_MODE=1``) so that
            :meth:`reload_weights` can swap weights in place.
        enforce_eager: default True on CPU, False on GPU.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` on CPU.
        offline: set ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` (no machine here reaches the Hub).
        cache_dir: holds ``VLLM_CACHE_ROOT`` (``<cache>/vllm``), logs and the worker-extension copy.
        kill_on_parent_death: the supervisor takes the server group down when this process dies:
            PR_SET_PDEATHSIG (only when :meth:`start` runs on the main thread, because it fires when
            the *creating thread* exits) plus a parent-pid check every 0.5 s (any thread).
        stop_grace_s: how long the supervisor lets vLLM shut down before SIGKILL on parent death.
        idle_lock, idle_s: a server shared between jobs (:class:`SharedServer`) stops itself once ``idle_lock``
            (the lease's lock file) is unlocked and untouched for ``idle_s`` seconds.
    """

    @classmethod
    def from_serving(
        cls, model: Path | str, serving: ServingSettings | Mapping[str, Any], *, sequences: int, **kw: Any
    ) -> VLLMServer | SharedServer:
        """A server for `model` as the config's `serving` section sets it up (interpreter, device, context length,
        start-up timeout; on a GPU its memory share, with KV room for `sequences` episodes in flight, i.e.
        ``env.concurrency``, and sleep mode: `predict.serving.gpu_memory.server_gpu_args`); `kw` adds or overrides
        the rest (served name, worker extension, log, extra args). With ``serving.shared`` it is a lease on the one
        server the run's jobs share (`SharedServer`), used the same way (``with ... as srv``, or
        ``start()``/``stop()``)."""
        from predict.serving.gpu_memory import server_gpu_args

        serving = serving_settings(serving)
        extra_args = [*server_gpu_args(serving, model, sequences=sequences), *kw.pop("extra_args", [])]
        settings = {"python": serving.python, "device": serving.device, "max_model_len": serving.max_model_len,
                    "startup_timeout_s": serving.startup_timeout_s, "extra_args": extra_args, **kw}
        if serving.shared is not None:
            return SharedServer(model, idle_s=serving.shared.idle_s, **settings)
        return cls(model, **settings)

    def __init__(
        self,
        model: Path | str,
        *,
        python: str | None = None,
        device: Literal["cpu", "gpu"] = "cpu",
        port: int | None = None,
        served_model_name: str | None = None,
        max_model_len: int,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float,
        enable_scale_out: bool = True,
        generate_token_compat: bool = True,
        worker_extension: bool = False,
        enforce_eager: bool | None = None,
        kv_cache_gib: float = 1,
        offline: bool = True,
        cache_dir: Path | None = None,
        kill_on_parent_death: bool = True,
        stop_grace_s: float = 5.0,
        idle_lock: Path | None = None,
        idle_s: float = 0.0,
    ) -> None:
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', not {device!r}")
        self.model = model
        self.device = device
        self.python = python or default_python(device)
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.enable_scale_out = enable_scale_out
        self.generate_token_compat = generate_token_compat
        self.worker_extension = worker_extension
        self.enforce_eager = (device == "cpu") if enforce_eager is None else enforce_eager
        self.kv_cache_gib = kv_cache_gib
        self.offline = offline
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._log_path_arg = Path(log_path) if log_path is not None else None
        self.log_path: Path | None = self._log_path_arg
        self.kill_on_parent_death = kill_on_parent_death
        self.stop_grace_s = stop_grace_s
        self.idle_lock, self.idle_s = idle_lock, idle_s
        self._proc: Any = None  # subprocess.Popen[bytes]
        self._tags_versions = True  # the server has /update_weight_version (until a 404 says otherwise)
        self.models_info: dict[str, Any] | None = None  # the /v1/models answer once healthy
        self.startup_s: float | None = None

    # -- addresses ----------------------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI client base URL."""
        return f"{self.root_url}/v1"

    @property
    def model_name(self) -> str:
        """The ``model`` field clients must send."""
        return self.served_model_name or self._model_arg()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._leader_exit_code() is None

    @property
    def sleep_mode(self) -> bool:
        """Started with ``--enable-sleep-mode`` (GPU servers: `predict.serving.gpu_memory.server_gpu_args`)."""
        return "--enable-sleep-mode" in self.extra_args

    # -- command line and environment -------------------------------------------------------------

    def _model_arg(self) -> str:
        p = Path(self.model).expanduser()
        # A local folder is passed absolute (the server may run with another cwd); a Hub id as is.
        return str(p.resolve()) if p.exists() else str(self.model)

    def launch_command(self) -> list[str]:
        """What is actually spawned: the supervisor, which runs :meth:`command`."""
        parent = os.getpid() if self.kill_on_parent_death else 0
        idle = [str(self.idle_lock), f"{self.idle_s:g}"] if self.idle_lock is not None else ["", "0"]
        return [self.python, "-c", SUPERVISOR, str(parent), f"{self.stop_grace_s:g}", *idle, *self.command()]

    def command(self) -> list[str]:
        """The vLLM server command line (run by the supervisor)."""
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self._model_arg()]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.enable_scale_out:
            if _knows_scale_out_flag(self.python):  # vLLM < 0.27 (the GPU pin, 0.26) serves it without the flag
                cmd.append("--enable-scale-out")
            if self.generate_token_compat:
                cmd += ["--middleware", GENERATE_COMPAT_MIDDLEWARE]
        if self.worker_extension:
            cmd += ["--worker-extension-cls", WORKER_EXT_CLS]
        # One access-log line per request would dominate the log under rollout load.
        cmd.append("--disable-uvicorn-access-log")
        return cmd + self.extra_args

    def environment(self, *, prepare: bool = False) -> dict[str, str]:
        """The server's environment.  ``prepare=True`` also writes the worker-extension copy."""
        env = base_environment()
        bin_dir = Path(self.python).parent
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # tools vLLM may spawn from its venv
        if (bin_dir.parent / "pyvenv.cfg").is_file():
            env["VIRTUAL_ENV"] = str(bin_dir.parent)
        env["PYTHONUNBUFFERED"] = "1"  # log lines appear as they happen (start-up diagnosis)
        env["VLLM_CACHE_ROOT"] = str(self.cache_dir / "vllm")
        if self.offline:
            env["HF_HUB_OFFLINE"] = "1"
            env["TRANSFORMERS_OFFLINE"] = "1"
        if self.device == "cpu":
            env.update(cpu_server_environment(self.kv_cache_gib))  # threads fixed: the same rows whoever starts it
        else:
            # vLLM's own sampler on every GPU server: which sampler runs must not depend on whether FlashInfer happens
            # to be installed (the offline folder, envs/offline.py, leaves it out; a node without it would fail).
            env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
        if self.worker_extension or self.sleep_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # enables /collective_rpc, /reset_prefix_cache, /sleep and /wake_up
        if self.worker_extension or (self.enable_scale_out and self.generate_token_compat):
            ext_dir = _worker_ext_dir(self.cache_dir) if prepare else self.cache_dir / "vllm_worker_ext"
            env["PYTHONPATH"] = str(ext_dir)
        env.update(self.env)
        return env

    # -- lifecycle ----------------------------------------------------------------------------------

    def _check_inputs(self) -> None:
        """Fail in milliseconds, not after vLLM's ~15 s of imports, on the obvious mistakes."""
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)) and not shutil.which(self.python):
            raise FileNotFoundError(f"vLLM interpreter not found or not executable: {self.python}")
        p = Path(self.model).expanduser()
        s = str(self.model)
        looks_local = isinstance(self.model, Path) or p.is_absolute() or s.startswith((".", "~")) or s.count("/") != 1
        if p.exists():
            if p.is_dir() and not (p / "config.json").is_file():
                raise FileNotFoundError(f"model folder {p} has no config.json")
        elif looks_local:
            raise FileNotFoundError(f"model path does not exist: {p}")

    def start(self, on_spawn: Callable[[VLLMServer], None] | None = None) -> VLLMServer:
        """Spawn the server and wait until healthy.  On any failure nothing is left running.  `on_spawn` is called
        once the process exists, before it is healthy (a shared server records itself there)."""
        if self._proc is not None:
            raise VLLMServerError(f"server already started (pid {self._proc.pid})")
        self._check_inputs()
        _install_cleanup_handlers()
        retries = 2 if self._auto_port else 0
        while True:
            t0 = time.perf_counter()
            self._spawn()
            try:
                if on_spawn is not None:
                    on_spawn(self)
                self.wait_healthy()
            except _PortInUse:
                self.stop()
                if not retries:
                    raise
                retries -= 1
                self.port = free_port()  # someone took our free port between pick and bind
                continue
            except BaseException:  # includes KeyboardInterrupt: never leave a half-started server
                self.stop()
                raise
            self.startup_s = time.perf_counter() - t0
            return self

    def _spawn(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = self._log_path_arg or self.cache_dir / "logs" / f"vllm-{stamp}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd, env = self.launch_command(), self.environment(prepare=True)
        preexec = None
        if self.kill_on_parent_death and sys.platform.startswith("linux"):
            if threading.current_thread() is threading.main_thread():
                preexec = pdeathsig_preexec(os.getpid())
        with open(self.log_path, "ab") as log:
            log.write(f"# {time.strftime('%F %T')} starting: {' '.join(self.command())}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,  # a file, never a pipe: a full pipe would block the server
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own session + process group: stop() kills the whole group
                preexec_fn=preexec,
                close_fds=True,
            )
        self._proc = proc
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _leader_exit_code(self) -> int | None:
        """Exit status if the server process has exited, WITHOUT reaping it (pid/pgid stay reserved)."""
        proc = self._proc
        if proc is None:
            return None
        if proc.returncode is not None:
            return int(proc.returncode)
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped elsewhere
            return proc.returncode if proc.returncode is not None else -1
        if info is None:
            return None
        return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status

    def _http(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.root_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw.strip() else None

    def _fail(self, msg: str) -> VLLMServerError:
        tail = _tail(self.log_path) if self.log_path else ""
        cls = _PortInUse if "address already in use" in tail.lower() else VLLMServerError
        return cls(f"{msg}\n--- last lines of {self.log_path} ---\n{tail}")

    def wait_healthy(self) -> dict[str, Any]:
        """Block until ``/health`` is 200 and ``/v1/models`` lists our model; returns the models answer. Raises
        :class:`VLLMServerError` (with the log tail) if the process exits or time runs out; ``start`` stops it then."""
        if self._proc is None:
            raise VLLMServerError("server not started")
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self._leader_exit_code()
            if code is not None:
                raise self._fail(f"vLLM server for {self.model} exited with code {code} before becoming healthy")
            try:
                models = _served_models(self.root_url)
            except (OSError, json.JSONDecodeError):
                models = None  # not listening yet
            if models is not None:
                ids = [m.get("id") for m in models.get("data", [])]
                if self.model_name not in ids:
                    raise self._fail(f"server is up but serves {ids}, not {self.model_name!r}")
                self.models_info = models
                return models
            if time.monotonic() > deadline:
                raise self._fail(f"vLLM server for {self.model} not healthy after {self.startup_timeout_s:.0f} s")
            time.sleep(0.25)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, wait up to ``timeout_s``, SIGKILL the group; idempotent."""
        proc = self._proc
        if proc is None:
            return
        try:
            stop_group(proc.pid, timeout_s)  # start_new_session: the leader's pid is the group id
            proc.wait()
        finally:
            self._proc = None
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VLLMServer(model={str(self.model)!r}, device={self.device!r}, url={self.base_url!r}, pid={self.pid})"

    # -- sleep mode (GPU, --enable-sleep-mode) ------------------------------------------------------------------

    def sleep(self, level: int = 2) -> bool:
        """Give the GPU memory back while the trainer needs it: level 2 drops the weights and the KV cache (0.09 s
        for the 4B shape; level 1's copy of the weights to the CPU costs 7.6 s: benchmarks/log/gpu.md). The weights
        must be loaded again after `wake_up` (every caller does: an RL step pushes its update, a shared lease reloads
        its checkpoint). Returns False (nothing done) on a server without sleep mode."""
        if not self.sleep_mode:
            return False
        self._http("POST", f"/sleep?level={int(level)}&mode=wait", timeout=300)
        return True

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Take the memory back after `sleep` (a no-op on an awake server, or one without sleep mode). ``tags`` wakes
        a part, each once: ``("weights",)`` to load new weights while the KV cache sleeps and the engine schedules
        nothing (`predict.train.driver.UpdateWindow.sync`), then ``("kv_cache",)``, which resumes scheduling."""
        if not self.sleep_mode:
            return False
        if tags is not None:
            self._http("POST", "/wake_up?" + urllib.parse.urlencode([("tags", t) for t in tags]), timeout=300)
            return True
        if not (self._http("GET", "/is_sleeping", timeout=60) or {}).get("is_sleeping"):
            return False
        self._http("POST", "/wake_up", timeout=300)
        return True

    # -- weight reload (needs worker_extension=True) -----------------------------------------------

    def reload_weights(self, weights_dir: Path | str, *, version: str | None = None, drain: bool = True) -> list[str]:
        """Load ``weights_dir``'s safetensors into the running server in place (same architecture): pause (drain
        in-flight requests) -> worker ``reload_from_path`` -> reset prefix cache (cached KV blocks were computed with
        the old weights) -> resume; optionally tag ``version``. Returns the workers' messages. ``drain=False`` skips
        the pause, reset and resume, for a server whose engine schedules nothing and holds no prefix cache: its
        KV cache asleep (vLLM's sleep pauses the scheduler and clears that cache; `wake_up` by tags)."""
        path = str(Path(weights_dir).expanduser().resolve())
        return self._worker_update("reload_from_path", path, version=version, drain=drain,
                                   what=f"weight reload from {path}")

    def push_weights(self, manifest: Mapping[str, Any], *, version: str | None = None, drain: bool = True) -> list[str]:
        """Load an in-memory handoff (`predict.serving.weight_sync.WeightHandoff.write`'s manifest) into the running server
        in place, as `reload_weights` does a folder (``drain`` likewise). A handoff that does not fit the served
        model is refused before any weight changes (`VLLMServerError` naming the tensor); the previous weights keep
        serving."""
        return self._worker_update("load_from_memory", dict(manifest), version=version, drain=drain,
                                   what="in-memory weight sync")

    def _worker_update(self, method: str, arg: Any, *, version: str | None, drain: bool, what: str) -> list[str]:
        if not self.worker_extension:
            raise VLLMServerError(f"{what} needs VLLMServer(..., worker_extension=True)")
        try:
            if drain:
                self._http("POST", "/pause?mode=wait", timeout=300)
            try:
                res = self._http("POST", "/collective_rpc", {"method": method, "args": [arg]}, timeout=600)
                reset = self._http("POST", "/reset_prefix_cache", timeout=60) if drain else None
                if isinstance(reset, dict) and reset.get("success") is False:
                    raise VLLMServerError(f"reset_prefix_cache failed: {reset}")
            finally:
                if drain:
                    self._http("POST", "/resume", timeout=60)
            if version is not None and self._tags_versions:
                try:
                    self._http("POST", "/update_weight_version", {"new_version": version}, timeout=60)
                except urllib.error.HTTPError as e:
                    if e.code != 404:
                        raise
                    self._tags_versions = False  # vLLM 0.26 has no version tag: the weights are loaded all the same
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            if "weight handoff refused" in detail:  # the worker checked it and loaded nothing: the server is fine
                raise VLLMServerError(f"{what} refused by the server: {detail}") from e
            raise self._fail(f"{what} failed: HTTP {e.code} {detail}") from e
        return list((res or {}).get("results", []))


# --- one server shared by the jobs of a run (config serving.shared) ---------------------------------------------

class SharedServer:
    """A lease on the one vLLM server that every job of a local run shares (config ``serving.shared``).

    Rules it keeps:

    * One holder at a time: the lease is an exclusive ``flock`` on ``<state_dir>/lease.lock``, held from
      :meth:`start` to :meth:`stop` (a waiting job logs who holds it). The kernel drops it when a holder dies, so a
      killed job never wedges the next one.
    * ``<state_dir>/server.json`` records the server (pid = process group, its start time, port, log, and the key it
      was started with). A lease reuses it only when that process is alive, was started with the same key
      (`key`: interpreter, device, context length, served name, flags, environment, the worker extension's code, and
      the model's `model_identity`) and answers ``/health`` with our served name; it then loads the requested
      checkpoint's weights in place (`VLLMServer.reload_weights`: pause, reload, prefix cache reset, resume), every
      time, since a rerun may have rewritten a checkpoint under the same path. Otherwise the old server is stopped
      (the reason logged) and a new one started, detached from the job (no parent-death kill), and recorded as soon
      as it exists, so a holder killed during the start leaves a server the next lease can find and stop.
    * A server never outlives idleness: its supervisor stops it once the lock is free and untouched for ``idle_s``
      (a lease touches it when it starts and ends); the workflow's onsuccess/onerror stop it at once
      (`stop_shared_server`, also ``predict serve --stop-shared``).
    * Outputs never depend on the server being fresh or reused: every pipeline server serves under `SERVED_NAME`,
      and a reload gives bit-identical weights (tests/test_shared_server.py compares the rows).
    """

    DEFAULT_IDLE_S: float = SharedServerSettings().idle_s
    LOCK, STATE, HOLDER = "lease.lock", "server.json", "holder.json"

    def __init__(self, model: Path | str, *, idle_s: float = DEFAULT_IDLE_S, state_dir: Path | None = None,
                 log_path: Path | None = None, **server_kw: Any) -> None:
        server_kw.setdefault("served_model_name", SERVED_NAME)
        self.model = model
        self.job_log = Path(log_path) if log_path is not None else None  # the job's own note of what it was served
        self.idle_s = idle_s
        cache_dir = Path(server_kw.get("cache_dir") or default_cache_dir())
        self.state_dir = Path(state_dir) if state_dir is not None else cache_dir / "serving"
        server_kw.update(worker_extension=True, kill_on_parent_death=False, port=None)
        # The server a lease starts, or a handle on the one it found (same settings, its port and log).
        self.server = VLLMServer(model, idle_lock=self.state_dir / self.LOCK, idle_s=idle_s, **server_kw)
        self._lock_fd: int | None = None
        self.started = False  # this lease started the server (else it reused one)

    # -- what a client needs (as VLLMServer) --------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def model_name(self) -> str:
        return self.server.model_name

    @property
    def log_path(self) -> Path | None:
        return self.server.log_path

    @property
    def pid(self) -> int | None:
        state = read_json(self.state_dir / self.STATE)
        return int(state["pid"]) if state else None

    def reload_weights(self, weights_dir: Path | str, *, version: str | None = None, drain: bool = True) -> list[str]:
        return self.server.reload_weights(weights_dir, version=version, drain=drain)

    def push_weights(self, manifest: Mapping[str, Any], *, version: str | None = None, drain: bool = True) -> list[str]:
        return self.server.push_weights(manifest, version=version, drain=drain)

    @property
    def sleep_mode(self) -> bool:
        return self.server.sleep_mode

    def sleep(self, level: int = 2) -> bool:
        return self.server.sleep(level)

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        return self.server.wake_up(tags)

    # -- the key ------------------------------------------------------------------------------------------------
    def key(self) -> dict[str, Any]:
        """Everything a started server cannot change: two leases with equal keys may share it."""
        s = self.server
        ext = Path(__file__).with_name("worker_ext.py").read_bytes()
        key = {"python": os.path.abspath(shutil.which(s.python) or s.python), "device": s.device,
                "max_model_len": s.max_model_len, "served_model_name": s.served_model_name,
                "enable_scale_out": s.enable_scale_out, "generate_token_compat": s.generate_token_compat,
                "enforce_eager": s.enforce_eager, "kv_cache_gib": s.kv_cache_gib, "offline": s.offline,
                "extra_args": s.extra_args, "env": s.env, "cpus": cpu_list(), "cache_dir": str(s.cache_dir),
                "worker_extension": hashlib.sha256(ext).hexdigest(),
                "model": model_identity(s.model, self.state_dir)}
        return json.loads(json.dumps(key))  # as server.json holds it, so the two compare equal

    # -- the lease ----------------------------------------------------------------------------------------------
    def _write(self, name: str, data: Mapping[str, Any]) -> None:
        write_text(json.dumps(data, indent=1, default=str), self.state_dir / name)

    def _note(self, text: str) -> None:
        log.info("%s", text)
        if self.job_log is not None:
            self.job_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.job_log, "a") as f:
                f.write(f"# {time.strftime('%F %T')} {text}\n")

    def _acquire(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / self.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not lock_fd(fd, wait_s=0):
                holder = read_json(self.state_dir / self.HOLDER) or {}
                log.info("waiting for the shared vLLM server (%s), leased by %s", self.state_dir, holder)
                lock_fd(fd)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd
        os.utime(self.state_dir / self.LOCK)  # the idle clock restarts
        self._write(self.HOLDER, {"pid": os.getpid(), "since": time.strftime("%FT%T%z"), "model": str(self.model)})

    def _release(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.utime(self.state_dir / self.LOCK)  # idle from now
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def _reusable(self, state: Mapping[str, Any] | None, key: Mapping[str, Any]) -> str:
        """'' when the recorded server can serve this lease, else why not."""
        if not state:
            return "no server recorded"
        if process_start(int(state["pid"])) != state.get("start_time"):
            return f"server pid {state['pid']} is gone"
        if state.get("key") != key:
            old = state.get("key") or {}
            differ = sorted(k for k in {*old, *key} if old.get(k) != key.get(k))
            return f"server pid {state['pid']} was started with another {', '.join(differ)}"
        try:
            models = _served_models(f"http://127.0.0.1:{state['port']}")
        except (OSError, json.JSONDecodeError) as e:
            return f"server pid {state['pid']} does not answer ({e})"
        if models is None or key["served_model_name"] not in [m.get("id") for m in models.get("data", [])]:
            return f"server pid {state['pid']} is not healthy or serves another name"
        return ""

    def start(self) -> SharedServer:
        """Take the lease (waiting for the holder), then reuse the recorded server with `model`'s weights loaded in
        place, or start one. On failure the lease is released and no half-started server is left."""
        if self._lock_fd is not None:
            raise VLLMServerError(f"{self!r}: the lease is already held")
        self._acquire()
        try:
            key = self.key()
            state = read_json(self.state_dir / self.STATE)
            why = self._reusable(state, key)
            if not why:
                assert state is not None
                self.server.port, self.server.log_path = int(state["port"]), Path(state["log"])
                t0 = time.perf_counter()
                try:
                    self.server.wake_up()  # asleep between leases (GPU sleep mode): the weights come next
                    if Path(self.model).expanduser().is_dir():
                        self.server.reload_weights(self.model, version=str(self.model))
                except (VLLMServerError, OSError) as e:  # a server that cannot reload is replaced, not reused
                    why = f"server pid {state['pid']} failed to load the weights in place ({e})"
                else:
                    reload_s = time.perf_counter() - t0
                    self._write(self.STATE, {**state, "model": str(self.model), "leases": int(state.get("leases", 1)) + 1})
                    self._note(f"shared vLLM server pid {state['pid']} at {self.base_url} (log {state['log']}): "
                               f"reused, weights of {self.model} loaded in place in {reload_s:.2f} s")
                    return self
            if state and process_start(int(state["pid"])) == state.get("start_time"):
                self._note(f"stopping the shared vLLM server: {why}")
                stop_group(int(state["pid"]))
            self._start_new(key)
            self._note(f"shared vLLM server pid {self.server.pid} at {self.base_url} (log {self.log_path}): started "
                       f"on {self.model} in {self.server.startup_s:.1f} s ({why})")
            return self
        except BaseException:
            self._release()
            raise

    def _start_new(self, key: Mapping[str, Any]) -> None:
        def record(server: VLLMServer) -> None:
            assert server.pid is not None and server.log_path is not None
            self._write(self.STATE, {"pid": server.pid, "start_time": process_start(server.pid), "port": server.port,
                                     "log": str(server.log_path), "key": key, "model": str(self.model),
                                     "started": time.strftime("%FT%T%z"), "leases": 1})

        self.server.port = free_port()
        self.server.start(on_spawn=record)  # its log: a fresh one in the cache's logs/
        self.started = True
        with _LIVE_LOCK:  # it outlives this job: never stopped by our atexit or signal handlers
            _LIVE.discard(self.server)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Release the lease; the server keeps running for the next lease (or until idle). A GPU server with sleep
        mode sleeps first (level 2: every lease loads its own weights anyway), so the GPU is free for the jobs
        between leases (SFT, statistics) while the server waits."""
        if self._lock_fd is not None and self.sleep_mode:
            try:
                self.server.sleep(2)
            except (OSError, VLLMServerError) as e:  # a server that cannot sleep is replaced by the next lease
                log.warning("the shared vLLM server did not go to sleep: %s", e)
        self._release()

    def __enter__(self) -> SharedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SharedServer(model={str(self.model)!r}, state_dir={str(self.state_dir)!r}, url={self.base_url!r})"


def stop_shared_server(cache_dir: Path | None = None, *, wait_s: float = 60.0) -> str:
    """Stop the shared server of this checkout's cache (`SharedServer`) once no lease holds it (waiting up to
    `wait_s`, then stopping it anyway); returns what was done, for the caller's log."""
    state_dir = Path(cache_dir or default_cache_dir()) / "serving"
    if not (state_dir / SharedServer.STATE).is_file():
        return "no shared vLLM server recorded"
    fd = os.open(state_dir / SharedServer.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not lock_fd(fd, wait_s):
            log.warning("the shared vLLM server is still leased after %.0f s; stopping it anyway", wait_s)
        state = read_json(state_dir / SharedServer.STATE)
        if state is None:
            return "no shared vLLM server recorded"
        (state_dir / SharedServer.STATE).unlink(missing_ok=True)
        pid = int(state["pid"])
        if process_start(pid) != state.get("start_time"):
            return f"shared vLLM server pid {pid} had already stopped"
        stop_group(pid)
        return f"stopped the shared vLLM server pid {pid} ({state.get('leases', 1)} lease(s))"
    finally:
        os.close(fd)



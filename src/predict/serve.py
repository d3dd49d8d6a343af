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

CPU defaults are the fastest start measured on the 2-core CPU machines (vLLM's CPU build): ``--enforce-eager``
(torch.compile start-up costs ~60-80 s and recompiles for every new checkpoint path),
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine in the API process: ~25 s to healthy instead of ~38 s),
``VLLM_CPU_KVCACHE_SPACE=1`` GiB, OpenMP bound to all cores this process may use with none reserved.
``--enable-scale-out`` is on by default so ``/inference/v1/generate`` (token ids in/out) works, with
a small ASGI middleware (``GenerateTokenCompat`` in :mod:`predict.vllm_worker_ext`) that adds the
``"token": "token_id:<id>"`` field the verifiers 0.4 train client requires in its logprobs.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Literal

__all__ = [
    "GENERATE_COMPAT_MIDDLEWARE",
    "WORKER_EXT_CLS",
    "VLLMServer",
    "VLLMServerError",
    "default_cache_dir",
    "default_python",
    "group_pids",
    "serve_main",
]

#: Module name under which vllm_worker_ext.py is copied for the server's interpreter (see _worker_ext_dir).
_WORKER_EXT_MODULE = "predict_vllm_worker_ext"
WORKER_EXT_CLS = f"{_WORKER_EXT_MODULE}.RLWorkerExt"
GENERATE_COMPAT_MIDDLEWARE = f"{_WORKER_EXT_MODULE}.GenerateTokenCompat"

_REPO_ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1

# Group leader between us and vLLM: python -c _SUPERVISOR <our pid or 0> <grace s> <vLLM command...>.
# Runs under the *server's* interpreter, so stdlib only.  On SIGTERM/SIGHUP/SIGINT (ours, or PDEATHSIG)
# or when its parent changes (we died), it TERMs vLLM, waits up to <grace> s, then SIGKILLs the whole
# process group, itself included.  If vLLM exits on its own it TERMs the stragglers and exits with its code.
_SUPERVISOR = """\
import os, signal, subprocess, sys, time
parent, grace, cmd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
child = None
def down(signum=None, frame=None):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if child is not None:
        try:
            child.send_signal(signal.SIGTERM)
        except OSError:
            pass
        end = time.monotonic() + grace
        while child.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, down)
child = subprocess.Popen(cmd)
while True:
    try:
        rc = child.wait(timeout=0.5)
        break
    except subprocess.TimeoutExpired:
        if parent and os.getppid() != parent:
            down()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
try:
    os.killpg(0, signal.SIGTERM)
except OSError:
    pass
sys.exit(rc if rc >= 0 else 128 - rc)
"""


class VLLMServerError(RuntimeError):
    """The server failed to start, died, or an admin request failed."""


class _PortInUse(VLLMServerError):
    pass


def _in_repo() -> bool:
    return (_REPO_ROOT / "pyproject.toml").is_file() and (_REPO_ROOT / "src" / "predict").is_dir()


def default_cache_dir() -> Path:
    """``<repo>/.cache`` (git-ignored) in a source checkout, else ``~/.cache/predict``."""
    return _REPO_ROOT / ".cache" if _in_repo() else Path.home() / ".cache" / "predict"


def default_python(device: Literal["cpu", "gpu"] = "cpu") -> str:
    """Interpreter for the server: ``<repo>/.venv-vllm/bin/python`` on CPU when present, else ours."""
    if device == "cpu":
        cand = _REPO_ROOT / ".venv-vllm" / "bin" / "python"
        if cand.exists():
            return str(cand)
    return sys.executable


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_list() -> str:
    """CPUs this process may run on, as vLLM's VLLM_CPU_OMP_THREADS_BIND list ("0,1")."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cpus)


def group_pids(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid`` (Linux /proc scan)."""
    out: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after "(comm)": state ppid pgrp ...; comm may contain spaces/parens, so split at the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _tail(path: Path, lines: int = 40, max_bytes: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(data.splitlines()[-lines:])


def _worker_ext_dir(cache_dir: Path) -> Path:
    """A directory holding only ``predict_vllm_worker_ext.py``, for the server's PYTHONPATH.

    Why a copy instead of ``src/`` on PYTHONPATH: importing ``predict.vllm_worker_ext`` would run
    ``predict/__init__.py`` inside the vLLM env, which must never start depending on our pipeline's
    packages (verifiers, openai<3).  The copy is rewritten only when its content changed.
    """
    src = Path(__file__).with_name("vllm_worker_ext.py")
    d = cache_dir / "vllm_worker_ext"
    d.mkdir(parents=True, exist_ok=True)
    dst = d / f"{_WORKER_EXT_MODULE}.py"
    text = src.read_text()
    if not dst.exists() or dst.read_text() != text:
        tmp = d / f".{dst.name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        tmp.replace(dst)  # atomic: a concurrently starting server never imports half a file
    return d


# --- process-wide cleanup -------------------------------------------------------------------------

_LIVE: set[VLLMServer] = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it
_HANDLERS_INSTALLED = False


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


def _install_cleanup_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_stop_all)
    # SIGTERM/SIGHUP would otherwise kill us without running atexit.  Only replace the default
    # handler (never someone else's), and only from the main thread (signal.signal requires it).
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _on_fatal_signal)


def _pdeathsig_preexec(parent_pid: int) -> Any:
    """preexec_fn for Popen: SIGTERM the supervisor when our (creating) thread dies."""
    libc = ctypes.CDLL(None, use_errno=True)  # resolved before fork: nothing is loaded in the child
    prctl = libc.prctl

    def _fn() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # the supervisor turns it into a group kill
        if os.getppid() != parent_pid:  # parent died between fork and prctl
            os._exit(1)

    return _fn


# --- the server -----------------------------------------------------------------------------------


class VLLMServer:
    """A vLLM OpenAI server for one checkpoint, as a subprocess.  Use as a context manager::

        with VLLMServer(model_dir) as srv:
            client = OpenAI(base_url=srv.base_url, api_key="x")
            ... client.chat.completions.create(model=srv.model_name, ...)

    Arguments:
        model: checkpoint folder (or a Hub id already in the local HF cache; the server runs offline).
        python: interpreter with vLLM installed (config ``serving.python``); default
            :func:`default_python`.
        device: "cpu" adds the vLLM-CPU fast-start flags/env; "gpu" adds none of them.
        port: fixed port, or None for a free one.
        served_model_name: the ``model`` name clients send; default the model string as given to vLLM.
        max_model_len: ``--max-model-len``.
        extra_args: appended to the command line (after ours, so they can override).
        env: extra environment for the server (applied last).
        log_path: server stdout+stderr; default ``<cache>/logs/vllm-<time>-<port>.log``.
        startup_timeout_s: how long :meth:`start` waits for health.
        enable_scale_out: ``--enable-scale-out`` (``/inference/v1/generate`` with token ids).
        generate_token_compat: with scale-out, add the ``GenerateTokenCompat`` middleware so the
            verifiers/renderers train client accepts ``/inference/v1/generate`` logprobs.
        worker_extension: load :mod:`predict.vllm_worker_ext` (``VLLM_SERVER_DEV_MODE=1``) so that
            :meth:`reload_weights` can swap weights in place.
        enforce_eager: default True on CPU, False on GPU.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` on CPU.
        offline: set ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` (no machine here reaches the Hub).
        cache_dir: holds ``VLLM_CACHE_ROOT`` (``<cache>/vllm``), logs and the worker-extension copy.
        kill_on_parent_death: the supervisor takes the server group down when this process dies:
            PR_SET_PDEATHSIG (only when :meth:`start` runs on the main thread, because it fires when
            the *creating thread* exits) plus a parent-pid check every 0.5 s (any thread).
        stop_grace_s: how long the supervisor lets vLLM shut down before SIGKILL on parent death.
    """

    @classmethod
    def from_serving(cls, model: Path | str, serving: Mapping[str, Any], **kw: Any) -> VLLMServer:
        """A server for `model` as the config's `serving` section sets it up (interpreter, device, context length,
        start-up timeout); `kw` adds or overrides the rest (served name, worker extension, log, extra args)."""
        settings = {"python": serving.get("python"), "device": serving["device"],
                    "max_model_len": serving.get("max_model_len", 4096),
                    "startup_timeout_s": serving.get("startup_timeout_s", 300)}  # fmt: skip
        return cls(model, **{**settings, **kw})

    def __init__(
        self,
        model: Path | str,
        *,
        python: str | None = None,
        device: Literal["cpu", "gpu"] = "cpu",
        port: int | None = None,
        served_model_name: str | None = None,
        max_model_len: int = 4096,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = 300.0,
        enable_scale_out: bool = True,
        generate_token_compat: bool = True,
        worker_extension: bool = False,
        enforce_eager: bool | None = None,
        kv_cache_gib: float = 1,
        offline: bool = True,
        cache_dir: Path | None = None,
        kill_on_parent_death: bool = True,
        stop_grace_s: float = 5.0,
    ) -> None:
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', not {device!r}")
        self.model = model
        self.device = device
        self.python = python or default_python(device)
        self._auto_port = port is None
        self.port = port if port is not None else _free_port()
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
        self._proc: Any = None  # subprocess.Popen[bytes]
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

    # -- command line and environment -------------------------------------------------------------

    def _model_arg(self) -> str:
        p = Path(self.model).expanduser()
        # A local folder is passed absolute (the server may run with another cwd); a Hub id as is.
        return str(p.resolve()) if p.exists() else str(self.model)

    def _needs_ext_module(self) -> bool:
        return self.worker_extension or (self.enable_scale_out and self.generate_token_compat)

    def launch_command(self) -> list[str]:
        """What is actually spawned: the supervisor, which runs :meth:`command`."""
        parent = os.getpid() if self.kill_on_parent_death else 0
        return [self.python, "-c", _SUPERVISOR, str(parent), f"{self.stop_grace_s:g}", *self.command()]

    def command(self) -> list[str]:
        """The vLLM server command line (run by the supervisor)."""
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self._model_arg()]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.enable_scale_out:
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
        # Our own interpreter's PYTHONPATH/PYTHONHOME/VIRTUAL_ENV must not leak into the other venv.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        bin_dir = Path(self.python).parent
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # tools vLLM may spawn from its venv
        if (bin_dir.parent / "pyvenv.cfg").is_file():
            env["VIRTUAL_ENV"] = str(bin_dir.parent)
        env["PYTHONUNBUFFERED"] = "1"  # log lines appear as they happen (start-up diagnosis)
        env["VLLM_CACHE_ROOT"] = str(self.cache_dir / "vllm")
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        if self.offline:
            env["HF_HUB_OFFLINE"] = "1"
            env["TRANSFORMERS_OFFLINE"] = "1"
        if self.device == "cpu":
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gib:g}"
            env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_list()
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        if self.worker_extension:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # enables /collective_rpc and /reset_prefix_cache
        if self._needs_ext_module():
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

    def start(self) -> VLLMServer:
        """Spawn the server and wait until healthy.  On any failure nothing is left running."""
        if self._proc is not None:
            raise VLLMServerError(f"server already started (pid {self._proc.pid})")
        self._check_inputs()
        _install_cleanup_handlers()
        attempts = 3 if self._auto_port else 1
        for attempt in range(attempts):
            t0 = time.perf_counter()
            self._spawn()
            try:
                self.wait_healthy()
            except _PortInUse:
                self._teardown()
                if attempt + 1 == attempts:
                    raise
                self.port = _free_port()  # someone took our free port between pick and bind
                continue
            except BaseException:  # includes KeyboardInterrupt: never leave a half-started server
                self._teardown()
                raise
            self.startup_s = time.perf_counter() - t0
            return self
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        import subprocess

        if self._log_path_arg is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.log_path = self.cache_dir / "logs" / f"vllm-{stamp}-{self.port}.log"
        assert self.log_path is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd, env = self.launch_command(), self.environment(prepare=True)
        preexec = None
        if self.kill_on_parent_death and sys.platform.startswith("linux"):
            if threading.current_thread() is threading.main_thread():
                preexec = _pdeathsig_preexec(os.getpid())
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

    def wait_healthy(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Block until ``/health`` is 200 and ``/v1/models`` lists our model; returns the models answer.

        Raises :class:`VLLMServerError` (with the log tail) if the process exits or time runs out.
        Does not stop the server itself (``start`` does that on failure).
        """
        if self._proc is None:
            raise VLLMServerError("server not started")
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        while True:
            code = self._leader_exit_code()
            if code is not None:
                raise self._fail(f"vLLM server for {self.model} exited with code {code} before becoming healthy")
            try:
                with urllib.request.urlopen(self.root_url + "/health", timeout=5) as r:
                    healthy = r.status == 200
                if healthy:
                    models = self._http("GET", "/v1/models", timeout=10)
                    ids = [m.get("id") for m in models.get("data", [])]
                    if self.model_name not in ids:
                        raise self._fail(f"server is up but serves {ids}, not {self.model_name!r}")
                    self.models_info = models
                    return models
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, json.JSONDecodeError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise self._fail(f"vLLM server for {self.model} not healthy after {self.startup_timeout_s:.0f} s")
            time.sleep(0.25)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, wait up to ``timeout_s``, SIGKILL the group; idempotent."""
        self._teardown(timeout_s)

    def _teardown(self, timeout_s: float = 15.0) -> None:
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        try:
            if self._leader_exit_code() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                while self._leader_exit_code() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            # The leader is dead but unreaped (zombie), so pgid cannot have been reused: SIGKILL
            # whatever is left in the group (children of the engine, or everything on timeout).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait()
            deadline = time.monotonic() + 5.0
            while group_pids(pgid) and time.monotonic() < deadline:  # orphans are reaped by init
                time.sleep(0.05)
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

    # -- weight reload (needs worker_extension=True) -----------------------------------------------

    def reload_weights(self, weights_dir: Path | str, *, version: str | None = None) -> list[str]:
        """Load ``weights_dir``'s safetensors into the running server in place (same architecture).

        pause (drain in-flight requests) -> worker ``reload_from_path`` -> reset prefix cache (cached
        KV blocks were computed with the old weights) -> resume; optionally tag ``version``.
        Returns the workers' messages.
        """
        if not self.worker_extension:
            raise VLLMServerError("reload_weights needs VLLMServer(..., worker_extension=True)")
        path = str(Path(weights_dir).expanduser().resolve())
        try:
            self._http("POST", "/pause?mode=wait", timeout=300)
            try:
                res = self._http("POST", "/collective_rpc", {"method": "reload_from_path", "args": [path]}, timeout=600)
                reset = self._http("POST", "/reset_prefix_cache", timeout=60)
                if isinstance(reset, dict) and reset.get("success") is False:
                    raise VLLMServerError(f"reset_prefix_cache failed: {reset}")
            finally:
                self._http("POST", "/resume", timeout=60)
            if version is not None:
                self._http("POST", "/update_weight_version", {"new_version": version}, timeout=60)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            raise self._fail(f"weight reload from {path} failed: HTTP {e.code} {detail}") from e
        return list((res or {}).get("results", []))


def serve_main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until Ctrl-C/SIGTERM (for the ``predict`` CLI to wire)."""
    import argparse

    ap = argparse.ArgumentParser(prog="predict serve", description="Serve a checkpoint with vLLM on 127.0.0.1.")
    ap.add_argument("model")
    ap.add_argument("--python", default=None, help="interpreter with vLLM (config serving.python)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--log-path", type=Path, default=None)
    ap.add_argument("--worker-extension", action="store_true")
    ap.add_argument("extra", nargs="*", help="extra vLLM arguments (after --)")
    a = ap.parse_args(argv)
    srv = VLLMServer(
        a.model,
        python=a.python,
        device=a.device,
        port=a.port,
        served_model_name=a.served_model_name,
        max_model_len=a.max_model_len,
        log_path=a.log_path,
        worker_extension=a.worker_extension,
        extra_args=a.extra,
    )
    with srv:
        print(
            f"serving {srv.model_name} at {srv.base_url} (pid {srv.pid}, log {srv.log_path}, "
            f"healthy in {srv.startup_s:.1f} s)",
            flush=True,
        )
        try:
            while srv.running:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(serve_main())

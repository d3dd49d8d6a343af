"""The sandboxed verifier: run a candidate ``solution.py`` against an MBPP task's tests and say what verifiably happened.

Each check forks a fresh child (from a pre-warmed fork server for :class:`Verifier`, from the calling process for
:func:`check_once`). The child isolates itself, compiles and executes the solution, the task's ``test_setup_code``
and every ``assert`` of ``test_list``, and reports a structured verdict on a dedicated pipe. The supervising parent
enforces the wall clock, drains stdout/stderr, reaps the child and turns the evidence into an
:class:`~predict.outcomes.Outcome`. Classification never greps stderr (except :func:`label_original`, which exists to
reproduce the study's original heuristic).

Isolation layers (``isolation_report()`` says which were active on this machine):

- wall clock: the parent kills the child's whole process group (``setsid`` + ``killpg``) at ``timeout_s``.
- RLIMIT_CPU: a CPU-time backstop (SIGXCPU, then SIGKILL) one second past the timeout, reported as TIMEOUT.
- RLIMIT_AS: ``memory_mb`` of address space on top of what the forked interpreter already maps (MemoryError).
- RLIMIT_NPROC = 0 (effective once unprivileged): no fork, no threads, so a fork bomb fails with an error.
- RLIMIT_FSIZE (16 MiB) with SIGXFSZ ignored, so oversized writes raise instead of killing; RLIMIT_CORE = 0.
- PR_SET_PDEATHSIG: the child is SIGKILLed if its supervisor dies, so a killed pool leaves no orphans.
- PR_SET_DUMPABLE = 0: /proc/self/environ and /proc/self/mem are unreadable, even to the child's own uid.
- network namespace: no interface is up, so no network at all (not even 127.0.0.1). A fork server enters one once
  at start and all its children share it (the server only talks over pipes); check_once makes one per child.
- mount namespace: ``/`` made rprivate and fresh size-capped tmpfs over /tmp, /var/tmp and /dev/shm; cwd is a
  directory in that tmpfs, so nothing written to "/tmp" reaches the host. A fork server sets this up once and wipes
  the three tmpfs after every check (checks never see each other's files); check_once mounts per child.
- hidden home: if Python lives under a directory nobody cannot enter (pyenv in /root, mode 700), that directory is
  covered by an empty tmpfs in the private mount namespace and only the Python directories are bind-mounted back,
  read-only, so the unprivileged child can import the stdlib and sees nothing else of root's home.
- privileges: when root, drop to nobody (setgroups([]), setgid/setuid 65534): root files stay read-only, other
  processes (the supervisor included) cannot be signalled, RLIMIT_NPROC applies. When not root, an unprivileged
  user namespace is tried instead (and everything degrades gracefully when it is unavailable).
- file descriptors: stdin is /dev/null, stdout/stderr are pipes whose last 64 KiB are kept, every other inherited
  descriptor (the fork server's protocol pipes included) is closed; only the verdict pipe stays open.
- environment: cleared to PATH/LANG/HOME=sandbox, so no inherited secrets (the server itself starts scrubbed too).
- audit hook (``sys.addaudithook``, a second layer): refuses writes/removes/renames/mkdirs outside the sandbox dir,
  process creation and exec, signals to other processes, socket connect/bind, ctypes, settrace/setprofile and the gc
  introspection that would let code reach the harness's memory.
- harness integrity: everything the harness needs (exec, compile, the exception classes, traceback formatting, the
  verdict writer, os._exit) is bound to local names before user code runs, so patching builtins, ``sys.exit``,
  ``sys.excepthook`` or ``print`` cannot change the verdict. ``assert`` raises the C-level AssertionError regardless
  of what ``builtins.AssertionError`` is rebound to.
- verdict channel: PASS is only ever a positive message on a separate pipe (fd 3) carrying a per-check random nonce
  that the solution never sees through normal means; printing "PASS", writing to every fd, ``os._exit(0)``,
  ``sys.exit(0)`` or an atexit handler cannot produce it, and more than one verdict message is treated as tampering
  (OTHER). The same channel says which test started last, so a child that dies silently still has a failed_test.

Known limits (it is a research sandbox, not a security boundary against an adversary targeting *this* harness):
code that walks ``frame.f_back`` into the harness could read the nonce and forge a verdict; a returned object whose
``__eq__`` always says True passes an ``assert f(x) == y`` exactly as it would under plain Python; /proc still
lists host processes (no PID namespace); the audit hook resolves relative paths against the cwd, so ``dir_fd``
tricks slip past it (the kernel layers still hold). Threads cannot be started (RLIMIT_NPROC), which no MBPP gold
solution needs. String hashing is fixed (PYTHONHASHSEED=0) in fork servers, so set iteration order is reproducible.

Classification (structured labels):

- solution does not compile (SyntaxError/IndentationError/TabError in ``solution.py``) -> SYNTAX_ERROR.
- ``test_setup_code`` or a test statement does not compile -> OTHER (the *task* is broken, not the solution).
- an exception while executing the solution module or ``test_setup_code`` -> RUNTIME_ERROR.
- an AssertionError whose innermost frame is the test's own code (``<test i>`` / ``<setup>``) -> ASSERTION_FAILURE;
  an AssertionError raised inside the solution (or a library it calls) and any other exception, including
  SystemExit/KeyboardInterrupt -> RUNTIME_ERROR.
- killed at the wall clock, by SIGXCPU, or by SIGKILL after using up the CPU limit -> TIMEOUT.
- death by any other signal (SIGSEGV from runaway recursion, SIGABRT, ...) -> RUNTIME_ERROR: like an uncaught
  exception, it is the solution crashing, and ``python solution.py`` would also exit non-zero.
- the child exits without a verdict (``os._exit``, closed verdict pipe) or sends several -> OTHER.

The solution runs as ``__main__`` with ``__file__ == "solution.py"``, like ``python solution.py`` in the study.
On errors the child writes the Python-style traceback ``python`` would print to its stderr and exits with the code
``python`` would use (1, or the SystemExit code), so ``outcome_labels="original"`` reproduces the original labels.
"""

from __future__ import annotations

import builtins
import ctypes
import fcntl
import gc
import io
import json
import linecache
import math
import os
import queue
import resource
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from predict.outcomes import Outcome

__all__ = ["Verdict", "Verifier", "check_once", "isolation_report", "label_original"]

OutcomeLabels = Literal["structured", "original"]

CAPTURE_BYTES = 64 * 1024  # stdout/stderr tails kept per check
FSIZE_BYTES = 16 * 1024 * 1024  # largest file a solution may write
TMPFS_OPTIONS = b"size=64m,nr_inodes=4096,mode=1777"
NOBODY = 65534
DETAIL_CHARS = 300

# Stdlib modules MBPP gold solutions (and the harness) import: loaded once in the fork server so forks are warm.
PREIMPORTS = (
    "re", "math", "cmath", "collections", "collections.abc", "heapq", "itertools", "functools", "bisect",
    "operator", "string", "array", "copy", "datetime", "decimal", "fractions", "statistics", "random",
    "struct", "typing", "dataclasses", "enum", "textwrap", "calendar", "time", "json", "numbers", "unicodedata",
)

_THIS_FILE = __file__
_VERDICT_FD = 3  # the child's verdict pipe, after its descriptors are rearranged
_TEST_FILE = "<test {}>"
_SETUP_FILE = "<setup>"
_SOLUTION_FILE = "solution.py"

# --------------------------------------------------------------------------------------------------------------
# Public result type and the original heuristic
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What one check verifiably produced."""

    outcome: Outcome
    detail: str  # short, e.g. "ZeroDivisionError: division by zero", "test 2 failed: assert f(3) == 9"
    failed_test: int | None  # 0-based index into test_list of the failing test, else None
    duration_s: float
    stdout: str  # capped tail
    stderr: str  # capped tail; a Python-style traceback on errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "detail": self.detail,
            "failed_test": self.failed_test,
            "duration_s": self.duration_s,
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


def label_original(returncode: int | None, stderr: str, timed_out: bool) -> Outcome:
    """The study's original stderr heuristic, kept so its numbers can be reproduced (``outcome_labels: original``).

    It mislabels an AssertionError raised inside the solution's own code as ASSERTION_FAILURE, and believes any
    exit code 0 (``sys.exit(0)``, ``os._exit(0)`` in a test) is a PASS.
    """
    if timed_out:
        return Outcome.TIMEOUT
    if returncode == 0:
        return Outcome.PASS
    if "SyntaxError" in stderr or "IndentationError" in stderr:
        return Outcome.SYNTAX_ERROR
    if "AssertionError" in stderr:
        return Outcome.ASSERTION_FAILURE
    return Outcome.RUNTIME_ERROR


# --------------------------------------------------------------------------------------------------------------
# Requests and raw evidence (what the supervisor saw), shared by the server and check_once
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    solution: str
    tests: tuple[str, ...]
    setup: str
    timeout_s: float
    memory_mb: int
    probe: bool = False  # isolation_report(): set up, report the layers, run nothing

    def to_json(self) -> dict[str, Any]:
        return {"solution": self.solution, "tests": list(self.tests), "setup": self.setup,
                "timeout_s": self.timeout_s, "memory_mb": self.memory_mb, "probe": self.probe}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> _Request:
        return cls(d["solution"], tuple(d["tests"]), d["setup"], float(d["timeout_s"]), int(d["memory_mb"]),
                   bool(d.get("probe", False)))


@dataclass(frozen=True)
class _Raw:
    verdict: tuple[str, int, str] | None  # (outcome, failed_test or -1, detail) from the harness, nonce-checked
    tampered: bool  # several verdict messages with the right nonce
    layers: dict[str, bool]
    last_test: int  # the test running when the child stopped talking (-1: none started)
    returncode: int | None  # Popen convention: negative signal number when killed
    timed_out: bool  # the wall clock fired
    cpu_s: float
    cpu_limit_s: int
    stdout: str
    stderr: str
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> _Raw:
        v = d["verdict"]
        return cls(**{**d, "verdict": None if v is None else (v[0], int(v[1]), v[2])})


def _cpu_limit(timeout_s: float) -> int:
    return int(math.ceil(timeout_s)) + 1


def _to_verdict(raw: _Raw, timeout_s: float, labels: str) -> Verdict:
    """Turn the supervisor's evidence into a Verdict; the harness's own message wins whenever there is one."""
    failed: int | None = raw.last_test if raw.last_test >= 0 else None  # where a silent death happened
    sig = -raw.returncode if raw.returncode is not None and raw.returncode < 0 else None
    if raw.tampered:
        outcome, failed, detail = Outcome.OTHER, None, "several verdict messages: the verdict channel was tampered with"
    elif raw.verdict is not None:
        outcome, failed, detail = Outcome(raw.verdict[0]), (raw.verdict[1] if raw.verdict[1] >= 0 else None), \
            raw.verdict[2]
    elif raw.timed_out:
        outcome, detail = Outcome.TIMEOUT, f"timed out after {timeout_s:g}s"
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and raw.cpu_s >= raw.cpu_limit_s - 0.05):
        outcome, detail = Outcome.TIMEOUT, f"CPU time limit ({raw.cpu_limit_s}s) exceeded"
    elif sig is not None:
        outcome, detail = Outcome.RUNTIME_ERROR, f"killed by {_signame(sig)}"
    else:
        outcome, detail = Outcome.OTHER, f"exited with code {raw.returncode} without a verdict"
    if labels == "original":
        outcome = label_original(raw.returncode, raw.stderr, raw.timed_out or outcome is Outcome.TIMEOUT)
    return Verdict(outcome, detail, failed, raw.duration_s, raw.stdout, raw.stderr)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# --------------------------------------------------------------------------------------------------------------
# Supervisor: fork the child, enforce the wall clock, drain the pipes, reap (runs in the server or the caller)
# --------------------------------------------------------------------------------------------------------------


class _Tail:
    """Keep the last ``cap`` bytes of a stream without holding all of it."""

    def __init__(self, cap: int) -> None:
        self.cap, self.buf = cap, bytearray()

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > 2 * self.cap:  # trim lazily so huge outputs stay O(n)
            del self.buf[: len(self.buf) - self.cap]

    def text(self) -> str:
        return bytes(self.buf[-self.cap:]).decode("utf-8", "replace")


def _execute(req: _Request) -> _Raw:
    """Fork one child for ``req`` and supervise it to the end. Never raises for anything the child does."""
    _load_libc()  # once per process, before forking, so children don't pay for these
    _python_dirs()
    scratch = _Scratch()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ver_r, ver_w = os.pipe()
    nonce = secrets.token_hex(16)
    for stream in (sys.stdout, sys.stderr):  # don't let the child inherit (and re-emit) buffered parent output
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a broken parent stream must not stop the check
            pass
    exit_ = os._exit  # bound before user code can rebind os._exit: the child must never return into our caller
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: never returns, never runs the parent's cleanup or atexit
        try:
            os.close(out_r), os.close(err_r), os.close(ver_r)
            _child(req, out_w, err_w, ver_w, nonce, scratch.path)
        finally:
            exit_(70)
    os.close(out_w), os.close(err_w), os.close(ver_w)
    try:
        return _supervise(req, pid, start, out_r, err_r, ver_r, nonce)
    finally:
        scratch.cleanup()


def _supervise(req: _Request, pid: int, start: float, out_r: int, err_r: int, ver_r: int, nonce: str) -> _Raw:
    out, err, ver = _Tail(CAPTURE_BYTES), _Tail(CAPTURE_BYTES), bytearray()
    poller = select.poll()  # no kernel object to create per check, unlike epoll
    for fd in (out_r, err_r, ver_r):
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable once the child has exited
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):  # old kernel: poll waitid instead
        pidfd = None
    deadline = start + req.timeout_s
    exited, timed_out = False, False
    open_pipes = 3
    try:
        while open_pipes or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = not exited
                break
            wait_ms = math.ceil(1000 * (remaining if pidfd is not None else min(remaining, 0.01)))
            for fd, _ in poller.poll(wait_ms):
                if fd == pidfd:
                    exited = True
                    poller.unregister(fd)
                    deadline = min(deadline, time.monotonic() + 0.5)  # pipes close with it (no grandchildren)
                    continue
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    poller.unregister(fd)
                    open_pipes -= 1
                elif fd == out_r:
                    out.add(data)
                elif fd == err_r:
                    err.add(data)
                elif len(ver) < (1 << 20):  # a solution spamming the verdict pipe cannot exhaust our memory
                    ver += data
            if pidfd is None and not exited and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                exited = True
                deadline = min(deadline, time.monotonic() + 0.5)
    finally:
        # Kill the whole group even after a clean exit: nothing the child started may outlive the check.
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, status, usage = os.wait4(pid, 0)
        duration = time.monotonic() - start
        for fd in (out_r, err_r, ver_r, pidfd):
            if fd is not None:
                os.close(fd)
    verdict, tampered, layers, last_test = _parse_verdict_channel(bytes(ver), nonce)
    return _Raw(
        verdict=verdict, tampered=tampered, layers=layers, last_test=last_test,
        returncode=os.waitstatus_to_exitcode(status), timed_out=timed_out,
        cpu_s=usage.ru_utime + usage.ru_stime, cpu_limit_s=_cpu_limit(req.timeout_s),
        stdout=out.text(), stderr=err.text(), duration_s=duration,
    )


def _parse_verdict_channel(data: bytes, nonce: str) -> tuple[tuple[str, int, str] | None, bool, dict[str, bool], int]:
    """Read the child's messages: ``<nonce> L <layers json>`` (before user code), ``<nonce> T <i>`` (test i starts)
    and ``<nonce> V <outcome> <test> <hex detail>``. Returns (verdict, tampered, layers, last test started or -1)."""
    verdicts: list[tuple[str, int, str]] = []
    layers: dict[str, bool] = {}
    last_test = -1
    for line in data.decode("ascii", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[0] != nonce:  # without the nonce it is not ours: ignore it
            continue
        try:
            if parts[1] == "T":
                last_test = int(parts[2])
            elif parts[1] == "L" and not layers:
                layers = {str(k): bool(v) for k, v in json.loads(parts[2]).items()}
            elif parts[1] == "V":
                outcome, test, detail = parts[2].split(" ", 2)
                verdicts.append((Outcome(outcome).value, int(test), bytes.fromhex(detail).decode("utf-8", "replace")))
        except (ValueError, AttributeError):
            continue
    if len(verdicts) > 1:
        return None, True, layers, last_test
    return (verdicts[0] if verdicts else None), False, layers, last_test


def _rmtree_quiet(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------------
# Child: isolate, then run the harness (never returns)
# --------------------------------------------------------------------------------------------------------------

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000, \
    0x40000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
_libc: Any = None
_INHERITED_NS: set[str] = set()  # namespaces this process (a fork server) already entered for all its children
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable places that get a private tmpfs
_SANDBOX_IN_TMPFS = "/tmp/sandbox"


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)  # the interpreter already links libc: no ldconfig lookup
        except OSError:
            _libc = False
    return _libc


def _enter_server_namespaces() -> None:
    """Fork server as root: enter private network and mount namespaces once; every child inherits them for free.

    Creating namespaces and tearing them down costs ~1 ms per fork. The server only talks over pipes, so it needs no
    network; its private tmpfs /tmp, /var/tmp and /dev/shm are wiped after every check (see _Scratch), so checks
    still cannot see each other's files, and nothing reaches the host.
    """
    libc = _load_libc()
    if os.geteuid() != 0 or not libc:
        return
    net_before, mnt_before = _ns_id("net"), _ns_id("mnt")
    if net_before is not None and libc.unshare(_CLONE_NEWNET) == 0 and _ns_id("net") != net_before:
        _INHERITED_NS.add("net")
    if mnt_before is not None and libc.unshare(_CLONE_NEWNS) == 0 and _ns_id("mnt") != mnt_before \
            and _mount_private_tmp(libc):
        _INHERITED_NS.add("mnt")


def _mount_private_tmp(libc: Any) -> bool:
    """Make every mount private to this (already new!) mount namespace and put fresh tmpfs over the scratch dirs."""
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    essential, _ = _python_dirs()
    if any(p == d or p.startswith(d + os.sep) for p in essential for d in _SCRATCH_DIRS):
        return False  # e.g. a venv in /tmp: a tmpfs there would hide Python itself; use a host dir instead
    ok = True
    for d in _SCRATCH_DIRS:
        if os.path.isdir(d):
            ok &= libc.mount(b"tmpfs", d.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, TMPFS_OPTIONS) == 0
    if ok and os.geteuid() == 0:
        _reexpose_python(libc)
    return ok


_PYTHON_DIRS: tuple[tuple[str, ...], tuple[str, ...]] | None = None


def _python_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(essential, all): real paths of the dirs imports read from, outermost only. Cached; computed before forking.

    Essential dirs are the interpreter's prefixes, stdlib and site-packages; "all" adds the other sys.path entries.
    """
    global _PYTHON_DIRS
    if _PYTHON_DIRS is None:
        import sysconfig

        keys = ("stdlib", "platstdlib", "purelib", "platlib")
        essential = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(sysconfig.get_paths()[k] for k in keys)}

        def outermost(paths: Iterable[str]) -> tuple[str, ...]:
            real = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)} - {os.sep}
            return tuple(sorted(d for d in real if not any(d.startswith(o + os.sep) for o in real)))

        _PYTHON_DIRS = outermost(essential), outermost([*essential, *sys.path])
    return _PYTHON_DIRS


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory on ``path`` that "other" (nobody) cannot traverse, if any."""
    parts = path.strip(os.sep).split(os.sep)
    for i in range(1, len(parts) + 1):
        d = os.sep + os.sep.join(parts[:i])
        try:
            if not os.stat(d).st_mode & 0o001:
                return d
        except OSError:
            return None
    return None


def _reexpose_python(libc: Any) -> None:
    """Let nobody import the stdlib even when Python lives under a private dir (pyenv in /root, mode 700).

    Inside our private mount namespace: cover the blocking dir (e.g. /root) with an empty tmpfs (which also hides
    root's home from solutions), then bind-mount just the Python directories back at their old paths, read-only.
    """
    by_blocker: dict[str, list[str]] = {}
    for d in _python_dirs()[1]:
        if any(d == t or d.startswith(t + os.sep) for t in _SCRATCH_DIRS):
            continue  # a script dir under /tmp: hidden by the tmpfs, like everything else there
        blocker = _blocking_ancestor(d)
        if blocker is not None and blocker != d:
            by_blocker.setdefault(blocker, []).append(d)
    for blocker, dirs in by_blocker.items():
        handles = [(d, os.open(d, os.O_PATH | os.O_DIRECTORY)) for d in dirs]  # reachable after the cover goes on
        try:
            if libc.mount(b"tmpfs", blocker.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=755") != 0:
                continue
            for d, fd in handles:
                os.makedirs(d, mode=0o755, exist_ok=True)
                if libc.mount(f"/proc/self/fd/{fd}".encode(), d.encode(), None, _MS_BIND | _MS_REC, None) == 0:
                    libc.mount(b"none", d.encode(), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None)
        finally:
            for _, fd in handles:
                os.close(fd)


def _python_reachable_by_nobody() -> bool:
    return all(_blocking_ancestor(d) is None for d in _python_dirs()[0])


class _Scratch:
    """The child's working directory, and the cleanup of everything it could write."""

    def __init__(self) -> None:
        self.shared_tmpfs = "mnt" in _INHERITED_NS  # fork server: our own tmpfs, wiped after each check
        if self.shared_tmpfs:
            self.path = _SANDBOX_IN_TMPFS
            if os.path.lexists(self.path):  # a previous cleanup was interrupted
                self.cleanup()
            os.mkdir(self.path, 0o700)
            if os.geteuid() == 0:
                os.chown(self.path, NOBODY, NOBODY)
        else:  # check_once: the child mounts its own tmpfs if it can; this host dir is the fallback
            self.path = tempfile.mkdtemp(prefix="predict-sandbox-")

    def cleanup(self) -> None:
        if not self.shared_tmpfs:
            _rmtree_quiet(self.path)
            return
        for d in _SCRATCH_DIRS:  # everything a check left in our tmpfs, including the sandbox dir itself
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    _rmtree_quiet(e.path)
                else:
                    try:
                        os.unlink(e.path)
                    except OSError:
                        pass


def _isolate(host_dir: str, memory_mb: int, timeout_s: float) -> tuple[str, dict[str, bool]]:
    """Apply every layer that this machine allows; return the sandbox dir and which layers are active."""
    libc = _load_libc()
    layers = dict.fromkeys(("setsid", "rlimits", "pdeathsig", "mount_namespace", "private_tmp", "net_namespace",
                            "user_namespace", "dropped_privileges", "env_scrubbed", "audit_hook"), False)
    os.setsid()
    layers["setsid"] = True
    root = os.geteuid() == 0
    mnt_ns_before = _ns_id("mnt")
    if libc:
        if _INHERITED_NS == {"net", "mnt"}:  # a fork server already made both private, tmpfs included
            layers["net_namespace"] = layers["mount_namespace"] = layers["private_tmp"] = True
        elif root:
            layers["mount_namespace"] = layers["net_namespace"] = libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET) == 0
        else:  # an unprivileged user namespace buys mount+net namespaces on a laptop (if the kernel allows it)
            uid, gid = os.getuid(), os.getgid()
            if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET) == 0:
                layers["user_namespace"] = layers["mount_namespace"] = layers["net_namespace"] = True
                try:
                    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                        with open(f"/proc/self/{name}", "w") as f:
                            f.write(text)
                except OSError:
                    layers["mount_namespace"] = False  # unmapped ids cannot create files on a tmpfs
            elif libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
                layers["user_namespace"] = layers["net_namespace"] = True
    sandbox = host_dir
    # Never touch mounts unless we verifiably left the host's mount namespace: mounting tmpfs over the host's /tmp
    # would be a disaster.
    if not layers["private_tmp"] and layers["mount_namespace"] and _ns_id("mnt") not in (None, mnt_ns_before) \
            and _mount_private_tmp(libc):
        sandbox = _SANDBOX_IN_TMPFS
        os.mkdir(sandbox, 0o700)
        layers["private_tmp"] = True
    if root:
        os.chown(sandbox, NOBODY, NOBODY)
    # Limits are set while still privileged; NPROC takes effect once we are nobody (root ignores it).
    cpu = _cpu_limit(timeout_s)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_BYTES, FSIZE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead of killing
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # don't run handlers a check_once caller installed
    # Drop to nobody, unless that would leave Python unable to import (root, no mount namespace, Python in /root).
    if root and (layers["private_tmp"] or _python_reachable_by_nobody()):
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        layers["dropped_privileges"] = os.geteuid() == NOBODY
    if libc:  # after setuid, which clears it; then make sure the supervisor did not already die
        ppid = os.getppid()
        layers["pdeathsig"] = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # /proc/self/{environ,mem} become unreadable, even to our uid
        if os.getppid() != ppid:
            os._exit(71)
    os.chdir(sandbox)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": sandbox})
    layers["env_scrubbed"] = True
    # Address space last: the setup above must not be the thing that runs out of memory.
    vm_bytes = _vm_size()
    limit = vm_bytes + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    layers["rlimits"] = True
    return sandbox, layers


def _ns_id(kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None


def _vm_size() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _child(req: _Request, out_w: int, err_w: int, ver_w: int, nonce: str, host_dir: str) -> NoReturn:
    """Rearrange descriptors, isolate, run the harness, and exit with the code ``python solution.py`` would."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    # Lift every fd above the target range first so dup2 cannot clobber one we still need.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (devnull, out_w, err_w, ver_w)]
    for target, fd in enumerate(high):  # 0 stdin, 1 stdout, 2 stderr, 3 verdict
        os.dup2(fd, target)
    os.closerange(_VERDICT_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    # Python-level streams on fds 0/1/2 (a check_once caller may have replaced sys.stdout, e.g. pytest capture).
    sys.stdin = sys.__stdin__ = _std_stream(sys.__stdin__, 0, "r")
    sys.stdout = sys.__stdout__ = _std_stream(sys.__stdout__, 1, "w")
    sys.stderr = sys.__stderr__ = _std_stream(sys.__stderr__, 2, "w")
    try:
        sandbox, layers = _isolate(host_dir, req.memory_mb, req.timeout_s)
    except BaseException as e:  # noqa: BLE001 - report and leave without a verdict: that is OTHER
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(72)
    _harness(req, nonce, sandbox, layers)


def _std_stream(current: Any, fd: int, mode: str) -> Any:
    """Reuse the interpreter's own stream for ``fd`` when it is intact (the fork server's case), else make one."""
    try:
        if type(current) is io.TextIOWrapper and current.fileno() == fd and not current.closed:
            return current
    except (OSError, ValueError):
        pass
    return io.TextIOWrapper(io.FileIO(fd, mode, closefd=False), encoding="utf-8", errors="backslashreplace",
                            line_buffering=fd == 2)


def _make_audit_hook(sandbox: str) -> Any:
    """The second layer: refuse host-changing operations from Python code (the kernel layers are the first).

    Everything the hook uses is bound here, so patching builtins or ``os`` cannot open it up (a hook that raises
    fails closed: the audited operation is refused).
    """
    realpath, join, fsdecode, fspath, readlink = os.path.realpath, os.path.join, os.fsdecode, os.fspath, os.readlink
    isinstance_, len_, int_, PermissionError_ = isinstance, len, int, PermissionError
    sep = os.sep
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    allowed_files = frozenset({os.devnull})
    prefix = realpath(sandbox) + sep
    denied = frozenset({
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
        "os.kill", "os.killpg", "signal.pthread_kill", "socket.connect", "socket.bind", "socket.sendto",
        "socket.sendmsg", "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.chroot", "os.setuid", "os.setgid",
    })
    path_events = {  # event -> (path index, dir_fd index) pairs that must stay inside the sandbox
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "shutil.rmtree": ((0, 1),),
        "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
        "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.truncate": ((0, None),), "os.utime": ((0, None),),
        "shutil.move": ((0, None), (1, None)), "shutil.copyfile": ((1, None),), "os.mkfifo": ((0, 2),),
        "os.mknod": ((0, 3),),
    }

    def inside(path: Any, dir_fd: Any = None) -> bool:
        if isinstance_(path, int_):  # an already-open descriptor: opening it was checked
            return True
        p = fsdecode(fspath(path))
        base = readlink(f"/proc/self/fd/{dir_fd}") if isinstance_(dir_fd, int_) and dir_fd >= 0 else None
        real = realpath(join(base, p) if base else p)
        return real in allowed_files or (real + sep).startswith(prefix)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            flags = args[2] if len_(args) > 2 else 0
            if isinstance_(flags, int_) and flags & writing and not inside(args[0]):
                raise PermissionError_(f"sandbox: writing outside the sandbox is not allowed: {args[0]!r}")
        elif event in denied or event.startswith("ctypes."):
            raise PermissionError_(f"sandbox: {event} is not allowed")
        elif event in path_events:
            for pi, fi in path_events[event]:
                if not inside(args[pi], args[fi] if fi is not None and fi < len_(args) else None):
                    raise PermissionError_(f"sandbox: {event} outside the sandbox is not allowed: {args[pi]!r}")

    return hook


def _harness(req: _Request, nonce: str, sandbox: str, layers: dict[str, bool]) -> NoReturn:
    """Compile and run solution, setup and tests; send exactly one verdict; exit like ``python`` would.

    Everything used after user code starts is bound to a local name first: user code can rebind builtins, module
    attributes (``os._exit``, ``traceback.*``) and even this module's globals (``Outcome``), but not our locals.
    Outcome names are sent as string literals for the same reason.
    """
    b = builtins
    exec_, compile_, isinstance_, issubclass_, type_, str_, int_, len_, enumerate_ = (
        b.exec, b.compile, b.isinstance, b.issubclass, b.type, b.str, b.int, b.len, b.enumerate)
    BaseException_, AssertionError_, SyntaxError_, SystemExit_, ValueError_ = (
        b.BaseException, b.AssertionError, b.SyntaxError, b.SystemExit, b.ValueError)
    get_tb = BaseException.__dict__["__traceback__"].__get__  # not a subclass's fake __traceback__ property
    write, exit_, settrace, setprofile = os.write, os._exit, sys.settrace, sys.setprofile
    format_exception, format_exception_only = traceback.format_exception, traceback.format_exception_only
    stdout, stderr = sys.stdout, sys.stderr
    verdict_fd, detail_chars, this_file, setup_file = _VERDICT_FD, DETAIL_CHARS, _THIS_FILE, _SETUP_FILE
    tests: tuple[str, ...] = req.tests
    test_files = [_TEST_FILE.format(i) for i in range(len(tests))]

    def send(kind: str, payload: str) -> None:
        try:
            write(verdict_fd, f"{nonce} {kind} {payload}\n".encode("ascii"))
        except BaseException_:  # noqa: BLE001 - a closed verdict pipe simply means no verdict (OTHER)
            pass

    def describe(e: BaseException) -> str:
        try:
            text = format_exception_only(type_(e), e)[-1].strip()
        except BaseException_:  # noqa: BLE001 - a hostile __str__ must not break the harness
            try:
                text = type_(e).__name__
            except BaseException_:  # noqa: BLE001
                text = "exception"
        return text[:detail_chars]

    def innermost_file(e: BaseException) -> str | None:
        """Filename of the frame that raised: the last entry of the traceback chain."""
        name, tb = None, get_tb(e)
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
        return name

    def print_traceback(e: BaseException, with_tb: bool = True) -> None:
        """What ``python solution.py`` would print to stderr for this uncaught exception."""
        try:
            stdout.flush()
        except BaseException_:  # noqa: BLE001
            pass
        try:
            if issubclass_(type_(e), SystemExit_):
                code = e.code
                text = "" if code is None or isinstance_(code, int_) else f"{str_(code)}\n"
            else:
                tb = get_tb(e) if with_tb else None  # a compile error: python prints just the located message
                if tb is not None and tb.tb_frame.f_code.co_filename == this_file:
                    tb = tb.tb_next  # hide our exec() call, like the interpreter hides its own machinery
                text = "".join(format_exception(type_(e), e, tb))
        except BaseException_:  # noqa: BLE001
            text = f"Traceback (most recent call last):\n{describe(e)}\n"
        try:
            stderr.flush()
            write(2, text.encode("utf-8", "backslashreplace"))
        except BaseException_:  # noqa: BLE001
            pass

    def exit_code_for(e: BaseException) -> int:
        if issubclass_(type_(e), SystemExit_):
            try:
                code = e.code
                return 0 if code is None else (code & 0xFF if isinstance_(code, int_) else 1)
            except BaseException_:  # noqa: BLE001
                return 1
        return 1

    def finish(outcome: str, failed: int | None, detail: str, code: int) -> NoReturn:
        try:
            settrace(None)
            setprofile(None)
        except BaseException_:  # noqa: BLE001 - refused by our own hook is fine
            pass
        for stream in (stdout, stderr):
            try:
                stream.flush()
            except BaseException_:  # noqa: BLE001
                pass
        try:
            hex_detail = detail[:detail_chars].encode("utf-8", "replace").hex()
        except BaseException_:  # noqa: BLE001
            hex_detail = ""
        send("V", f"{outcome} {-1 if failed is None else failed} {hex_detail}")
        exit_(code)

    send("L", "{" + ",".join(f'"{k}":{"true" if v else "false"}' for k, v in layers.items()) + "}")
    if req.probe:
        finish("PASS", None, "probe", 0)

    # Register sources so tracebacks show the offending lines, as `python solution.py` would.
    sources = [(_SOLUTION_FILE, req.solution), (_SETUP_FILE, req.setup), *zip(test_files, tests, strict=True)]
    for name, source in sources:
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    try:
        solution_code = compile_(req.solution, _SOLUTION_FILE, "exec", dont_inherit=True)
    except (SyntaxError_, ValueError_) as e:  # ValueError: source contains NUL bytes
        print_traceback(e, with_tb=False)
        finish("SYNTAX_ERROR", None, describe(e), 1)
    try:
        setup_code = compile_(req.setup, _SETUP_FILE, "exec", dont_inherit=True)
        test_codes = [compile_(t, f, "exec", dont_inherit=True) for f, t in zip(test_files, tests, strict=True)]
    except (SyntaxError_, ValueError_) as e:
        print_traceback(e, with_tb=False)
        finish("OTHER", None, f"the task's tests do not compile: {describe(e)}", 1)

    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": _SOLUTION_FILE, "__builtins__": builtins}
    sys.addaudithook(_make_audit_hook(sandbox))

    # ---- user code from here on: only locals below this line ----
    try:
        exec_(solution_code, namespace)
        exec_(setup_code, namespace)
    except BaseException_ as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from the solution are its errors too
        print_traceback(e)
        finish("RUNTIME_ERROR", None, describe(e), exit_code_for(e))
    for i, code in enumerate_(test_codes):
        send("T", str_(i))  # progress: if the child dies in this test, the supervisor still knows which one
        try:
            exec_(code, namespace)
        except BaseException_ as e:  # noqa: BLE001
            print_traceback(e)
            try:
                test_side = issubclass_(type_(e), AssertionError_) and innermost_file(e) in (test_files[i], setup_file)
            except BaseException_:  # noqa: BLE001
                test_side = False
            if test_side:
                finish("ASSERTION_FAILURE", i, f"test {i} failed: {tests[i].strip()}", 1)
            detail = describe(e)
            if issubclass_(type_(e), AssertionError_):
                detail = f"{detail} (raised inside the solution, not by test {i})"
            finish("RUNTIME_ERROR", i, detail, exit_code_for(e))
    finish("PASS", None, f"{len_(test_codes)} tests passed", 0)


# --------------------------------------------------------------------------------------------------------------
# check_once: fork straight from the caller
# --------------------------------------------------------------------------------------------------------------


def check_once(solution: str, test_list: Sequence[str], test_setup_code: str = "", *, timeout_s: float = 3.0,
               memory_mb: int = 1024, outcome_labels: str = "structured") -> Verdict:
    """Fork the child straight from the calling process (no server).

    Used by the agent program's python_test tool and the hidden shadow execution, which run in short-lived
    processes. Same child code path as :class:`Verifier`; imports the solution needs are not pre-warmed.
    """
    _check_labels(outcome_labels)
    req = _Request(solution, tuple(test_list), test_setup_code or "", float(timeout_s), int(memory_mb))
    return _to_verdict(_execute(req), req.timeout_s, outcome_labels)


_REPORT: dict[str, bool] | None = None


def isolation_report() -> dict[str, bool]:
    """Which isolation layers a child forked from this process gets on this machine (probed once, cached)."""
    global _REPORT
    if _REPORT is None:
        raw = _execute(_Request("", (), "", 5.0, 256, probe=True))
        _REPORT = {**raw.layers, "audit_hook": bool(raw.layers)}  # installed right after the layers are reported
    return dict(_REPORT)


def _check_labels(labels: str) -> None:
    if labels not in ("structured", "original"):
        raise ValueError(f"outcome_labels must be 'structured' or 'original', not {labels!r}")


# --------------------------------------------------------------------------------------------------------------
# Fork server: `python -m predict.sandbox serve` (one JSON request per line on stdin, one JSON reply on stdout)
# --------------------------------------------------------------------------------------------------------------


def serve() -> None:
    """Pre-import what solutions use, then fork one supervised child per request until stdin closes."""
    import importlib

    # Move the protocol off fds 0/1 so stray prints (ours or a library's) cannot corrupt it.
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _enter_server_namespaces()
    gc.freeze()  # children inherit these objects read-only: no GC pass touches (and copies) their pages
    reader = os.fdopen(proto_in, "rb", buffering=1 << 16)
    os.write(proto_out, b'{"ready": true}\n')
    for line in reader:
        try:
            reply = _execute(_Request.from_json(json.loads(line))).to_json()
        except Exception as e:  # noqa: BLE001 - a server bug becomes OTHER on the client side, not a hang
            reply = {"error": f"{type(e).__name__}: {e}"}
        _write_all(proto_out, (json.dumps(reply) + "\n").encode())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _ServerDied(Exception):
    pass


class _Server:
    """One fork-server process and its line protocol, used by one thread at a time."""

    def __init__(self) -> None:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",  # string-set iteration order is the same in every check and every run
            "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p),  # find predict, installed or not
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.proc = subprocess.Popen(  # -P and cwd="/": don't put the caller's cwd (say, /tmp) on sys.path
            [sys.executable, "-P", "-m", "predict.sandbox", "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, start_new_session=True, close_fds=True, cwd="/",
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out_fd = self.proc.stdout.fileno()
        self.buf = bytearray()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        if json.loads(self._read_line(time.monotonic() + timeout_s)).get("ready") is not True:
            raise _ServerDied("fork server did not start")

    def request(self, req: _Request) -> _Raw:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(req.to_json()) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _ServerDied(f"fork server gone: {e}") from e
        reply = json.loads(self._read_line(time.monotonic() + req.timeout_s + 30.0))
        if "error" in reply:
            raise _ServerDied(f"fork server error: {reply['error']}")
        return _Raw.from_json(reply)

    def _read_line(self, deadline: float) -> bytes:
        while (nl := self.buf.find(b"\n")) < 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _ServerDied("fork server did not answer in time")
            ready, _, _ = select.select([self.out_fd], [], [], remaining)
            if ready:
                data = os.read(self.out_fd, 1 << 16)
                if not data:
                    raise _ServerDied(f"fork server exited with {self.proc.poll()}")
                self.buf += data
        line = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        return line

    def close(self, grace_s: float = 2.0) -> None:
        """EOF ends the serve loop after the current check; SIGKILL if it lingers (children die by PDEATHSIG)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _close_servers(servers: list[_Server]) -> None:
    for s in servers:
        s.close()


class Verifier:
    """A pool of pre-warmed fork servers; thread-safe; a context manager.

    Each check forks a fresh, isolated child from one of ``workers`` servers; a server that dies (it should not:
    children run as nobody and cannot signal it) is replaced and that check is reported as OTHER.
    """

    def __init__(self, *, timeout_s: float = 3.0, memory_mb: int = 1024, workers: int = 1,
                 outcome_labels: Literal["structured", "original"] = "structured") -> None:
        _check_labels(outcome_labels)
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.timeout_s, self.memory_mb, self.workers = float(timeout_s), int(memory_mb), int(workers)
        self.outcome_labels = outcome_labels
        self._lock = threading.Lock()
        self._servers: list[_Server] = []  # every live server, for close()
        self._idle: queue.Queue[_Server] = queue.Queue()
        self._closed = False
        self._last_layers: dict[str, bool] = {}
        self._finalizer = weakref.finalize(self, _close_servers, self._servers)
        try:
            for _ in range(self.workers):  # start them all, then wait: startups overlap
                self._servers.append(_Server())
            for s in self._servers:
                s.wait_ready()
                self._idle.put(s)
        except (_ServerDied, OSError, ValueError) as e:
            self.close()
            raise RuntimeError(f"could not start the sandbox fork servers: {e}") from e

    def check(self, solution: str, test_list: Sequence[str], test_setup_code: str = "") -> Verdict:
        """Run one check on the next free server (blocks while all are busy)."""
        if self._closed:
            raise RuntimeError("Verifier is closed")
        req = _Request(solution, tuple(test_list), test_setup_code or "", self.timeout_s, self.memory_mb)
        server = self._idle.get()
        try:
            try:
                raw = server.request(req)
            except _ServerDied:  # killed from outside, or crashed: retry once on a fresh server
                if self._closed:
                    raise
                server = self._replace(server)
                raw = server.request(req)
        except _ServerDied as e:
            if not self._closed:
                server = self._replace(server)
            return Verdict(Outcome.OTHER, str(e)[:DETAIL_CHARS], None, 0.0, "", "")
        finally:
            self._idle.put(server)
        if raw.layers:
            self._last_layers = raw.layers
        return _to_verdict(raw, self.timeout_s, self.outcome_labels)

    def check_many(self, items: Iterable[tuple[str, Sequence[str], str]], *, progress: bool = False) -> list[Verdict]:
        """Check ``(solution, test_list, test_setup_code)`` items ``workers`` at a time; results in input order."""
        items = list(items)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(items), desc="verifying", unit="check")
        try:
            with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="verifier") as pool:
                futures = [pool.submit(self.check, s, t, setup) for s, t, setup in items]
                results = []
                for f in futures:
                    results.append(f.result())
                    if bar is not None:
                        bar.update(1)
                return results
        finally:
            if bar is not None:
                bar.close()

    def isolation_report(self) -> dict[str, bool]:
        """The layers the most recent child of this pool reported (probes one if none ran yet)."""
        if not self._last_layers:
            server = self._idle.get()
            try:
                self._last_layers = server.request(_Request("", (), "", 5.0, 256, probe=True)).layers
            finally:
                self._idle.put(server)
        return {**self._last_layers, "audit_hook": bool(self._last_layers)}

    def _replace(self, dead: _Server) -> _Server:
        with self._lock:
            try:
                dead.proc.kill()
            except OSError:
                pass
            dead.close(0.5)
            fresh = _Server()
            fresh.wait_ready()
            self._servers[self._servers.index(dead)] = fresh
            return fresh

    def close(self) -> None:
        """Stop every server (and with them any running child); idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m predict.sandbox", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="run a fork server (speaks JSON lines on stdin/stdout; started by Verifier)")
    sub.add_parser("report", help="print which isolation layers are active here")
    chk = sub.add_parser("check", help="check a solution file against a JSON list of assert statements")
    chk.add_argument("solution")
    chk.add_argument("tests", help="JSON file: a list of assert statements, or an MBPP row")
    chk.add_argument("--timeout", type=float, default=3.0)
    chk.add_argument("--labels", choices=("structured", "original"), default="structured")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve()
    elif args.cmd == "report":
        print(json.dumps(isolation_report(), indent=2))
    else:
        with open(args.tests) as f:
            spec = json.load(f)
        tests, setup = (spec, "") if isinstance(spec, list) else (spec["test_list"], spec.get("test_setup_code", ""))
        with open(args.solution) as f:
            v = check_once(f.read(), tests, setup, timeout_s=args.timeout, outcome_labels=args.labels)
        print(json.dumps(v.to_dict(), indent=2))
        return 0 if v.outcome is Outcome.PASS else 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

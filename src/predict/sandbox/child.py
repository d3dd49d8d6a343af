"""The sandboxed verifier: run a candidate ``solution.py`` against an MBPP task's tests and say what verifiably happened.

Each check forks a fresh child (from a pre-warmed fork server for :class:`Verifier`, from the calling process for
:func:`check_once`). The child isolates itself, compiles and executes the solution, the task's ``test_setup_code``
and every ``assert`` of ``test_list``, and reports a structured verdict on a dedicated pipe. The supervising parent
enforces the wall clock, drains stdout/stderr, reaps the child and turns the evidence into an
:class:`~predict.vocabulary.Outcome`. Classification never greps stderr (except :func:`label_original`, which exists to
reproduce the study's original heuristic).

Isolation layers (``isolation_report()`` says which were active on this machine; ``check_isolation`` holds them against
the config's ``verifier.isolation.require`` and raises IsolationError naming each missing layer and why, unless
``accept_weaker``; its record goes into the parquet metadata of the verifier report and every rollout):

- wall clock: the parent kills the child's whole process group (``setsid`` + ``killpg``) at ``timeout_s``.
- RLIMIT_CPU: a CPU-time backstop (SIGXCPU, then SIGKILL) one second past the timeout, reported as TIMEOUT.
- RLIMIT_AS: ``memory_mb`` of address space on top of what the forked interpreter already maps (MemoryError).
- RLIMIT_NPROC = 0 (effective once unprivileged): no fork, no threads, so a fork bomb fails with an error.
- RLIMIT_FSIZE (16 MiB) with SIGXFSZ ignored, so oversized writes raise instead of killing; RLIMIT_CORE = 0.
- PR_SET_PDEATHSIG: the child is SIGKILLed if its supervisor dies, so a killed pool leaves no orphans.
- PR_SET_DUMPABLE = 0: /proc/self/environ and /proc/self/mem are unreadable, even to the child's own uid.
- network namespace: no interface is up, so no network at all (not even 127.0.0.1). A fork server enters one once
  at start and all its children share it (the server only talks over pipes); check_once makes one per child.
- mount namespace: ``/`` made rprivate and fresh size-capped tmpfs over the world-writable /tmp, /var/tmp, /dev/shm
  and /run/lock; cwd is a directory in that tmpfs, so nothing written to "/tmp" reaches the host. A fork server sets
  this up once; after every check it removes the check's sandbox dir and wipes the tmpfs if anything is left in them,
  and it makes a new sandbox dir for the next check, so checks never see each other's files or each other's sandbox
  dir (mode, xattrs). check_once mounts per child. Python directories under those dirs (a checkout and its venv in
  ``mktemp -d``) are held open, covered, and bound back read-only at their own paths (the way to them root's, mode
  755, and left alone by the cleanup), so where the repository is installed changes nothing.
- hidden home: if Python lives under a directory nobody cannot enter (pyenv in /root, mode 700), that directory is
  covered by an empty tmpfs in the private mount namespace and only the Python directories are bind-mounted back,
  read-only, so the unprivileged child can import the stdlib and sees nothing else of root's home.
- privileges: when root, drop to nobody (setgroups([]), setgid/setuid 65534): root files stay read-only, other
  processes (the supervisor included) cannot be signalled, RLIMIT_NPROC applies. When not root, an unprivileged
  user namespace is tried instead: the child is mapped to root in it, gets its own mount and network namespaces and
  private tmp, but stays the invoking user to the kernel (so files that user owns outside /tmp are guarded by the
  audit hook only).
- signal filter (seccomp): the child may signal only itself (its pid, its process group); pidfd_send_signal (a pidfd
  can come from opening /proc/<pid>), ptrace and process_vm_* are refused. It is what keeps an unprivileged child,
  which has its fork server's uid, from killing the server (no audit event covers pidfds), and a nobody child from
  killing the checks running next to it. It is built once per fork server; installing it (the kernel compiles it
  for each child) costs a child roughly 0.1 ms of CPU on this VM (too noisy here to say more precisely).
- file descriptors: stdin is /dev/null, stdout/stderr are pipes whose last 64 KiB are kept, every other inherited
  descriptor (the fork server's protocol pipes included) is closed; only the verdict pipe stays open.
- environment: cleared to PATH/LANG/HOME=sandbox, so no inherited secrets. A fork server starts scrubbed and then
  reduces its own environment to exactly that once, so its children inherit it; check_once children clear their own.
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
  The supervisor reads it once the child is gone; it is non-blocking, so a child that floods it (64 KiB) only loses
  its own verdict (OTHER).

Known limits (it is a research sandbox, not a security boundary against an adversary targeting *this* harness):
code that walks ``frame.f_back`` into the harness could read the nonce and forge a verdict; a returned object whose
``__eq__`` always says True passes an ``assert f(x) == y`` exactly as it would under plain Python; /proc still
lists host processes (no PID namespace); the audit hook resolves relative paths against the cwd, so ``dir_fd``
tricks slip past it (the kernel layers still hold). Threads cannot be started (RLIMIT_NPROC), which no MBPP gold
solution needs. String hashing is fixed (PYTHONHASHSEED=0) in fork servers, so set iteration order is reproducible.

Cost per check (MBPP gold, 2 workers on 2 cores): about 2.1 ms of CPU in all, of which ~0.1 ms in the client, ~0.6 ms
in the fork server and ~1.4 ms in the child; roughly three quarters of it is the kernel's copy-on-write work: fork
copying page tables, the child's page faults (~350: ~250 copies, the rest re-mapping library text), its exit
tearing the address space down. So everything here is about touching fewer pages and mapping fewer of them:

- fork servers import only what they and the children need (module top level; client-side modules are imported
  where they are used): ``threading`` alone adds an after-fork hook worth ~0.3 ms a child, argparse/shutil add
  compression libraries whose mappings every fork copies. After its imports the server hands malloc's free memory
  back (malloc_trim) and freezes its objects for the GC (again before every fork: children never scan them).
- what every child would redo is done once in the server: environment, signal dispositions, std streams, libc
  symbols, the harness's and the audit hook's bindings (immutable tuples), the sandbox dir's realpath.
- no JSON in the server: requests and replies are a header line plus raw bytes; the client decodes the child's
  output and parses the verdict channel. The server sleeps on the child's stdout/stderr and exit only (one wake-up
  for most checks), and a check that left nothing costs one rmdir and a directory read per tmpfs to clean up.
- the client drives all servers from one thread (``check_many``: a poll loop, no thread per check), and each server
  is pinned to its own CPU when there are enough (see :class:`Verifier`).

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

# Only what fork servers and their children need (see "Cost per check" above): client-side modules (subprocess,
# threading, queue, tempfile) are imported where they are used; test_fork_server_stays_lean checks the server.
import builtins
import ctypes
import fcntl
import functools
import gc
import io
import linecache
import math
import os
import resource
import select
import signal
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from predict.vocabulary import Outcome

if TYPE_CHECKING:
    pass

__all__ = ["LAYERS", "OUTCOME_LABELS", "Verdict", "check_once", "isolation_report", "isolation_status", "label_original", "serve"]

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
_TEST_FILES = tuple(_TEST_FILE.format(i) for i in range(32))  # made once, not in every child
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
        return {**asdict(self), "outcome": self.outcome.value}


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


class Request(NamedTuple):
    solution: str
    tests: tuple[str, ...]
    setup: str
    timeout_s: float
    memory_mb: int
    probe: bool = False  # isolation_report(): set up, report the layers, run nothing


PROBE = Request("", (), "", 5.0, 256, probe=True)

# The fork-server protocol, both ways: a header line of numbers, then the raw UTF-8 payloads whose lengths it gives.
# No JSON: a server builds and parses as few objects (dirtying as few pages) as it can, and never decodes output.
#   request: "<timeout_s> <memory_mb> <probe 0|1> <len solution> <len setup> <len test 0> ...\n" payloads
#   reply:   "<nonce> <returncode> <timed_out 0|1> <cpu_s> <cpu_limit_s> <duration_s> <len channel> <len stdout>
#             <len stderr>\n" payloads   (or "E <message>\n" when the server itself failed; "ready\n" at start)


def request_bytes(req: Request) -> bytes:
    # surrogatepass round-trips any str, lone surrogates included
    parts = [t.encode("utf-8", "surrogatepass") for t in (req.solution, req.setup, *req.tests)]
    head = f"{req.timeout_s!r} {req.memory_mb:d} {int(req.probe)} {' '.join(str(len(p)) for p in parts)}\n"
    return head.encode("ascii") + b"".join(parts)


def _read_request(reader: Any) -> Request | None:
    """The next request from a fork server's protocol stream; None at EOF."""
    head = reader.readline()
    if not head:
        return None
    fields = head.split()
    sizes = [int(x) for x in fields[3:]]
    body = reader.read(sum(sizes))
    if len(sizes) < 2 or len(body) != sum(sizes):
        raise ValueError("truncated request")
    texts, pos = [], 0
    for n in sizes:
        texts.append(body[pos : pos + n].decode("utf-8", "surrogatepass"))
        pos += n
    return Request(texts[0], tuple(texts[2:]), texts[1], float(fields[0]), int(fields[1]), fields[2] == b"1")


# What _supervise returns: (channel, returncode, timed_out, cpu_s, cpu_limit_s, duration_s, stdout, stderr), the
# three byte strings undecoded; the nonce comes with it in the reply.
_Evidence = tuple[bytes, int, bool, float, int, float, bytes, bytes]


def _reply_bytes(nonce: str, ev: _Evidence) -> bytes:
    channel, returncode, timed_out, cpu_s, cpu_limit_s, duration_s, out, err = ev
    head = (f"{nonce} {returncode:d} {int(timed_out)} {cpu_s!r} {cpu_limit_s:d} {duration_s!r} "
            f"{len(channel)} {len(out)} {len(err)}\n")
    return head.encode("ascii") + channel + out + err


@dataclass(frozen=True)
class Raw:
    """What the supervisor saw, unparsed: fork servers ship this as is and the client makes sense of it (parse())."""

    channel: str  # everything the child wrote on its verdict pipe (ASCII; anything else replaced)
    nonce: str  # the per-check secret that the harness's own messages carry
    returncode: int | None  # Popen convention: negative signal number when killed
    timed_out: bool  # the wall clock fired
    cpu_s: float
    cpu_limit_s: int
    stdout: str
    stderr: str
    duration_s: float

    @classmethod
    def from_evidence(cls, nonce: str, ev: _Evidence) -> Raw:
        channel, returncode, timed_out, cpu_s, cpu_limit_s, duration_s, out, err = ev
        return cls(channel.decode("ascii", "replace"), nonce, returncode, timed_out, cpu_s, cpu_limit_s,
                   out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), duration_s)

    def parse(self) -> Channel:
        """Read the child's messages: ``<nonce> L <hex: one flag byte per LAYERS entry>`` (before user code; a
        ``<nonce> W <hex: "layer<TAB>reason" lines>`` before it says why missing layers are missing),
        ``<nonce> T <i>`` (test i starts) and ``<nonce> V <outcome> <test> <hex detail>``; anything without the nonce
        is ignored."""
        verdicts: list[tuple[Outcome, int | None, str]] = []
        layers: dict[str, bool] = {}
        reasons: dict[str, str] = {}
        last_test = -1
        for line in self.channel.splitlines():
            parts = line.split(" ", 2)
            if len(parts) != 3 or parts[0] != self.nonce:  # without the nonce it is not ours: ignore it
                continue
            try:
                if parts[1] == "T":
                    last_test = int(parts[2])
                elif parts[1] == "L" and not layers:
                    flags = bytes.fromhex(parts[2])
                    if len(flags) == len(LAYERS):
                        layers = {k: bool(v) for k, v in zip(LAYERS, flags, strict=True)}
                elif parts[1] == "W" and not layers and not reasons:
                    for entry in bytes.fromhex(parts[2]).decode("utf-8", "replace").splitlines():
                        key, _, why = entry.partition("\t")
                        if key in LAYERS:
                            reasons[key] = why
                elif parts[1] == "V":
                    outcome, test, detail = parts[2].split(" ", 2)
                    failed = int(test)
                    detail = bytes.fromhex(detail).decode("utf-8", "replace")
                    verdicts.append((Outcome(outcome), failed if failed >= 0 else None, detail))
            except (ValueError, AttributeError):
                continue
        return Channel(verdicts[0] if len(verdicts) == 1 else None, len(verdicts) > 1, layers, last_test, reasons)


@dataclass(frozen=True)
class Channel:
    """The verdict channel, read: only messages carrying the nonce count."""

    verdict: tuple[Outcome, int | None, str] | None  # (outcome, failed_test, detail) from the harness
    tampered: bool  # several verdict messages with the right nonce
    layers: dict[str, bool]  # the isolation report the child sent before running user code
    last_test: int  # the test running when the child stopped talking (-1: none started)
    reasons: dict[str, str]  # why inactive layers are inactive, when the child knew

    def status(self) -> tuple[dict[str, bool], dict[str, str]]:
        """(layers, reasons) as isolation_status() gives them: the audit hook goes in right after the layers go out."""
        return {**self.layers, "audit_hook": bool(self.layers)}, dict(self.reasons)


def _cpu_limit(timeout_s: float) -> int:
    return int(math.ceil(timeout_s)) + 1


def to_verdict(raw: Raw, timeout_s: float, labels: str, channel: Channel | None = None) -> Verdict:
    """Turn the supervisor's evidence into a Verdict; the harness's own message wins whenever there is one."""
    ch = raw.parse() if channel is None else channel
    failed: int | None = ch.last_test if ch.last_test >= 0 else None  # where a silent death happened
    sig = -raw.returncode if raw.returncode is not None and raw.returncode < 0 else None
    if ch.tampered:
        outcome, failed, detail = Outcome.OTHER, None, "several verdict messages: the verdict channel was tampered with"
    elif ch.verdict is not None:
        outcome, failed, detail = ch.verdict
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

    def data(self) -> bytes:
        return bytes(self.buf[-self.cap :])  # decoded (UTF-8, errors replaced) by whoever makes the Raw


def _run(req: Request) -> tuple[str, _Evidence]:
    """Fork one child for ``req`` and supervise it to the end; never raises for anything the child does. Returns the
    check's nonce and the evidence undecoded (what a fork server sends back as is; Raw.from_evidence decodes it)."""
    nonce = os.urandom(16).hex()  # what secrets.token_hex(16) does, without importing secrets (hmac, hashlib, ...)
    _load_libc()  # once per process, before forking, so children don't pay for these
    _python_dirs()
    _prepare_signal_filter()
    nofile = _nofile()
    scratch = _Scratch()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # Non-blocking at both ends (the module docstring's "verdict channel"): no wake-up per message, EAGAIN for a flood.
    ver_r, ver_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    for stream in (sys.stdout, sys.stderr):  # don't let the child inherit (and re-emit) buffered parent output
        try:
            stream.flush()
        except Exception:
            pass
    if _SERVER_PREPARED:
        gc.freeze()  # what the server allocated since its last fork: the child's GC never scans (and copies) it
    exit_ = os._exit  # bound before user code can rebind os._exit: the child must never return into our caller
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: never returns, never runs the parent's cleanup or atexit
        try:  # (the read ends are closed by _child's closerange, or replaced by its dup2s)
            _child(req, out_w, err_w, ver_w, nonce, scratch.path, nofile)
        finally:
            exit_(70)
    os.close(out_w), os.close(err_w), os.close(ver_w)
    try:
        return nonce, _supervise(req, pid, start, out_r, err_r, ver_r)
    finally:
        scratch.cleanup()


def _supervise(req: Request, pid: int, start: float, out_r: int, err_r: int, ver_r: int) -> _Evidence:
    tails: dict[int, _Tail] = {}  # made on the first output: most checks print nothing
    poller = select.poll()  # no kernel object to create per check, unlike epoll
    for fd in (out_r, err_r):  # blocking is fine: we only read after poll says there is data (or EOF)
        poller.register(fd, select.POLLIN)
    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable once the child has exited
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):  # old kernel: poll waitid instead
        pidfd = None
    deadline = start + req.timeout_s
    exited, timed_out = False, False
    open_pipes = 2
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
                elif data := os.read(fd, 1 << 16):
                    if fd not in tails:
                        tails[fd] = _Tail(CAPTURE_BYTES)
                    tails[fd].add(data)
                else:
                    poller.unregister(fd)
                    open_pipes -= 1
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
        ver = _drain(ver_r, 1 << 20)  # the child is gone: everything it sent is in the pipe (64 KiB at most)
        for fd in (out_r, err_r, ver_r, pidfd):
            if fd is not None:
                os.close(fd)
    return (ver, os.waitstatus_to_exitcode(status), timed_out, usage.ru_utime + usage.ru_stime,
            _cpu_limit(req.timeout_s), duration, tails[out_r].data() if out_r in tails else b"",
            tails[err_r].data() if err_r in tails else b"")


def _drain(fd: int, cap: int) -> bytes:
    """Whatever a non-blocking pipe holds right now (at most ``cap`` bytes)."""
    chunks, size = [], 0
    while size < cap:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:  # BlockingIOError: nothing (more) in it
            break
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


def _rmtree_quiet(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------------
# Child: isolate, then run the harness (never returns)
# --------------------------------------------------------------------------------------------------------------

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000, \
    0x40000
_MS_NOEXEC, _MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 0x8, 0x400, 0x800, 0x200000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
_SIGKILL = int(signal.SIGKILL)
_INHERITED_NS: set[str] = set()  # namespaces this process (a fork server) already entered for all its children
# World-writable places that get a private tmpfs. /run/lock (/var/lock) is one on Debian-like hosts: without it a
# check running as nobody could leave files there (through dir_fd, which the audit hook cannot follow) on the host.
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_PRIVATE_SCRATCH: tuple[str, ...] = ()  # those that did get one in this fork server's mount namespace
# Per scratch dir, the entries that are not litter: the skeleton that leads to Python dirs bound back read-only (a venv
# under /tmp); root-owned, so a child running as nobody cannot add to it. The cleanup leaves them alone.
_SCRATCH_KEEP: dict[str, frozenset[str]] = {}
# Layers switched off on purpose (`PREDICT_SANDBOX_WITHOUT=private_tmp,...`, read once at import): simulates a machine
# that cannot give them, to test that a required layer that is missing stops the stage (see check_isolation).
WITHOUT = frozenset(n for n in os.environ.get("PREDICT_SANDBOX_WITHOUT", "").replace(" ", "").split(",") if n)
# Why a layer could not be had (layer -> reason), filled while isolating; a child reports those of inactive layers.
_REASONS: dict[str, str] = {}
_SANDBOX_IN_TMPFS = "/tmp/sandbox"
_SERVER_PREPARED = False  # serve() set up stdin, environment and signal dispositions once for all its children
_UNPIN: frozenset[int] | None = None  # a pinned fork server's original CPUs: its children get them back
_PAGE_SIZE = resource.getpagesize()


@functools.cache
def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the interpreter already links libc: no ldconfig lookup
        for name in ("prctl", "unshare", "mount", "syscall"):  # CDLL caches each function on first use: before forking
            getattr(libc, name)
        return libc
    except (OSError, AttributeError) as e:
        for layer in ("mount_namespace", "net_namespace", "user_namespace", "private_tmp", "pdeathsig"):
            _REASONS[layer] = f"libc could not be loaded through ctypes: {e}"
        return False


def _errno() -> str:
    err = ctypes.get_errno()
    return f"{os.strerror(err)} (errno {err})"


def _switched_off(layer: str) -> bool:
    if layer in WITHOUT:
        _REASONS[layer] = "switched off by PREDICT_SANDBOX_WITHOUT (simulating a machine without it)"
        return True
    return False


def _enter_server_namespaces() -> None:
    """Fork server as root: enter private network and mount namespaces once; every child inherits them for free.

    Creating namespaces and tearing them down costs ~1 ms per fork; why sharing them is safe: the module docstring.
    """
    libc = _load_libc()
    if os.geteuid() != 0 or not libc:
        return
    net_before, mnt_before = _ns_id("net"), _ns_id("mnt")
    if not _switched_off("net_namespace") and net_before is not None and libc.unshare(_CLONE_NEWNET) == 0 \
            and _ns_id("net") != net_before:
        _INHERITED_NS.add("net")
    if not _switched_off("mount_namespace") and mnt_before is not None and libc.unshare(_CLONE_NEWNS) == 0 \
            and _ns_id("mnt") != mnt_before and _mount_private_tmp(libc):
        _INHERITED_NS.add("mnt")


def _mount_private_tmp(libc: Any) -> bool:
    """Make every mount private to this (already new!) mount namespace and put fresh tmpfs over the scratch dirs,
    binding the Python directories under them back read-only (the module docstring's "mount namespace")."""
    if _switched_off("private_tmp"):
        return False
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        _REASONS["private_tmp"] = f"making / private in the new mount namespace failed: {_errno()}"
        return False
    global _PRIVATE_SCRATCH
    scratch = tuple(dict.fromkeys(os.path.realpath(d) for d in _SCRATCH_DIRS if os.path.isdir(d)))  # each place once
    essential, every = _python_dirs()
    clash = [p for p in essential if p in scratch]
    if clash:  # Python itself *is* /tmp (or the like): a tmpfs there hides it and binding it back undoes the tmpfs
        _REASONS["private_tmp"] = f"a Python directory is itself a scratch dir: {clash[0]}"
        return False
    under = [p for p in every if any(p.startswith(d + os.sep) for d in scratch)]
    handles: list[tuple[str, int]] = []  # reachable after the tmpfs goes on
    ok = True
    try:
        for p in under:
            try:
                handles.append((p, os.open(p, os.O_PATH | os.O_DIRECTORY)))
            except OSError as e:
                _REASONS["private_tmp"] = f"cannot open the Python directory {p} to bind it back: {e}"
                return False
        for d in scratch:
            if libc.mount(b"tmpfs", d.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, TMPFS_OPTIONS) == 0:
                _PRIVATE_SCRATCH += (d,)
            else:
                _REASONS["private_tmp"] = f"mounting a tmpfs on {d} failed: {_errno()}"
                ok = False
        for p, fd in handles:
            if not ok:
                break
            ok = _bind_back(libc, p, fd, "private_tmp")
            top = next((d for d in scratch if p.startswith(d + os.sep)), None)
            if ok and top is not None:
                _SCRATCH_KEEP[top] = _SCRATCH_KEEP.get(top, frozenset()) | {p[len(top) + 1:].split(os.sep)[0]}
    finally:
        for _, fd in handles:
            os.close(fd)
    if ok and os.geteuid() == 0:
        _reexpose_python(libc)
    return ok


def _bind_back(libc: Any, path: str, fd: int, layer: str) -> bool:
    """Bind the directory open as ``fd`` at ``path`` (made, 0755, in the covering tmpfs if need be), read-only."""
    parts, cur = path.strip(os.sep).split(os.sep), ""
    for part in parts:  # not os.makedirs: its mode is masked by the umask, and nobody must be able to traverse these
        cur += os.sep + part
        if not os.path.isdir(cur):
            os.mkdir(cur)
            os.chmod(cur, 0o755)
    if libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC, None) != 0:
        _REASONS[layer] = f"binding {path} back into the private mount namespace failed: {_errno()}"
        return False
    # A remount must repeat the flags the kernel locked on the source mount (in a user namespace it refuses otherwise).
    f_flag = os.statvfs(path).f_flag
    keep = f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
    keep |= _MS_RELATIME if f_flag & os.ST_RELATIME else 0
    flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | keep
    if libc.mount(b"none", path.encode(), None, flags, None) != 0:
        _REASONS[layer] = f"making the bind mount of {path} read-only failed: {_errno()}"
        return False
    return True


@functools.cache
def _python_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(essential, all): real paths of the dirs imports read from, outermost only. Cached; computed before forking.

    Essential dirs are the interpreter's prefixes, stdlib and site-packages; "all" adds the other sys.path entries.
    """
    import sysconfig

    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    essential = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(sysconfig.get_paths()[k] for k in keys)}

    def outermost(paths: Iterable[str]) -> tuple[str, ...]:
        real = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)} - {os.sep}
        return tuple(sorted(d for d in real if not any(d.startswith(o + os.sep) for o in real)))

    return outermost(essential), outermost([*essential, *sys.path])


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
    """The module docstring's "hidden home": let nobody import the stdlib when Python lives under a private dir."""
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
                _REASONS["dropped_privileges"] = f"covering {blocker} (Python lives under it) failed: {_errno()}"
                continue
            for d, fd in handles:
                _bind_back(libc, d, fd, "dropped_privileges")
        finally:
            for _, fd in handles:
                os.close(fd)


class _Scratch:
    """The child's working directory, and the cleanup of everything it could write."""

    def __init__(self) -> None:
        self.shared_tmpfs = "mnt" in _INHERITED_NS  # fork server: our own tmpfs, wiped after each check
        if self.shared_tmpfs:
            self.path = _SANDBOX_IN_TMPFS
            if os.path.lexists(self.path):  # a previous cleanup was interrupted
                self._wipe()
            os.mkdir(self.path, 0o700)  # fresh for every check: a new inode, owner, mode, times and no xattrs
            if os.geteuid() == 0:
                os.chown(self.path, NOBODY, NOBODY)
        else:  # check_once, or an unprivileged fork server: the child mounts its own tmpfs if it can (and leaves this
            # host dir empty); this dir is the fallback. Made by hand: tempfile (and shutil, for the cleanup) would
            # load modules that make every fork of an unprivileged server dearer (test_fork_server_stays_lean).
            base = sys.modules["tempfile"].gettempdir() if "tempfile" in sys.modules else "/tmp"
            self.path = os.path.join(base, f"predict-sandbox-{os.urandom(8).hex()}")
            os.mkdir(self.path, 0o700)

    def cleanup(self) -> None:
        if not self.shared_tmpfs:
            try:
                os.rmdir(self.path)  # the usual case: the check ran in its own tmpfs, nothing is in here
            except OSError:
                _rmtree_quiet(self.path)
            return
        # The usual case, nothing left behind: rmdir only removes an empty sandbox dir, then one getdents per tmpfs.
        try:
            os.rmdir(self.path)
            if not any(_litter(d) for d in _PRIVATE_SCRATCH):
                return
        except OSError:
            pass
        self._wipe()

    @staticmethod
    def _wipe() -> None:
        for d in _PRIVATE_SCRATCH:  # everything a check left in our tmpfs, including the sandbox dir itself
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            keep = _SCRATCH_KEEP.get(d, ())
            for e in entries:
                if e.name in keep:  # the root-owned way to a bound-back Python dir: not the check's
                    continue
                if e.is_dir(follow_symlinks=False):
                    _rmtree_quiet(e.path)
                else:
                    try:
                        os.unlink(e.path)
                    except OSError:
                        pass


def _litter(d: str) -> bool:
    names = os.listdir(d)
    keep = _SCRATCH_KEEP.get(d)
    return any(n not in keep for n in names) if keep else bool(names)


# The isolation layers (config verifier.isolation.require's IsolationLayer keeps the same names, checked equal by
# tests/test_sandbox_isolation.py).
LAYERS: tuple[str, ...] = ("setsid", "rlimits", "pdeathsig", "mount_namespace", "private_tmp", "net_namespace",
                           "user_namespace", "dropped_privileges", "signal_filter", "env_scrubbed", "audit_hook")

# signal_filter (the module docstring says what it refuses and why), per architecture: (AUDIT_ARCH, self-targeted
# calls {nr: arg index of the target}, always refused calls, the number of seccomp(2) itself).
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, {62: 0, 200: 0, 234: 0, 129: 0, 297: 0, 434: 0}, (424, 101, 310, 311), 317),
    "aarch64": (0xC00000B7, {129: 0, 130: 0, 131: 0, 138: 0, 240: 0, 434: 0}, (424, 117, 270, 271), 277),
}.get(os.uname().machine)
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
# seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW): without that flag the kernel also forces the
# speculative-store-bypass mitigation on a filtered process, which slows ordinary Python code down.
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1, 4


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# The filter's program, ctypes buffer and argument, made once per process before forking (_prepare_signal_filter): a
# child only writes its pid into the buffer through a memoryview. Building ctypes objects in every child would cost
# ~0.4 ms of copy-on-write page faults per check.
_FILTER: tuple[memoryview, tuple[int, ...], tuple[int, ...], Any, Any] | None = None
_NO_NEW_PRIVS = False  # set once by a fork server (it never execs; inherited by every child): one syscall less each


def _prepare_signal_filter() -> None:
    global _FILTER
    if _FILTER is None and _SECCOMP_ARCH is not None:
        prog, own, group = _signal_filter_template()
        buf = ctypes.create_string_buffer(prog, len(prog))
        fprog = _SockFprog(len(prog) // 8, ctypes.addressof(buf))
        _FILTER = (memoryview(buf).cast("B"), own, group, ctypes.byref(fprog), (buf, fprog))  # last: keep them alive


def _signal_filter_template() -> tuple[bytes, tuple[int, ...], tuple[int, ...]]:
    """(program with the pid left 0, byte offsets of the pid's k fields, of the -pid ones)."""
    arch, self_only, refused, _ = _SECCOMP_ARCH  # type: ignore[misc]
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    ins: list[tuple[int, int, int, int]] = []  # (code, jt, jf, k); jumps are relative, patched below

    def ld(offset: int) -> None:
        ins.append((0x20, 0, 0, offset))  # BPF_LD | BPF_W | BPF_ABS

    ld(4)  # seccomp_data.arch
    ins.append((0x15, 1, 0, arch))  # same arch: skip the deny
    ins.append((0x06, 0, 0, deny))  # another ABI (i386 on x86_64): refuse everything
    ld(0)  # seccomp_data.nr
    ins.append((0x35, 0, 1, 0x40000000))  # x32 syscalls: refuse
    ins.append((0x06, 0, 0, deny))
    for nr in refused:
        ins.append((0x15, 0, 1, nr))
        ins.append((0x06, 0, 0, deny))
    own: list[int] = []
    group: list[int] = []
    for nr, arg in self_only.items():  # nr == this: check its target (low 32 bits of the argument)
        ins.append((0x15, 0, 6, nr))
        ld(16 + 8 * arg)
        own.append(8 * len(ins) + 4)
        ins.append((0x15, 3, 0, 0))  # the pid itself
        group.append(8 * len(ins) + 4)
        ins.append((0x15, 2, 0, 0))  # -pid: its own process group (setsid: pgid == pid)
        ins.append((0x15, 1, 0, 0))
        ins.append((0x06, 0, 0, deny))
        ins.append((0x06, 0, 0, allow))
    ins.append((0x06, 0, 0, allow))
    prog = b"".join(c.to_bytes(2, "little") + bytes((jt, jf)) + k.to_bytes(4, "little") for c, jt, jf, k in ins)
    return prog, tuple(own), tuple(group)


def _install_signal_filter(libc: Any) -> bool:
    if _SECCOMP_ARCH is None:
        _REASONS["signal_filter"] = f"no seccomp syscall table for {os.uname().machine}"
        return False
    view, own, group, arg, _ = _FILTER  # type: ignore[misc]
    pid = os.getpid()
    mine, group_of_mine = (pid & 0xFFFFFFFF).to_bytes(4, "little"), (-pid & 0xFFFFFFFF).to_bytes(4, "little")
    for o in own:
        view[o:o + 4] = mine
    for o in group:
        view[o:o + 4] = group_of_mine
    if not _NO_NEW_PRIVS and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # a fork server set it once
        _REASONS["signal_filter"] = f"PR_SET_NO_NEW_PRIVS failed: {_errno()}"
        return False
    if libc.syscall(_SECCOMP_ARCH[3], _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_SPEC_ALLOW, arg) == 0:
        return True
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, arg, 0, 0) != 0:  # kernel < 4.17
        _REASONS["signal_filter"] = f"installing the seccomp filter failed: {_errno()}"
        return False
    return True


def _isolate(host_dir: str, memory_mb: int, timeout_s: float) -> tuple[str, dict[str, bool]]:
    """Apply every layer that this machine allows; return the sandbox dir and which layers are active."""
    libc = _load_libc()
    layers = dict.fromkeys(LAYERS, False)
    os.setsid()
    layers["setsid"] = True
    root = os.geteuid() == 0
    inherited = bool(libc) and _INHERITED_NS == {"net", "mnt"}  # a fork server made both private, tmpfs included
    mnt_ns_before = None if inherited else _ns_id("mnt")
    if inherited:
        layers["net_namespace"] = layers["mount_namespace"] = layers["private_tmp"] = True
    elif libc:
        want = (0 if _switched_off("mount_namespace") else _CLONE_NEWNS) | \
            (0 if _switched_off("net_namespace") else _CLONE_NEWNET)
        if root:
            if want and libc.unshare(want) == 0:
                layers["mount_namespace"], layers["net_namespace"] = bool(want & _CLONE_NEWNS), bool(want & _CLONE_NEWNET)
            elif want:
                for layer in ("mount_namespace", "net_namespace"):
                    _REASONS.setdefault(layer, f"unshare as root failed: {_errno()}")
        elif not _switched_off("user_namespace"):
            # an unprivileged user namespace buys mount+net namespaces on a laptop (if the kernel allows it)
            uid, gid = os.getuid(), os.getgid()
            if libc.unshare(_CLONE_NEWUSER | want) == 0:
                layers["user_namespace"] = True
                layers["mount_namespace"], layers["net_namespace"] = bool(want & _CLONE_NEWNS), bool(want & _CLONE_NEWNET)
                try:
                    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                        with open(f"/proc/self/{name}", "w") as f:
                            f.write(text)
                except OSError as e:
                    layers["mount_namespace"] = False  # unmapped ids cannot create files on a tmpfs
                    _REASONS["mount_namespace"] = f"writing the user namespace's id maps failed: {e}"
            else:
                why = f"unshare(CLONE_NEWUSER) failed: {_errno()} (see user.max_user_namespaces, " \
                      "kernel.apparmor_restrict_unprivileged_userns, or a container's seccomp profile)"
                _REASONS["user_namespace"] = why
                if libc.unshare(_CLONE_NEWUSER | (want & _CLONE_NEWNET)) == 0:
                    layers["user_namespace"] = layers["net_namespace"] = bool(want & _CLONE_NEWNET)
                    _REASONS["mount_namespace"] = f"a user namespace with a mount namespace failed: {_errno()}"
                else:
                    for layer in ("mount_namespace", "net_namespace"):
                        _REASONS.setdefault(layer, why)
    sandbox = host_dir
    # Never touch mounts unless we verifiably left the host's mount namespace: mounting tmpfs over the host's /tmp
    # would be a disaster.
    if not layers["private_tmp"] and layers["mount_namespace"] and _ns_id("mnt") not in (None, mnt_ns_before) \
            and _mount_private_tmp(libc):
        sandbox = _SANDBOX_IN_TMPFS
        os.mkdir(sandbox, 0o700)
        layers["private_tmp"] = True
    elif not layers["mount_namespace"]:
        _REASONS.setdefault("private_tmp", "no private mount namespace to mount it in")
    if root and not inherited:  # a fork server's sandbox dir is made for nobody already
        os.chown(sandbox, NOBODY, NOBODY)
    # Limits are set while still privileged; NPROC takes effect once we are nobody (root ignores it).
    cpu = _cpu_limit(timeout_s)
    setrlimit = resource.setrlimit
    setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    setrlimit(resource.RLIMIT_FSIZE, (FSIZE_BYTES, FSIZE_BYTES))
    setrlimit(resource.RLIMIT_CORE, (0, 0))
    setrlimit(resource.RLIMIT_NPROC, (0, 0))
    if not _SERVER_PREPARED:  # a fork server set these dispositions once for all its children (_prepare_server)
        _reset_signals()
    # Drop to nobody, unless that would leave Python unable to import (root, no mount namespace, Python in /root).
    if root and not _switched_off("dropped_privileges"):
        if layers["private_tmp"] or all(_blocking_ancestor(d) is None for d in _python_dirs()[0]):
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            layers["dropped_privileges"] = os.geteuid() == NOBODY
        else:
            blocked = next(d for d in _python_dirs()[0] if _blocking_ancestor(d) is not None)
            _REASONS.setdefault("dropped_privileges", f"nobody could not reach Python at {blocked} "
                                                      f"({_blocking_ancestor(blocked)} is closed to others) and "
                                                      "without a private tmp it cannot be bound back")
    if libc:  # after setuid, which clears it; then make sure the supervisor did not already die
        ppid = os.getppid()
        layers["pdeathsig"] = not _switched_off("pdeathsig") and libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) == 0
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # /proc/self/{environ,mem} become unreadable, even to our uid
        if os.getppid() != ppid:
            os._exit(71)
        layers["signal_filter"] = not _switched_off("signal_filter") and _install_signal_filter(libc)
    os.chdir(sandbox)
    if not _SERVER_PREPARED:
        os.environ.clear()
        os.environ.update(_child_env(sandbox))
    elif sandbox != _SANDBOX_IN_TMPFS:  # the server's environment is already _child_env(_SANDBOX_IN_TMPFS)
        os.environ["HOME"] = sandbox
    layers["env_scrubbed"] = True
    # Address space last: the setup above must not be the thing that runs out of memory.
    limit = _vm_size() + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    layers["rlimits"] = True
    return sandbox, layers


def _ns_id(kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None


def _vm_size() -> int:
    try:  # raw os calls: open() would build a TextIOWrapper in every child
        fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 128).split()[0]) * _PAGE_SIZE
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return 0


def _child_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home}


def _reset_signals() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead of killing
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # don't run handlers a check_once caller installed


@functools.cache
def _nofile() -> int:
    """The soft RLIMIT_NOFILE, cached before forking: every fd below it is closed in the child."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _child(req: Request, out_w: int, err_w: int, ver_w: int, nonce: str, host_dir: str, nofile: int) -> NoReturn:
    """Rearrange descriptors, isolate, run the harness, and exit with the code ``python solution.py`` would."""
    if _SERVER_PREPARED and min(out_w, err_w, ver_w) > _VERDICT_FD:
        # Fork server: fd 0 is already /dev/null (serve() put it there) and no pipe sits on a target fd.
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(ver_w, _VERDICT_FD)
    else:
        devnull = os.open(os.devnull, os.O_RDONLY)
        # Lift every fd above the target range first so dup2 cannot clobber one we still need.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (devnull, out_w, err_w, ver_w)]
        for target, fd in enumerate(high):  # 0 stdin, 1 stdout, 2 stderr, 3 verdict
            os.dup2(fd, target)
    os.closerange(_VERDICT_FD + 1, nofile)  # close_range(2): one syscall
    if _UNPIN is not None:  # start on the server's CPU, but let a long check move away from a busy one
        os.sched_setaffinity(0, _UNPIN)
    if not _SERVER_PREPARED:  # a fork server checked its own streams once
        _std_streams()
    try:
        sandbox, layers = _isolate(host_dir, req.memory_mb, req.timeout_s)
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(72)
    _harness(req, nonce, sandbox, layers)


def _std_streams() -> None:
    """Python-level std streams on fds 0/1/2: the interpreter's own where intact (the fork server's case), else new
    ones (a check_once caller may have replaced sys.stdout: pytest capture, say)."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        stream = getattr(sys, f"__{name}__")
        try:
            intact = type(stream) is io.TextIOWrapper and stream.fileno() == fd and not stream.closed
        except (OSError, ValueError):
            intact = False
        if not intact:
            stream = io.TextIOWrapper(io.FileIO(fd, mode, closefd=False), encoding="utf-8", errors="backslashreplace",
                                      line_buffering=fd == 2)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


_AUDIT_DENIED = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "socket.connect", "socket.bind", "socket.sendto",
    "socket.sendmsg", "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.chroot", "os.setuid", "os.setgid",
})
_AUDIT_PATH_EVENTS = MappingProxyType({  # event -> (path index, dir_fd index) pairs that must stay inside the sandbox
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "shutil.rmtree": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.truncate": ((0, None),), "os.utime": ((0, None),),
    "shutil.move": ((0, None), (1, None)), "shutil.copyfile": ((1, None),), "os.mkfifo": ((0, 2),),
    "os.mknod": ((0, 3),),
})  # a read-only view of a dict nothing else references: user code cannot change what the hook checks
_AUDIT_BOUND = (
    os.path.realpath, os.path.join, os.fsdecode, os.fspath, os.readlink, isinstance, len, int, PermissionError, os.sep,
    os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, frozenset({os.devnull}), _AUDIT_DENIED,
    _AUDIT_PATH_EVENTS,
)
_SANDBOX_REALPATH: str | None = None  # realpath(_SANDBOX_IN_TMPFS), resolved once by a fork server


def _make_audit_hook(sandbox: str) -> Any:
    """The second layer: refuse host-changing operations from Python code (the kernel layers are the first).

    Everything the hook uses is bound here, so patching builtins or ``os`` cannot open it up (a hook that raises
    fails closed: the audited operation is refused).
    """
    (realpath, join, fsdecode, fspath, readlink, isinstance_, len_, int_, PermissionError_, sep, writing,
     allowed_files, denied, path_events) = _AUDIT_BOUND  # immutable, built once per process
    prefix = (_SANDBOX_REALPATH if sandbox == _SANDBOX_IN_TMPFS and _SANDBOX_REALPATH else realpath(sandbox)) + sep

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


# What the harness binds before user code runs, looked up once per process (one tuple unpack in each child instead
# of two dozen attribute lookups, each dirtying a page or two of copy-on-write memory). A tuple cannot be changed,
# and rebinding this name from user code comes too late: the harness has unpacked it already.
_HARNESS_BOUND = (
    builtins.exec, builtins.compile, builtins.isinstance, builtins.issubclass, builtins.type, builtins.str,
    builtins.int, builtins.len, builtins.enumerate, builtins.zip, builtins.BaseException, builtins.AssertionError,
    builtins.SyntaxError, builtins.SystemExit, builtins.ValueError,
    BaseException.__dict__["__traceback__"].__get__,  # not a subclass's fake __traceback__ property
    os.write, os._exit, traceback.format_exception, traceback.format_exception_only, linecache.cache,
)


def _harness(req: Request, nonce: str, sandbox: str, layers: dict[str, bool]) -> NoReturn:
    """Compile and run solution, setup and tests; send exactly one verdict; exit like ``python`` would.

    Everything used after user code starts is bound to a local name first: user code can rebind builtins, module
    attributes (``os._exit``, ``traceback.*``) and even this module's globals (``Outcome``), but not our locals.
    Outcome names are sent as string literals for the same reason.
    """
    (exec_, compile_, isinstance_, issubclass_, type_, str_, int_, len_, enumerate_, zip_, BaseException_,
     AssertionError_, SyntaxError_, SystemExit_, ValueError_, get_tb, write, exit_, format_exception,
     format_exception_only, source_cache) = _HARNESS_BOUND
    sources = (_SOLUTION_FILE, req.solution), (_SETUP_FILE, req.setup)
    stdout, stderr = sys.stdout, sys.stderr
    verdict_fd, detail_chars, this_file, setup_file = _VERDICT_FD, DETAIL_CHARS, _THIS_FILE, _SETUP_FILE
    tests: tuple[str, ...] = req.tests
    test_files = _TEST_FILES[: len(tests)] if len(tests) <= len(_TEST_FILES) else \
        [_TEST_FILE.format(i) for i in range(len(tests))]

    def send(kind: str, payload: str) -> None:
        try:
            write(verdict_fd, f"{nonce} {kind} {payload}\n".encode("ascii"))
        except BaseException_:
            pass

    def describe(e: BaseException) -> str:
        try:
            text = format_exception_only(type_(e), e)[-1].strip()
        except BaseException_:
            try:
                text = type_(e).__name__
            except BaseException_:
                text = "exception"
        return text[:detail_chars]

    def innermost_file(e: BaseException) -> str | None:
        """Filename of the frame that raised: the last entry of the traceback chain."""
        name, tb = None, get_tb(e)
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
        return name

    def register_sources() -> None:
        """Put our sources in linecache so tracebacks show the offending lines, as ``python solution.py`` would.

        Done only when a traceback is printed: a passing check never pays for it, and user code cannot read the
        tests out of linecache."""
        try:
            for name, source in (*sources, *zip_(test_files, tests)):
                source_cache[name] = (len_(source), None, source.splitlines(True), name)
        except BaseException_:
            pass

    def print_traceback(e: BaseException, with_tb: bool = True) -> None:
        """What ``python solution.py`` would print to stderr for this uncaught exception."""
        try:
            stdout.flush()
        except BaseException_:
            pass
        register_sources()
        try:
            if issubclass_(type_(e), SystemExit_):
                code = e.code
                text = "" if code is None or isinstance_(code, int_) else f"{str_(code)}\n"
            else:
                tb = get_tb(e) if with_tb else None  # a compile error: python prints just the located message
                if tb is not None and tb.tb_frame.f_code.co_filename == this_file:
                    tb = tb.tb_next  # hide our exec() call, like the interpreter hides its own machinery
                text = "".join(format_exception(type_(e), e, tb))
        except BaseException_:
            text = f"Traceback (most recent call last):\n{describe(e)}\n"
        try:
            stderr.flush()
            write(2, text.encode("utf-8", "backslashreplace"))
        except BaseException_:
            pass

    def exit_code_for(e: BaseException) -> int:
        if issubclass_(type_(e), SystemExit_):
            try:
                code = e.code
                return 0 if code is None else (code & 0xFF if isinstance_(code, int_) else 1)
            except BaseException_:
                return 1
        return 1

    def finish(outcome: str, failed: int | None, detail: str, code: int) -> NoReturn:
        # No sys.settrace(None)/setprofile(None) here: the audit hook refuses both calls before they act (so user code
        # cannot have installed a tracer or profiler in the first place, and these calls could not remove one).
        for stream in (stdout, stderr):
            try:
                stream.flush()
            except BaseException_:
                pass
        try:
            hex_detail = detail[:detail_chars].encode("utf-8", "replace").hex()
        except BaseException_:
            hex_detail = ""
        send("V", f"{outcome} {-1 if failed is None else failed} {hex_detail}")
        exit_(code)

    if _REASONS and not all(layers.values()):  # why the missing layers are missing (rare: most checks skip this)
        why = "".join(f"{k}\t{v}\n" for k, v in _REASONS.items() if k in layers and not layers[k])
        send("W", why.encode("utf-8", "replace").hex())
    send("L", bytes(layers.values()).hex())  # one flag byte per LAYERS entry, in order
    if req.probe:
        finish("PASS", None, "probe", 0)

    try:
        solution_code = compile_(req.solution, _SOLUTION_FILE, "exec", dont_inherit=True)
    except (SyntaxError_, ValueError_) as e:  # ValueError: source contains NUL bytes
        print_traceback(e, with_tb=False)
        finish("SYNTAX_ERROR", None, describe(e), 1)
    try:
        setup_code = compile_(req.setup, _SETUP_FILE, "exec", dont_inherit=True) if req.setup else None
        test_codes = [compile_(t, f, "exec", dont_inherit=True) for f, t in zip(test_files, tests, strict=True)]
    except (SyntaxError_, ValueError_) as e:
        print_traceback(e, with_tb=False)
        finish("OTHER", None, f"the task's tests do not compile: {describe(e)}", 1)

    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": _SOLUTION_FILE, "__builtins__": builtins}
    sys.addaudithook(_make_audit_hook(sandbox))

    # ---- user code from here on: only locals below this line ----
    try:
        exec_(solution_code, namespace)
        if setup_code is not None:  # MBPP's test_setup_code is nearly always empty
            exec_(setup_code, namespace)
    except BaseException_ as e:
        print_traceback(e)
        finish("RUNTIME_ERROR", None, describe(e), exit_code_for(e))
    for i, code in enumerate_(test_codes):
        send("T", str_(i))  # progress: if the child dies in this test, the supervisor still knows which one
        try:
            exec_(code, namespace)
        except BaseException_ as e:
            print_traceback(e)
            try:
                test_side = issubclass_(type_(e), AssertionError_) and innermost_file(e) in (test_files[i], setup_file)
            except BaseException_:
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


# How outcomes are labelled (config verifier.outcome_labels; the config models keep the same values, checked equal by
# tests/test_sandbox_isolation.py: the sandbox runs without the config stack).
OUTCOME_LABELS: tuple[str, ...] = ("structured", "original")


def check_labels(labels: str) -> None:
    if labels not in OUTCOME_LABELS:
        raise ValueError(f"outcome_labels must be one of {', '.join(OUTCOME_LABELS)}, not {labels!r}")


def check_once(solution: str, test_list: Sequence[str], test_setup_code: str = "", *, timeout_s: float = 3.0,
               memory_mb: int = 1024, outcome_labels: str = "structured") -> Verdict:
    """Fork the child straight from the calling process (no server).

    Used by the agent program's python_test tool and the hidden shadow execution, which run in short-lived
    processes. Same child code path as :class:`Verifier`; imports the solution needs are not pre-warmed.
    """
    check_labels(outcome_labels)
    req = Request(solution, tuple(test_list), test_setup_code or "", float(timeout_s), int(memory_mb))
    return to_verdict(Raw.from_evidence(*_run(req)), req.timeout_s, outcome_labels)


_PROBED: Channel | None = None  # what a child forked from this process reported (probed once)


def isolation_report() -> dict[str, bool]:
    """Which isolation layers a child forked from this process gets on this machine (probed once, cached)."""
    return isolation_status()[0]


def isolation_status() -> tuple[dict[str, bool], dict[str, str]]:
    """isolation_report() and, for each inactive layer, why (as the child saw it, or why it does not apply)."""
    global _PROBED
    if _PROBED is None:
        _PROBED = Raw.from_evidence(*_run(PROBE)).parse()
    return _PROBED.status()


# --------------------------------------------------------------------------------------------------------------
# Fork server: `python -m predict.sandbox serve` (header-line requests on stdin, replies on stdout; format above)
# --------------------------------------------------------------------------------------------------------------


def serve(cpu: int | None = None) -> None:
    """Pre-import what solutions use, then fork one supervised child per request until stdin closes."""
    global _UNPIN
    import importlib

    if cpu is not None:  # this server runs on this CPU, and each child it forks starts there (see Verifier)
        try:
            _UNPIN = frozenset(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpu})
        except (AttributeError, OSError, ValueError):
            _UNPIN = None

    # Move the protocol off fds 0/1 so stray prints (ours or a library's) cannot corrupt it.
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # also every child's stdin
    os.dup2(devnull, 1)
    os.close(devnull)
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _enter_server_namespaces()
    _prepare_server()
    try:  # hand the allocator's free memory back (~1 MiB after the imports): fewer pages to map in every fork
        _load_libc().malloc_trim(0)
    except (AttributeError, TypeError):  # not glibc
        pass
    gc.freeze()  # children inherit these objects read-only: no GC pass touches (and copies) their pages
    reader = os.fdopen(proto_in, "rb", buffering=1 << 16)
    os.write(proto_out, b"ready\n")
    n = 0
    while True:
        try:
            req = _read_request(reader)
            if req is None:
                break
            reply = _reply_bytes(*_run(req))
        except Exception as e:
            reply = f"E {type(e).__name__}: {e}".replace("\n", " ").encode("utf-8", "replace") + b"\n"
        view = memoryview(reply)
        while view:
            view = view[os.write(proto_out, view):]
        n += 1
        if n % 1000 == 0:  # _run freezes before each fork; now and then let cyclic garbage be collected
            gc.unfreeze()
            gc.collect()


def _prepare_server() -> None:
    """Do once in the fork server what every child would otherwise redo (children inherit it all through fork).

    The server needs neither its environment (PYTHONPATH etc. were read at start-up) nor signal handlers, so they
    become exactly what a child must have; its std streams are checked to sit on fds 0/1/2; the sandbox dir's
    realpath, the libc functions and the fd limit are looked up.
    """
    global _SERVER_PREPARED, _SANDBOX_REALPATH, _NO_NEW_PRIVS
    _reset_signals()
    os.environ.clear()
    os.environ.update(_child_env(_SANDBOX_IN_TMPFS))  # children outside a private tmpfs fix HOME themselves
    _std_streams()  # fd 0 is /dev/null, 1 and 2 become pipes
    if "mnt" in _INHERITED_NS:
        _SANDBOX_REALPATH = os.path.realpath(_SANDBOX_IN_TMPFS)
    libc = _load_libc()
    _python_dirs()
    _nofile()
    _prepare_signal_filter()
    _NO_NEW_PRIVS = bool(libc) and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    _SERVER_PREPARED = True



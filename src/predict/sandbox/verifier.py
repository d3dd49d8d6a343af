"""`Verifier`: a pool of pre-warmed fork servers (`predict.sandbox.child.serve`), one per CPU, each one process
speaking the framed protocol of `predict.sandbox.child`; the parent side of every check a stage runs.
"""

from __future__ import annotations

# Only what fork servers and their children need (see "Cost per check" above): client-side modules (subprocess,
# threading, queue, tempfile) are imported where they are used; test_fork_server_stays_lean checks the server.
import math
import os
import select
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Literal

from predict.sandbox.child import (
    DETAIL_CHARS,
    PROBE,
    WITHOUT,
    Channel,
    Raw,
    Request,
    Verdict,
    check_labels,
    request_bytes,
    to_verdict,
)
from predict.vocabulary import Outcome


class _ServerDied(Exception):
    pass


class _Server:
    """One fork-server process and its framed protocol (see request_bytes), used by one thread at a time."""

    def __init__(self, cpu: int | None = None) -> None:
        import subprocess

        self.cpu = cpu

        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",  # string-set iteration order is the same in every check and every run
            "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p),  # find predict, installed or not
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if WITHOUT:  # a test that simulates a machine without some layers: the servers must simulate it too
            env["PREDICT_SANDBOX_WITHOUT"] = ",".join(sorted(WITHOUT))
        self.proc = subprocess.Popen(  # -P and cwd="/": don't put the caller's cwd (say, /tmp) on sys.path
            [sys.executable, "-P", "-m", "predict.sandbox", "serve", *([] if cpu is None else ["--cpu", str(cpu)])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, start_new_session=True, close_fds=True, cwd="/",
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out_fd = self.proc.stdout.fileno()
        self.buf = bytearray()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        if self._read_line(time.monotonic() + timeout_s) != b"ready":
            raise _ServerDied("fork server did not start")

    def request(self, req: Request) -> Raw:
        self.send(req)
        return self.receive(time.monotonic() + req.timeout_s + 30.0)

    def send(self, req: Request) -> None:
        assert self.proc.stdin is not None
        try:  # through the file object, not its fd: once close() has run, this raises instead of writing elsewhere
            self.proc.stdin.write(request_bytes(req))
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:
            raise _ServerDied(f"fork server gone: {e}") from e

    def receive(self, deadline: float) -> Raw:
        head = self._read_line(deadline)
        if head.startswith(b"E "):
            raise _ServerDied(f"fork server error: {head[2:].decode('utf-8', 'replace')}")
        try:
            f = head.decode("ascii").split()
            nonce, returncode, timed_out, cpu_s, cpu_limit_s, duration_s = \
                f[0], int(f[1]), f[2] == "1", float(f[3]), int(f[4]), float(f[5])
            sizes = [int(x) for x in f[6:9]]
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise _ServerDied(f"fork server sent a bad reply: {head[:200]!r}") from e
        body = self._read_exact(sum(sizes), deadline)
        a, b = sizes[0], sizes[0] + sizes[1]
        ev = (body[:a], returncode, timed_out, cpu_s, cpu_limit_s, duration_s, body[a:b], body[b:])
        return Raw.from_evidence(nonce, ev)

    def ready(self) -> bool:
        """Whether a whole reply header has arrived (for check_many's poll loop)."""
        return self.buf.find(b"\n") >= 0

    def fill(self) -> None:
        """Read what the server has sent so far (after poll said its fd is readable)."""
        try:
            if self.proc.stdout is None or self.proc.stdout.closed:
                raise OSError("closed")
            data = os.read(self.out_fd, 1 << 16)
        except OSError as e:  # closed under us (Verifier.close() from another thread)
            raise _ServerDied(f"fork server pipe unusable: {e}") from e
        if not data:
            raise _ServerDied(f"fork server exited with {self.proc.poll()}")
        self.buf += data

    def _wait(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _ServerDied("fork server did not answer in time")
        try:
            ready, _, _ = select.select([self.out_fd], [], [], remaining)
        except (OSError, ValueError) as e:  # closed under us (Verifier.close() from another thread)
            raise _ServerDied(f"fork server pipe unusable: {e}") from e
        if ready:
            self.fill()

    def _read_line(self, deadline: float) -> bytes:
        while (nl := self.buf.find(b"\n")) < 0:
            self._wait(deadline)
        return self._read_exact(nl + 1, deadline)[:-1]

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self._wait(deadline)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def close(self, grace_s: float = 2.0) -> None:
        """EOF ends the serve loop after the current check; SIGKILL if it lingers (children die by PDEATHSIG)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        import subprocess

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
    children run as nobody and cannot signal it) is replaced and the check retried once, then reported as OTHER.

    With ``pin_cpus`` (the default) and 2 or more workers, but no more than usable CPUs, server i runs on the i-th
    usable CPU and each of its children starts there: server and child mostly stay on one CPU (no cross-CPU wake-ups,
    the server's memory already in that CPU's cache): ~7% more checks/s on this idle 2-CPU VM, ~25% next to a CPU
    hog (MBPP gold, 2 workers). A child gets all the CPUs back at once, so the scheduler can still move a long check
    off a busy CPU (pinned for good, task 123 took 5 s instead of 2.5 s next to a CPU hog). ``pin_cpus=False`` leaves
    all placement to the scheduler.
    """

    def __init__(self, *, timeout_s: float = 3.0, memory_mb: int = 1024, workers: int = 1,
                 outcome_labels: str = "structured", pin_cpus: bool = True) -> None:
        check_labels(outcome_labels)
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.timeout_s, self.memory_mb, self.workers = float(timeout_s), int(memory_mb), int(workers)
        self.outcome_labels = outcome_labels
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        pinned: list[int | None] = cpus[: self.workers] if pin_cpus and 1 < self.workers <= len(cpus) \
            else [None] * self.workers
        import queue
        import threading

        self._lock = threading.Lock()
        self._servers: list[_Server] = []  # every live server, for close()
        self._idle: queue.Queue[_Server] = queue.Queue()
        self._closed = False
        self._last: Channel | None = None  # the most recent child's report of its layers (and why some are off)
        self._finalizer = weakref.finalize(self, _close_servers, self._servers)
        try:
            for cpu in pinned:  # start them all, then wait: startups overlap
                self._servers.append(_Server(cpu))
            for s in self._servers:
                s.wait_ready()
                self._idle.put(s)
        except (_ServerDied, OSError, ValueError) as e:
            self.close()
            raise RuntimeError(f"could not start the sandbox fork servers: {e}") from e

    def check(self, solution: str, test_list: Sequence[str], test_setup_code: str = "") -> Verdict:
        """Run one check on the next free server (blocks while all are busy)."""
        try:
            return self.check_many([(solution, test_list, test_setup_code)])[0]
        except _ServerDied as e:  # the pool was closed under the check (close() from another thread)
            return Verdict(Outcome.OTHER, str(e)[:DETAIL_CHARS], None, 0.0, "", "")

    def check_many(self, items: Iterable[tuple[str, Sequence[str], str]], *, progress: bool = False) -> list[Verdict]:
        """Check ``(solution, test_list, test_setup_code)`` items ``workers`` at a time; results in input order.

        One thread drives all the servers it can get (poll on their reply pipes): no worker threads, locks or futures
        per check, so the client takes as little CPU as possible from the checks it waits for.
        """
        import queue

        if self._closed:
            raise RuntimeError("Verifier is closed")
        items = list(items)
        results: list[Verdict | None] = [None] * len(items)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(items), desc="verifying", unit="check")
        todo = list(range(len(items) - 1, -1, -1))  # a stack of indices, first item on top
        busy: dict[int, tuple[_Server, int, float, bool]] = {}  # reply fd -> (server, item, deadline, retried)
        poller = select.poll()
        held: list[_Server] = []  # servers taken from the pool, given back at the end

        def start(server: _Server, i: int, retried: bool) -> None:
            s, t, setup = items[i]
            try:
                server.send(Request(s, tuple(t), setup or "", self.timeout_s, self.memory_mb))
            except _ServerDied as e:
                lost(server, i, retried, e)
                return
            busy[server.out_fd] = (server, i, time.monotonic() + self.timeout_s + 30.0, retried)
            poller.register(server.out_fd, select.POLLIN)

        def finish(i: int, verdict: Verdict) -> None:
            results[i] = verdict
            if bar is not None:
                bar.update(1)

        def lost(server: _Server, i: int, retried: bool, e: _ServerDied) -> None:
            """The server died with item i on it: a fresh server takes its place and retries the item once."""
            if self._closed:
                raise e
            server = self._replace(server, held)
            if retried:
                finish(i, Verdict(Outcome.OTHER, str(e)[:DETAIL_CHARS], None, 0.0, "", ""))
                start_next(server)
            else:
                start(server, i, True)

        def fail(fd: int, e: _ServerDied) -> None:
            server, i, _, retried = busy.pop(fd)
            poller.unregister(fd)
            lost(server, i, retried, e)

        def start_next(server: _Server) -> None:
            if todo:  # else the server waits in `held` until the end (todo never grows again)
                start(server, todo.pop(), False)

        try:
            while todo or busy:
                while todo and len(held) < self.workers:  # take servers: wait for one only if none is working
                    try:
                        server = self._idle.get(block=not busy)
                    except queue.Empty:
                        break
                    held.append(server)
                    start(server, todo.pop(), False)
                if not busy:
                    continue
                timeout = max(0.0, min(d for _, _, d, _ in busy.values()) - time.monotonic())
                events = poller.poll(math.ceil(timeout * 1000))
                if not events:
                    now = time.monotonic()
                    for fd in [fd for fd, (_, _, d, _) in busy.items() if d <= now]:
                        fail(fd, _ServerDied("fork server did not answer in time"))
                    continue
                for fd, _ in events:
                    server, i, deadline, _ = busy[fd]
                    try:
                        server.fill()
                        if not server.ready():
                            continue
                        raw = server.receive(deadline)  # the rest of the reply, if any, is on its way
                    except _ServerDied as e:
                        fail(fd, e)
                        continue
                    del busy[fd]
                    poller.unregister(fd)
                    channel = raw.parse()
                    if channel.layers:
                        self._last = channel
                    finish(i, to_verdict(raw, self.timeout_s, self.outcome_labels, channel))
                    start_next(server)
        finally:
            for server in held:
                self._idle.put(server)
            if bar is not None:
                bar.close()
        return results  # type: ignore[return-value]  # every slot is filled once the loop ends

    def isolation_report(self) -> dict[str, bool]:
        """The layers the most recent child of this pool reported (probes one if none ran yet)."""
        return self.isolation_status()[0]

    def isolation_status(self) -> tuple[dict[str, bool], dict[str, str]]:
        """isolation_report() and why each inactive layer is inactive (see check_isolation)."""
        if self._last is None or not self._last.layers:
            server = self._idle.get()
            try:
                self._last = server.request(PROBE).parse()
            finally:
                self._idle.put(server)
        return self._last.status()

    def _replace(self, dead: _Server, held: list[_Server]) -> _Server:
        """A fresh server takes the dead one's place in the pool and among those check_many ``held``."""
        with self._lock:
            try:
                dead.proc.kill()
            except OSError:
                pass
            dead.close(0.5)
            fresh = _Server(dead.cpu)
            fresh.wait_ready()
            self._servers[self._servers.index(dead)] = fresh
        held[held.index(dead)] = fresh
        return fresh

    def close(self) -> None:
        """Stop every server (and with them any running child); idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()




# The process's shared pools (`shared_verifier`): created on first use, closed at exit. A builtin lock, since the fork
# servers import this module and must not load threading (test_fork_server_stays_lean).
_SHARED: dict[tuple[float, int, str], Verifier] = {}
_SHARED_LOCK = __import__("_thread").allocate_lock()
_SHARED_AT_EXIT: list[bool] = []  # [True] once close_shared_verifiers is registered with atexit


def shared_verifier(*, timeout_s: float, memory_mb: int, outcome_labels: Literal["structured", "original"],
                    workers: int | None = None) -> Verifier:
    """The process's one `Verifier` for these settings, started on first use and reused by every later caller.

    For work that checks a few solutions at a time for a long while: the in-process agent episodes and their grading
    (`predict.env.harness`, `predict.env.taskset`) of every rollout batch a stage runs, so a pool's start-up (its
    fork servers' pre-imports) is paid once per process, not per batch or per episode. ``workers``: one fork server
    per usable CPU unless given (the first call's count holds for the pool). Thread-safe; the pools are closed when
    the process exits (and a closed one is replaced)."""
    key = (float(timeout_s), int(memory_mb), str(outcome_labels))
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None or pool._closed:
            if not _SHARED_AT_EXIT:
                import atexit

                atexit.register(close_shared_verifiers)
                _SHARED_AT_EXIT.append(True)
            usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            pool = _SHARED[key] = Verifier(timeout_s=timeout_s, memory_mb=memory_mb, outcome_labels=outcome_labels,
                                           workers=workers or max(1, usable))
        return pool


def close_shared_verifiers() -> None:
    """Close every shared pool (at exit; a later `shared_verifier` starts a new one)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()

"""Process helpers for the vLLM servers: the stdlib-only supervisor that leads a server's process group, the
PDEATHSIG hook, the /proc scans that find a group's live members, stopping a group, polling locks, free ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import math
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1

# Group leader between us and vLLM:
#   python -c SUPERVISOR <our pid or 0> <grace s> <lease lock file or ""> <idle s> <vLLM command...>
# Runs under the *server's* interpreter, so stdlib only.  On SIGTERM/SIGHUP/SIGINT (ours, or PDEATHSIG)
# or when its parent changes (we died), it TERMs vLLM, waits up to <grace> s, then SIGKILLs the whole
# process group, itself included.  If vLLM exits on its own it TERMs the stragglers and exits with its code.
# A shared server (parent 0, a lock file) instead stops once it has been idle: the lock file's mtime (the last
# lease's start or end) is older than <idle s> and no lease holds the lock (it takes the lock itself, so no job
# can lease a server that is going down), or the lock file is gone (nobody can find the server any more).
SUPERVISOR = """\
import fcntl, os, signal, subprocess, sys, time
parent, grace, lock, idle_s, cmd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5:]
child = None
def idle():
    try:
        if time.time() - os.stat(lock).st_mtime < idle_s:
            return False
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until this process dies
        return True
    except OSError:
        os.close(fd)
        return False
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
        if (parent and os.getppid() != parent) or (lock and idle()):
            down()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
try:
    os.killpg(0, signal.SIGTERM)
except OSError:
    pass
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_list() -> str:
    """CPUs this process may run on, as vLLM's VLLM_CPU_OMP_THREADS_BIND list ("0,1")."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cpus)


# The thread counts of the BLAS and OpenMP libraries in a CPU server's process: fixed, whoever starts it. Snakemake
# gives a job's processes OMP_NUM_THREADS=<the rule's threads> (and MKL_, OPENBLAS_, ...), so a server started inside
# a job ran MKL on one thread and one started from a shell on every core, and greedy rows differed where logits were
# near-tied: on 2026-12-05 CI's `verify-bundle --rerun 3` re-executed a test rollout with a token repeated 9 times
# where the campaign's row had 8, and checked out once these were 1 in the shell too. One is what every server of
# `all` has run with (its rules ask for one thread); vLLM's own kernels take their threads from
# VLLM_CPU_OMP_THREADS_BIND.
CPU_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                        "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def cpu_server_environment(kv_cache_gib: float) -> dict[str, str]:
    """What a CPU vLLM server's environment sets: one engine process, its KV cache, its OpenMP threads bound to this
    process's CPUs, and the libraries' thread counts (`CPU_THREAD_VARIABLES`)."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gib:g}",
            "VLLM_CPU_OMP_THREADS_BIND": cpu_list(), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            **dict.fromkeys(CPU_THREAD_VARIABLES, "1")}


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/<pid>/stat's fields after "(comm)": state ppid pgrp ... (field 3 on); [] when the process is gone.
    comm may contain spaces/parens, so the split is at the last ")"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()


def group_pids(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid`` (Linux /proc scan)."""
    out: list[int] = []
    for entry in os.scandir("/proc"):
        fields = _stat_fields(entry.name) if entry.name.isdigit() else []
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def pdeathsig_preexec(parent_pid: int) -> Any:
    """preexec_fn for Popen: SIGTERM the supervisor when our (creating) thread dies."""
    libc = ctypes.CDLL(None, use_errno=True)  # resolved before fork: nothing is loaded in the child
    prctl = libc.prctl

    def _fn() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # the supervisor turns it into a group kill
        if os.getppid() != parent_pid:  # parent died between fork and prctl
            os._exit(1)

    return _fn


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), None when it is gone or a
    zombie: with the pid it names one process, so a recycled pid is never taken for our server."""
    fields = _stat_fields(pid)
    return None if not fields or fields[0] == "Z" else int(fields[19])


def stop_group(pgid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM a server's process group (its supervisor stops vLLM), wait up to `timeout_s` for it to go, then
    SIGKILL what is left (children of the engine, or everything on timeout) and wait for init to reap the orphans."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)


def lock_fd(fd: int, wait_s: float = math.inf) -> bool:
    """Lock `fd` exclusively, polling rather than blocking (Ctrl-C still works while waiting); False when it is still
    locked after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)



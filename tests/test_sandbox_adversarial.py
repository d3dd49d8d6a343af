"""Hostile and broken solutions: each must get the right outcome class AND leave the host untouched.

Every case runs twice, through the fork-server pool (``Verifier``) and through ``check_once`` (fork from this
process). After each case the ``host`` fixture asserts: the sentinel files (one under pytest's tmp_path in /tmp,
one outside /tmp) are intact, nothing appeared under the host's /tmp or next to the sentinels, no sandbox child
outlived its check, this process is alive, and the pool still verifies a correct solution.

Placeholders in the programs: SENTINEL, SENTINEL_DIR, HOME_SENTINEL (files/dirs on the host), PROBE (a unique
/tmp path that must never appear on the host), PORT (a listening socket here that must see no connection).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from predict.sandbox import Verdict, Verifier, check_once, isolation_report, label_original
from predict.sandbox import verifier as verifier_module
from predict.vocabulary import Outcome

TIMEOUT_S = 3.0  # short, so the timeout cases stay quick; long enough for a loaded 2-core CI box
SECRET_NAME, SECRET_VALUE = "PREDICT_FAKE_API_KEY", "sk-test-do-not-leak-123"

F_OK = "def f(x):\n    return x * 2\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]
WRONG = "def f(x):\n    return x + 1\n"  # f(2) == 3: the first test's assert fails


@dataclass(frozen=True)
class Case:
    name: str
    solution: str
    expected: Outcome
    tests: list[str] = field(default_factory=lambda: list(TESTS))
    setup: str = ""
    original: Outcome | None = None  # expected under outcome_labels="original", when it differs or matters
    failed_test: int | None = -1  # -1: don't check
    stdout_lacks: str | None = None  # e.g. an atexit marker that must never be printed


CASES = [
    # --- ordinary outcomes --------------------------------------------------------------------------------------
    Case("correct", F_OK, Outcome.PASS, failed_test=None),
    Case("wrong_answer", WRONG, Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("second_test_fails", "def f(x):\n    return 4 if x == 2 else 0\n", Outcome.ASSERTION_FAILURE,
         failed_test=1),
    Case("syntax_error", "def f(x)\n    return x * 2\n", Outcome.SYNTAX_ERROR, original=Outcome.SYNTAX_ERROR),
    Case("indentation_error", "def f(x):\nreturn x * 2\n", Outcome.SYNTAX_ERROR, original=Outcome.SYNTAX_ERROR),
    Case("name_error", "def g(x):\n    return x * 2\n", Outcome.RUNTIME_ERROR, failed_test=0,
         original=Outcome.RUNTIME_ERROR),
    Case("zero_division", "def f(x):\n    return x / 0\n", Outcome.RUNTIME_ERROR, failed_test=0),
    Case("error_at_module_level", "import nonexistent_module_xyz\n" + F_OK, Outcome.RUNTIME_ERROR,
         failed_test=None),
    Case("solution_raises_assertion", "def f(x):\n    assert x > 100, 'too small'\n    return x * 2\n",
         Outcome.RUNTIME_ERROR, original=Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("setup_code_used", "def f(x):\n    return x * K\n", Outcome.PASS, setup="K = 2\n"),
    Case("setup_code_raises", F_OK, Outcome.RUNTIME_ERROR, setup="raise ValueError('broken fixture')\n"),
    Case("broken_test_is_other", F_OK, Outcome.OTHER, tests=["assert f(2) == == 4"]),
    Case("keyboard_interrupt", "def f(x):\n    raise KeyboardInterrupt\n", Outcome.RUNTIME_ERROR, failed_test=0),
    Case("custom_base_exception", "class Boom(BaseException):\n    pass\ndef f(x):\n    raise Boom()\n",
         Outcome.RUNTIME_ERROR, failed_test=0),
    Case("hostile_exception_str",
         "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no str for you')\n"
         "def f(x):\n    raise E()\n", Outcome.RUNTIME_ERROR, failed_test=0),
    Case("always_equal_object_known_limit",  # plain-Python semantics: documented limitation, not a sandbox escape
         "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n", Outcome.PASS),
    # --- resource exhaustion ----------------------------------------------------------------------------------
    Case("infinite_loop", "def f(x):\n    while True:\n        pass\n", Outcome.TIMEOUT, original=Outcome.TIMEOUT),
    Case("busy_cpu", "def f(x):\n    return sum(i * i for i in range(10 ** 12))\n", Outcome.TIMEOUT),
    Case("sleep_forever", "import time\ndef f(x):\n    time.sleep(3600)\n", Outcome.TIMEOUT),
    Case("memory_bomb_single", "def f(x):\n    return len(bytearray(64 * 1024 ** 3))\n", Outcome.RUNTIME_ERROR,
         failed_test=0),
    Case("memory_bomb_loop", "def f(x):\n    a = []\n    while True:\n        a.append(bytes(10 ** 8))\n",
         Outcome.RUNTIME_ERROR, failed_test=0),
    Case("huge_output_then_correct", "def f(x):\n    print('x' * 20_000_000)\n    return x * 2\n", Outcome.PASS),
    Case("endless_output", "def f(x):\n    while True:\n        print('y' * 10000)\n", Outcome.TIMEOUT),
    Case("recursion_overflow", "def f(x):\n    return f(x + 1)\n", Outcome.RUNTIME_ERROR, failed_test=0),
    Case("deep_recursion_segfault",  # recursion limit lifted, then C-level recursion (== on nested lists) overflows
         "import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(x):\n    a = []\n    for _ in range(2 * 10 ** 5):\n"
         "        a = [a]\n    return a == [a]\n",
         Outcome.RUNTIME_ERROR, failed_test=0),
    Case("huge_file_in_sandbox", "def f(x):\n    open('big', 'wb').write(b'0' * (64 * 1024 ** 2))\n    return x * 2\n",
         Outcome.RUNTIME_ERROR, failed_test=0),
    # --- processes, signals, network --------------------------------------------------------------------------
    Case("fork_bomb", "import os\nwhile True:\n    os.fork()\n", Outcome.RUNTIME_ERROR),
    Case("subprocess_run", "import subprocess\nsubprocess.run(['touch', 'PROBE'])\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("os_system", "import os\nos.system('touch PROBE')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("kill_parent", "import os\nos.kill(os.getppid(), 9)\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("killpg_parent", "import os\nos.killpg(os.getpgid(os.getppid()), 9)\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("kill_parent_via_ctypes", "import ctypes, os\nctypes.CDLL(None).kill(os.getppid(), 9)\n" + F_OK,
         Outcome.RUNTIME_ERROR),
    Case("kill_parent_via_pidfd",  # no audit event covers pidfds: the privilege drop and signal_filter stop it
         "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)\n" + F_OK,
         Outcome.RUNTIME_ERROR),
    Case("kill_parent_via_proc_pidfd",  # an open /proc/<pid> dir is a pidfd too (a read-only open passes the hook)
         "import os, signal\nsignal.pidfd_send_signal(os.open(f'/proc/{os.getppid()}', os.O_RDONLY), signal.SIGKILL)\n"
         + F_OK, Outcome.RUNTIME_ERROR),
    Case("kill_everything_swallowed",  # the hook refuses; with it gone the kernel still would (we run as nobody)
         "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
         "    except Exception:\n        pass\n" + F_OK, Outcome.PASS),
    Case("self_alarm_signal", "import signal\nsignal.alarm(1)\ndef f(x):\n    while True:\n        pass\n",
         Outcome.RUNTIME_ERROR, failed_test=0),  # killed by SIGALRM while test 0 ran
    Case("network_connect", "import socket\ns = socket.create_connection(('127.0.0.1', PORT), timeout=1)\n" + F_OK,
         Outcome.RUNTIME_ERROR),
    Case("network_connect_swallowed",
         "import socket\ntry:\n    socket.create_connection(('127.0.0.1', PORT), timeout=1)\nexcept OSError:\n"
         "    pass\n" + F_OK, Outcome.PASS),
    Case("thread_escape",
         "import threading, time\ndef spin():\n    while True:\n        open('SENTINEL', 'w').write('pwned')\n"
         "threading.Thread(target=spin, daemon=True).start()\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("thread_escape_swallowed",
         "import threading\ntry:\n    threading.Thread(target=lambda: open('SENTINEL', 'w'), daemon=True).start()\n"
         "except RuntimeError:\n    pass\n" + F_OK, Outcome.PASS),
    Case("read_stdin", "def f(x):\n    return int(input())\n", Outcome.RUNTIME_ERROR, failed_test=0),
    Case("read_stdin_empty", "import sys\nDATA = sys.stdin.read()\ndef f(x):\n    return x * 2 + len(DATA)\n",
         Outcome.PASS),
    # --- the host's files -------------------------------------------------------------------------------------
    Case("write_outside_sandbox", "open('SENTINEL_DIR/created.txt', 'w').write('x')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("overwrite_sentinel", "open('SENTINEL', 'w').write('pwned')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("delete_sentinel", "import os\nos.remove('SENTINEL')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("delete_home_sentinel", "import os\nos.remove('HOME_SENTINEL')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("rmtree_outside", "import shutil\nshutil.rmtree('SENTINEL_DIR')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("rename_sentinel", "import os\nos.rename('HOME_SENTINEL', 'HOME_SENTINEL.moved')\n" + F_OK,
         Outcome.RUNTIME_ERROR),
    Case("write_tmp", "open('PROBE', 'w').write('x')\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("write_tmp_dir_fd_bypass",  # slips past the audit hook (relative path + dir_fd): the private tmpfs holds
         "import os\nfd = os.open('/tmp', os.O_RDONLY)\n"
         "w = os.open(os.path.basename('PROBE'), os.O_WRONLY | os.O_CREAT, dir_fd=fd)\nos.write(w, b'x')\n" + F_OK,
         Outcome.PASS),
    Case("write_in_sandbox_is_fine", "open('scratch.txt', 'w').write('ok')\nimport os\nos.mkdir('d')\n"
         "os.remove('scratch.txt')\n" + F_OK, Outcome.PASS),
    Case("chdir_then_relative_write", "import os\nos.chdir('SENTINEL_DIR')\nopen('rel.txt', 'w').write('x')\n" + F_OK,
         Outcome.RUNTIME_ERROR),
    Case("chdir_and_atexit_pass", "import os, atexit\nos.chdir('/')\natexit.register(lambda: print('ATEXIT-RAN'))\n"
         + F_OK, Outcome.PASS, stdout_lacks="ATEXIT-RAN"),
    Case("atexit_cannot_rescue",
         "import atexit, os\natexit.register(lambda: print('ATEXIT-RAN'))\natexit.register(os._exit, 0)\n" + WRONG,
         Outcome.ASSERTION_FAILURE, stdout_lacks="ATEXIT-RAN"),
    Case("env_secret_invisible",
         "import os\ndef f(x):\n    assert 'SECRET_NAME' not in os.environ\n"
         "    try:\n        raw = open('/proc/self/environ', 'rb').read()\n    except OSError:\n        raw = b''\n"
         "    assert b'SECRET_VALUE' not in raw\n    return x * 2\n", Outcome.PASS),
    # --- exiting instead of failing -----------------------------------------------------------------------------
    Case("os_exit_in_test", "import os\ndef f(x):\n    os._exit(0)\n", Outcome.OTHER, original=Outcome.PASS,
         failed_test=0),
    Case("sys_exit_in_test", "import sys\ndef f(x):\n    sys.exit(0)\n", Outcome.RUNTIME_ERROR, original=Outcome.PASS,
         failed_test=0),
    Case("sys_exit_module_level", "import sys\nsys.exit(0)\n" + F_OK, Outcome.RUNTIME_ERROR, original=Outcome.PASS,
         failed_test=None),
    Case("close_verdict_fds", "import os\nos.closerange(3, 1024)\n" + F_OK, Outcome.OTHER),
    Case("flood_verdict_pipe",  # the verdict pipe is non-blocking: flooding it loses the verdict, quickly
         "import os\ntry:\n    os.write(3, b'x' * 200_000)\nexcept OSError:\n    pass\n" + F_OK, Outcome.OTHER),
    # --- forging PASS / tampering with the harness --------------------------------------------------------------
    Case("print_fake_verdict",
         "import sys\nprint('PASS')\nprint('{\"outcome\": \"PASS\"}')\nsys.stderr.write('PASS\\n')\n" + WRONG,
         Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("spray_fake_verdicts_on_fds",
         "import os\nfor fd in range(0, 64):\n    for line in (b'PASS\\n', b'0' * 32 + b' V PASS -1 \\n'):\n"
         "        try:\n            os.write(fd, line)\n        except OSError:\n            pass\n" + WRONG,
         Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("patch_assertion_error", "import builtins\nbuiltins.AssertionError = Exception\n" + WRONG,
         Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("patch_builtins_wholesale",
         "import builtins\nfor n in ('print', 'exec', 'compile', 'len', 'type', 'str', 'isinstance', 'issubclass',\n"
         "          'enumerate', 'BaseException', 'SystemExit'):\n    setattr(builtins, n, None)\n" + WRONG,
         Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("patch_sys_exit_and_hooks",
         "import sys\nsys.exit = lambda *a: None\nsys.excepthook = lambda *a: None\n"
         "sys.stdout = open('/dev/null', 'w')\n" + WRONG, Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("patch_os_and_traceback",
         "import os, traceback\nos._exit = lambda c: None\nos.write = lambda fd, b: len(b)\n"
         "traceback.format_exception = lambda *a, **k: ['PASS']\n" + WRONG, Outcome.ASSERTION_FAILURE, failed_test=0),
    Case("patch_harness_module_globals",
         "import sys\nfor m in list(sys.modules.values()):\n    if hasattr(m, 'Outcome') and hasattr(m, 'Verdict'):\n"
         "        class Fake:\n            PASS = RUNTIME_ERROR = ASSERTION_FAILURE = OTHER = SYNTAX_ERROR = 'PASS'\n"
         "        m.Outcome = Fake\n        m._VERDICT_FD = 1\n" + "def f(x):\n    raise ValueError(x)\n",
         Outcome.RUNTIME_ERROR, failed_test=0),
    Case("assertion_error_subclass_trick",
         "class Fake(AssertionError):\n    pass\ndef f(x):\n    raise Fake('looks like a test failure')\n",
         Outcome.RUNTIME_ERROR, failed_test=0),
    Case("settrace_refused", "import sys\nsys.settrace(lambda *a: None)\n" + F_OK, Outcome.RUNTIME_ERROR),
    Case("gc_introspection_refused", "import gc\nobjs = gc.get_objects()\n" + F_OK, Outcome.RUNTIME_ERROR),
]
assert len({c.name for c in CASES}) == len(CASES) >= 25


# ------------------------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secret_env() -> Iterator[None]:
    """A fake secret in this process's environment, set before the pool starts: solutions must not see it."""
    os.environ[SECRET_NAME] = SECRET_VALUE
    yield
    os.environ.pop(SECRET_NAME, None)


@pytest.fixture(scope="module")
def pool(secret_env: None) -> Iterator[Verifier]:
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        yield v


@dataclass
class Host:
    sentinel: Path
    home_sentinel: Path
    probe: Path
    port: int

    def render(self, text: str) -> str:
        for key, value in (("HOME_SENTINEL", self.home_sentinel), ("SENTINEL_DIR", self.sentinel.parent),
                           ("SENTINEL", self.sentinel), ("PROBE", self.probe),
                           ("PORT", self.port), ("SECRET_NAME", SECRET_NAME), ("SECRET_VALUE", SECRET_VALUE)):
            text = text.replace(key, str(value))
        return text


def _children_of(parents: set[int]) -> list[int]:
    """Live (non-zombie) processes whose parent is one of ``parents``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) in parents and fields[0] != "Z":
            found.append(int(entry))
    return found


@pytest.fixture
def host(tmp_path: Path, pool: Verifier) -> Iterator[Host]:
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("original")
    home_dir = Path(tempfile.mkdtemp(prefix=".predict-sandbox-test-", dir=Path.home()))  # outside /tmp
    home_sentinel = home_dir / "sentinel.txt"
    home_sentinel.write_text("original")
    probe = Path(tempfile.gettempdir()) / f"predict-probe-{uuid.uuid4().hex}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    # this process's children from before the case that are not the pool's (a session vLLM server another test file
    # started: the README's test command runs every file in one process): not the sandbox's, so not leaks
    pools = (pool, *(p for p in verifier_module._SHARED.values() if not p._closed))
    others = set(_children_of({os.getpid()})) - {s.proc.pid for p in pools for s in p._servers}
    try:
        yield Host(sentinel, home_sentinel, probe, listener.getsockname()[1])
        # The host is untouched ...
        assert sentinel.read_text() == "original"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sentinel.txt"]
        assert home_sentinel.read_text() == "original"
        assert sorted(p.name for p in home_dir.iterdir()) == ["sentinel.txt"]
        assert not probe.exists(), "a file written to /tmp inside the sandbox reached the host"
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected to us
        # ... no sandbox child outlived its check ...
        # (the process's shared pools, `shared_verifier`, stay up for the session's in-process episodes: their idle
        # fork servers are this process's children too, and none of their checks may outlive it either)
        shared = [p for p in verifier_module._SHARED.values() if not p._closed]
        servers = {s.proc.pid for p in (pool, *shared) for s in p._servers}
        assert sorted(set(_children_of(servers | {os.getpid()})) - others) == sorted(servers)
        # ... and both this process and the pool still work.
        assert pool.check(F_OK, TESTS).outcome is Outcome.PASS
    finally:
        listener.close()
        for p in home_dir.iterdir():
            p.unlink()
        home_dir.rmdir()


def _run(runner: str, pool: Verifier, case: Case, host: Host, labels: str = "structured") -> Verdict:
    solution, tests, setup = host.render(case.solution), [host.render(t) for t in case.tests], host.render(case.setup)
    if runner == "pool" and labels == "structured":
        return pool.check(solution, tests, setup)
    return check_once(solution, tests, setup, timeout_s=TIMEOUT_S, outcome_labels=labels)


# ------------------------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("runner", ["pool", "once"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_adversarial(case: Case, runner: str, pool: Verifier, host: Host) -> None:
    verdict = _run(runner, pool, case, host)
    assert verdict.outcome is case.expected, verdict
    if case.failed_test != -1:
        assert verdict.failed_test == case.failed_test, verdict
    if case.stdout_lacks:
        assert case.stdout_lacks not in verdict.stdout
    if verdict.outcome is Outcome.TIMEOUT:
        assert TIMEOUT_S - 0.1 <= verdict.duration_s < TIMEOUT_S + 1.5
    # A Python-style traceback on stderr (the 'original' labeller reads it), except where python prints none
    # (killed by a signal, SystemExit) or the solution replaced the traceback machinery it shares with us.
    no_traceback = {"deep_recursion_segfault", "self_alarm_signal", "sys_exit_in_test", "sys_exit_module_level",
                    "patch_os_and_traceback"}
    if verdict.outcome in (Outcome.RUNTIME_ERROR, Outcome.ASSERTION_FAILURE) and case.name not in no_traceback:
        assert "Traceback (most recent call last):" in verdict.stderr, verdict
    if verdict.outcome is Outcome.SYNTAX_ERROR:
        assert 'File "solution.py", line' in verdict.stderr and "Error" in verdict.stderr, verdict


ORIGINAL_CASES = [c for c in CASES if c.original is not None]


@pytest.mark.parametrize("case", ORIGINAL_CASES, ids=[c.name for c in ORIGINAL_CASES])
def test_original_labels_reproduce_the_heuristic(case: Case, pool: Verifier, host: Host) -> None:
    """outcome_labels='original' feeds (exit code, stderr, timed out) to the study's heuristic, warts and all."""
    verdict = _run("once", pool, case, host, labels="original")
    assert verdict.outcome is case.original, verdict


def test_original_labels_through_the_pool(host: Host) -> None:
    with Verifier(timeout_s=TIMEOUT_S, outcome_labels="original") as v:
        assert v.check("def f(x):\n    assert x > 100\n", TESTS).outcome is Outcome.ASSERTION_FAILURE
        assert v.check(F_OK, TESTS).outcome is Outcome.PASS
        assert v.check("import os\ndef f(x):\n    os._exit(0)\n", TESTS).outcome is Outcome.PASS


@pytest.mark.parametrize(("rc", "stderr", "timed_out", "expected"), [
    (0, "", True, Outcome.TIMEOUT),
    (0, "AssertionError", False, Outcome.PASS),
    (1, '  File "solution.py", line 1\nSyntaxError: invalid syntax', False, Outcome.SYNTAX_ERROR),
    (1, "IndentationError: expected an indented block", False, Outcome.SYNTAX_ERROR),
    (1, "Traceback ...\nAssertionError", False, Outcome.ASSERTION_FAILURE),
    (1, "Traceback ...\nZeroDivisionError: division by zero", False, Outcome.RUNTIME_ERROR),
    (-11, "", False, Outcome.RUNTIME_ERROR),
    (None, "", False, Outcome.RUNTIME_ERROR),
])
def test_label_original(rc: int | None, stderr: str, timed_out: bool, expected: Outcome) -> None:
    assert label_original(rc, stderr, timed_out) is expected


def test_tracebacks_look_like_python(pool: Verifier) -> None:
    v = pool.check("def f(x):\n    return x / 0\n", TESTS)
    assert v.stderr.startswith("Traceback (most recent call last):\n")
    assert 'File "<test 0>", line 1' in v.stderr and 'File "solution.py", line 2, in f' in v.stderr
    assert "return x / 0" in v.stderr and v.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "predict/sandbox" not in v.stderr  # the harness's own frame (predict/sandbox/child.py) is hidden
    assert v.detail == "ZeroDivisionError: division by zero" and v.failed_test == 0
    a = pool.check(WRONG, TESTS)
    assert a.detail == "test 0 failed: assert f(2) == 4" and a.stderr.rstrip().endswith("AssertionError")


def test_output_is_captured_and_capped(pool: Verifier) -> None:
    v = pool.check("print('hello')\nimport sys\nprint('oops', file=sys.stderr)\n" + F_OK, TESTS)
    assert v.outcome is Outcome.PASS and v.stdout == "hello\n" and v.stderr == "oops\n"
    big = pool.check("def f(x):\n    print('z' * 5_000_000 + 'END')\n    return x * 2\n", TESTS)
    assert big.outcome is Outcome.PASS and len(big.stdout) <= 64 * 1024 and big.stdout.endswith("zzEND\n")


def test_isolation_layers_active_here() -> None:
    report = isolation_report()
    for layer in ("setsid", "rlimits", "pdeathsig", "signal_filter", "env_scrubbed", "audit_hook"):
        assert report[layer], report
    if os.geteuid() == 0:  # this machine: all kernel layers must be on
        for layer in ("mount_namespace", "private_tmp", "net_namespace", "dropped_privileges"):
            assert report[layer], report
    else:  # unprivileged (CI runs this as a user it creates): the user-namespace set
        for layer in ("user_namespace", "mount_namespace", "private_tmp", "net_namespace"):
            assert report[layer], report
    assert isinstance(report, dict) and all(isinstance(v, bool) for v in report.values())
    pool_report = Verifier(workers=1)
    try:
        assert pool_report.isolation_report()["net_namespace"] == report["net_namespace"]
    finally:
        pool_report.close()


def test_children_run_unprivileged_without_network() -> None:
    probe = (
        "import os, socket\nUID = os.getuid()\nIFACES = sorted(os.listdir('/sys/class/net'))\n"
        "TMP = sorted(os.listdir('/tmp'))\nCWD = os.getcwd()\nENV = dict(os.environ)\n"
    )
    tests = ["assert UID == 65534, UID", "assert CWD.startswith('/tmp/'), CWD",
             "assert set(ENV) <= {'PATH', 'LANG', 'HOME'}, ENV", "assert ENV['HOME'] == CWD, (ENV, CWD)",
             "assert os.listdir('.') == [], os.listdir('.')"]
    if os.geteuid() != 0:
        pytest.skip("privilege drop is only done when the verifier runs as root")
    for runner in (lambda s, t: check_once(s, t), None):
        if runner is None:
            with Verifier() as v:
                verdict = v.check(probe, tests)
        else:
            verdict = runner(probe, tests)
        assert verdict.outcome is Outcome.PASS, verdict


# A checkout or venv under /tmp (a clone in `mktemp -d`) is bound back, read-only, into the sandbox's private /tmp, at
# its own path, so the child can import from it: the way to it (root's, mode 755) is in /tmp, but it is not litter.
_PY_DIRS = {os.path.realpath(p) for p in (*sys.path, sys.prefix, sys.base_prefix, *sysconfig.get_paths().values())
            if p and os.path.isdir(p)}
KEPT_IN_TMP = sorted({p.split(os.sep)[2] for p in _PY_DIRS if p.startswith("/tmp/")})


def test_checks_do_not_see_each_other(pool: Verifier) -> None:
    """Files one check leaves in its sandbox or /tmp are gone before the next check (same server or not)."""
    writer = "import os\nopen('left.txt', 'w').write('x')\nos.close(os.open('/tmp', os.O_RDONLY))\n" + F_OK
    reader = (f"import os, glob\nLEFT = sorted(n for n in os.listdir('/tmp') if n not in {KEPT_IN_TMP!r})"
              "\nLEFT += glob.glob('/tmp/sandbox/**', recursive=True)\n" + F_OK)
    for _ in range(4):
        assert pool.check(writer, TESTS).outcome is Outcome.PASS
    v = pool.check(reader, [*TESTS, "assert LEFT == ['sandbox', '/tmp/sandbox/'], LEFT"])
    assert v.outcome is Outcome.PASS, v


@pytest.mark.skipif(not KEPT_IN_TMP, reason="Python and this checkout are not under /tmp here")
@pytest.mark.parametrize("runner", ["pool", "once"])
def test_python_under_tmp_is_bound_back_read_only(runner: str, pool: Verifier) -> None:
    """A checkout and venv under /tmp stay importable in the private /tmp, and read-only: a check cannot change the
    harness's own code or leave anything on the way to it."""
    if not isolation_report()["private_tmp"]:
        pytest.skip("no private tmpfs on this machine")
    target = next(p for p in sorted(_PY_DIRS) if p.startswith("/tmp/"))
    top = os.path.join("/tmp", KEPT_IN_TMP[0])
    solution = f"""import os
def attempt(d):
    try:
        fd = os.open(d, os.O_RDONLY)
        os.close(os.open('predict-probe', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
        return 'written'
    except OSError as e:
        return e.errno
INSIDE, WAY = attempt({target!r}), attempt({top!r})
VISIBLE = os.path.isdir({target!r})
""" + F_OK
    tests = [*TESTS, "assert VISIBLE", "import errno\nassert INSIDE in (errno.EROFS, errno.EACCES), INSIDE"]
    if os.geteuid() == 0:  # unprivileged, the child made the way itself, in a tmpfs that dies with it
        tests.append("import errno\nassert WAY in (errno.EROFS, errno.EACCES), WAY")
    verdict = pool.check(solution, tests) if runner == "pool" else check_once(solution, tests, timeout_s=TIMEOUT_S)
    assert verdict.outcome is Outcome.PASS, verdict
    assert not os.path.lexists(os.path.join(target, "predict-probe"))


# Litter that checks leave through the kernel (os.open with dir_fd slips past the audit hook): in the scratch dirs, in
# their own sandbox dir (cwd), and on the sandbox dir itself. Their tests prove it all happened.
SCRATCH_DIRS = tuple(d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.isdir(d))  # world-writable
LITTER_SCRATCH = f"""import os
for d in {SCRATCH_DIRS!r}:
    fd = os.open(d, os.O_RDONLY)
    os.close(os.open('left-' + d.strip('/').replace('/', '-'), os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    os.close(fd)
LEFT = {{d: sorted(n for n in os.listdir(d) if n not in {KEPT_IN_TMP!r}) for d in {SCRATCH_DIRS!r}}}
"""
LITTER_SCRATCH_TESTS = ["assert LEFT['/tmp'] == ['left-tmp', 'sandbox'], LEFT"] + [
    f"assert LEFT[{d!r}] == ['left-{d.strip('/').replace('/', '-')}'], LEFT" for d in SCRATCH_DIRS if d != "/tmp"]
LITTER_CWD = """import os
open('left.txt', 'w').write('x')
open('.hidden', 'w').write('x')
os.makedirs('d/e')
open('d/e/f.txt', 'w').write('x')
os.mkdir('locked')
open('locked/inner', 'w').write('x')
os.chmod('locked', 0)
os.mkfifo('fifo')
os.symlink('/etc/passwd', 'link')
"""
LITTER_CWD_TESTS = ["assert sorted(os.listdir('.')) == ['.hidden', 'd', 'fifo', 'left.txt', 'link', 'locked']"]
LITTER_META = """import os, stat
os.chmod('.', 0o751)
try:
    os.setxattr('.', 'user.predict', b'left')
except OSError:  # no user xattrs on this tmpfs
    pass
"""
LITTER_META_TESTS = ["assert stat.S_IMODE(os.stat('.').st_mode) == 0o751"]
LITTERERS = {
    "everywhere": (LITTER_SCRATCH + LITTER_CWD + LITTER_META, LITTER_SCRATCH_TESTS + LITTER_CWD_TESTS + LITTER_META_TESTS),
    "scratch_only": (LITTER_SCRATCH, LITTER_SCRATCH_TESTS),  # an empty cwd: the cheap path must still catch these
    "cwd_only": (LITTER_CWD, LITTER_CWD_TESTS),
    "metadata_only": (LITTER_META, LITTER_META_TESTS),  # nothing to delete, but the dir itself was changed
}
# What the next check in the same server must see instead: nothing, and a sandbox dir made fresh for it.
INSPECTOR = f"""import os, stat
CWD, HERE = os.getcwd(), sorted(os.listdir('.'))
SCRATCH = {{d: sorted(n for n in os.listdir(d) if n not in {KEPT_IN_TMP!r}) for d in {SCRATCH_DIRS!r}}}
MODE = stat.S_IMODE(os.stat('.').st_mode)
XATTRS = os.listxattr('.')
""" + F_OK
PRISTINE = ["assert CWD == '/tmp/sandbox', CWD", "assert HERE == [], HERE",
            f"assert SCRATCH == {({d: ['sandbox'] if d == '/tmp' else [] for d in SCRATCH_DIRS})!r}, SCRATCH",
            "assert MODE == 0o700, oct(MODE)", "assert XATTRS == [], XATTRS"]


@pytest.mark.parametrize("litter", list(LITTERERS))
def test_same_server_checks_do_not_see_each_other(litter: str) -> None:
    """One fork server runs every check here: whatever a check leaves (in /tmp, /var/tmp, /dev/shm, /run/lock, its
    cwd, or on its sandbox dir itself) is gone before the next one, after a littering check and after a clean one
    (the cheap path that only confirms the scratch space is empty)."""
    if not isolation_report()["private_tmp"] or os.geteuid() != 0:
        pytest.skip("the fork server only has its own tmpfs (and wipes it) when it runs as root")
    solution, tests = LITTERERS[litter]
    with Verifier(timeout_s=TIMEOUT_S, workers=1) as v:
        for _ in range(3):
            dirty = v.check(solution + F_OK, [*TESTS, *tests])
            assert dirty.outcome is Outcome.PASS, dirty
            for _ in range(2):  # right after the litter, then after a clean check
                clean = v.check(INSPECTOR, [*TESTS, *PRISTINE])
                assert clean.outcome is Outcome.PASS, clean


@pytest.mark.parametrize("runner", ["pool", "once"])
def test_world_writable_host_dirs_stay_untouched(runner: str, pool: Verifier) -> None:
    """Through dir_fd (which the audit hook cannot follow) a check running as nobody can create files in any
    world-writable directory: each of them must be a private tmpfs, not the host's."""
    if not isolation_report()["private_tmp"]:
        pytest.skip("no private tmpfs on this machine")
    name = f"predict-probe-{uuid.uuid4().hex}"
    solution = (f"import os\nfor d in {SCRATCH_DIRS!r}:\n    fd = os.open(d, os.O_RDONLY)\n"
                f"    os.close(os.open({name!r}, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))\n" + F_OK)
    tests = [*TESTS, f"assert all({name!r} in os.listdir(d) for d in {SCRATCH_DIRS!r})"]
    try:
        verdict = pool.check(solution, tests) if runner == "pool" else check_once(solution, tests, timeout_s=TIMEOUT_S)
        assert verdict.outcome is Outcome.PASS, verdict  # the files were made (in the sandbox's own tmpfs) ...
        assert [d for d in SCRATCH_DIRS if os.path.lexists(os.path.join(d, name))] == []  # ... not on the host
    finally:
        for d in SCRATCH_DIRS:
            if os.path.lexists(os.path.join(d, name)):
                os.unlink(os.path.join(d, name))


def test_fork_server_stays_lean() -> None:
    """Fork servers must not load modules that make every fork dearer (threading's after-fork hook alone costs each
    child ~0.3 ms; argparse/shutil drag in compression libraries whose mappings every fork copies). A child sees
    exactly its server's sys.modules."""
    probe = "import sys\nMODULES = set(sys.modules)\n"
    heavy = ["threading", "subprocess", "concurrent.futures", "logging", "tempfile", "secrets", "queue", "argparse",
             "shutil", "zlib", "lzma", "bz2", "asyncio", "multiprocessing"]
    with Verifier(timeout_s=TIMEOUT_S, workers=1) as v:
        verdict = v.check(probe, [f"assert not MODULES & {set(heavy)!r}, MODULES & {set(heavy)!r}",
                                  "assert 're' in MODULES and 'collections' in MODULES"])
    assert verdict.outcome is Outcome.PASS, verdict


def test_pool_pins_servers_to_distinct_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 usable CPUs")
    probe = "import os\nCPUS = sorted(os.sched_getaffinity(0))\n"
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        pinned = [os.sched_getaffinity(s.proc.pid) for s in v._servers]
        assert pinned == [{cpus[0]}, {cpus[1]}], pinned
        # A child starts on its server's CPU but gets them all back: a long check can leave a busy CPU.
        verdict = v.check(probe, [f"assert CPUS == {cpus!r}, CPUS"])
        assert verdict.outcome is Outcome.PASS, verdict
    with Verifier(timeout_s=TIMEOUT_S, workers=2, pin_cpus=False) as v:
        assert all(os.sched_getaffinity(s.proc.pid) == set(cpus) for s in v._servers)


def test_the_shared_pool_starts_once_per_process_and_settings() -> None:
    """Issue 41: the in-process episodes and their grading check through one pool per process and sandbox settings
    (`shared_verifier`), started on first use and reused by every later batch; other settings get their own; a
    closed pool is replaced, and closing them all leaves none running."""
    from predict.sandbox import close_shared_verifiers, shared_verifier

    settings = {"timeout_s": TIMEOUT_S, "memory_mb": 512, "outcome_labels": "structured"}
    first = shared_verifier(**settings)
    try:
        pids = [s.proc.pid for s in first._servers]
        assert len(pids) == len(os.sched_getaffinity(0))  # a fork server per usable CPU
        assert shared_verifier(**settings) is first and [s.proc.pid for s in first._servers] == pids
        assert first.check("def f():\n    return 1\n", ["assert f() == 1"]).outcome is Outcome.PASS
        other = shared_verifier(**{**settings, "outcome_labels": "original"})
        assert other is not first and other.outcome_labels == "original"
        first.close()
        again = shared_verifier(**settings)
        assert again is not first and again.check("x = 1", ["assert x == 2"]).outcome is Outcome.ASSERTION_FAILURE
    finally:
        close_shared_verifiers()
    assert first._closed and other._closed and again._closed
    assert all(s.proc.poll() is not None for s in [*first._servers, *other._servers, *again._servers])
    assert shared_verifier(**settings) is not again
    close_shared_verifiers()


def test_pool_and_check_once_agree_on_any_text(pool: Verifier) -> None:
    """The fork-server protocol carries source and output bytes as they are: non-ASCII, a lone surrogate, output
    that is not UTF-8, a solution bigger than a pipe buffer."""
    cases = [
        ("def f(x):\n    return 'héllo ✓ 🐍' * x\n", ["assert f(2) == 'héllo ✓ 🐍héllo ✓ 🐍'"], ""),
        ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok\\n')\nprint('ünï')\n" + F_OK, TESTS, ""),
        ("S = '\ud800'\n" + F_OK, TESTS, ""),  # a lone surrogate in the source: python cannot compile it either
        ("# " + "x" * 200_000 + "\n" + F_OK, TESTS, "K = 'ß'\n"),
    ]
    for solution, tests, setup in cases:
        a, b = pool.check(solution, tests, setup), check_once(solution, tests, setup, timeout_s=TIMEOUT_S)
        assert (a.outcome, a.detail, a.stdout, a.failed_test) == (b.outcome, b.detail, b.stdout, b.failed_test), (a, b)
    assert pool.check(*cases[1]).stdout == "\ufffd\ufffd ok\nünï\n"
    assert pool.check(*cases[2]).outcome is Outcome.SYNTAX_ERROR


def test_check_many_survives_a_killed_server() -> None:
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        victim = v._servers[1].proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        items = [(F_OK if i % 2 else WRONG, TESTS, "") for i in range(12)]
        outcomes = [x.outcome for x in v.check_many(items)]
        assert outcomes == [Outcome.PASS if i % 2 else Outcome.ASSERTION_FAILURE for i in range(12)]
        assert all(s.proc.poll() is None for s in v._servers) and victim not in [s.proc for s in v._servers]


def test_pool_survives_a_killed_server() -> None:
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        victim = v._servers[0].proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        assert [v.check(F_OK, TESTS).outcome for _ in range(4)] == [Outcome.PASS] * 4
        assert all(s.proc.poll() is None for s in v._servers)


def test_close_leaves_no_process_behind() -> None:
    v = Verifier(timeout_s=5.0, workers=2)
    servers = [s.proc for s in v._servers]
    import threading

    # One check is still running (sleeping) when close() is called: it must be killed too.
    t = threading.Thread(target=lambda: v.check("import time\ntime.sleep(30)\n", TESTS))
    t.start()
    import time

    time.sleep(0.5)
    running = _children_of({p.pid for p in servers})
    assert running, "expected the sleeping check's child"
    v.close()
    t.join(10)
    assert all(p.poll() is not None for p in servers)
    time.sleep(0.2)
    assert all(not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
               for pid in running)
    with pytest.raises(RuntimeError):
        v.check(F_OK, TESTS)


def test_check_many_is_ordered_and_concurrent(pool: Verifier) -> None:
    items = [(F_OK if i % 3 else WRONG, TESTS, "") for i in range(30)]
    verdicts = pool.check_many(items, progress=True)
    assert [v.outcome for v in verdicts] == [Outcome.PASS if i % 3 else Outcome.ASSERTION_FAILURE for i in range(30)]


def test_check_once_from_threads() -> None:
    """check_once forks from the caller; several threads may do it at once (the agent's tool calls)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs: list[Callable[[], Verdict]] = [lambda: check_once(F_OK, TESTS), lambda: check_once(WRONG, TESTS)] * 4
    with ThreadPoolExecutor(4) as ex:
        outcomes = [f.result().outcome for f in [ex.submit(j) for j in jobs]]
    assert outcomes == [Outcome.PASS, Outcome.ASSERTION_FAILURE] * 4


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        check_once(F_OK, TESTS, outcome_labels="fancy")
    with pytest.raises(ValueError):
        Verifier(workers=0)

"""One prime-rl interpreter for the test module's many children: it imports the heavy third-party modules once
(torch, verifiers' model clients and math scorers: ~10 s of each child's start on the 2-core machines), then forks a
child per request that runs a script (``python SCRIPT ARGS``) or code (``python -c CODE ARGS``) as a fresh
interpreter would, with the request's environment, working directory, stdout and stderr files, and exit status.
Nothing of prime-rl, verifiers or predict is imported here: each child imports them from the paths its script puts
first (the test's patched prime-rl copy), as before.

    python tests/prime_rl_zygote.py   # then one JSON request a line on stdin, one JSON answer a line on stdout

A request: {"argv": [SCRIPT or "-c", ...], "env": {...}, "cwd": DIR, "stdout": FILE, "stderr": FILE, "timeout": S}.
An answer: {"returncode": N} (negative: killed by that signal; SIGALRM when the child ran past its timeout).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import signal
import sys
import traceback

# Third-party only, and none that reads HOME or a cache path at import (huggingface_hub, transformers) or starts a
# thread (pyarrow's jemalloc, via pandas): a child must get what a fresh interpreter with its own environment gets.
PRELOAD = (
    "torch", "numpy", "sympy", "mpmath", "networkx", "latex2sympy2_extended", "math_verify", "anthropic", "openai",
    "httpx", "aiohttp", "pydantic", "beartype", "jinja2", "msgspec", "loguru", "tokenizers",
)


def child(request: dict) -> int:
    """In the forked child: become ``python *argv`` and return its exit status."""
    signal.alarm(int(request["timeout"]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    argv = request["argv"]
    try:
        if argv[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def main() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the child imports it (or fails) as it would have
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child(request)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()

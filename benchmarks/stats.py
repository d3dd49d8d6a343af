"""Speed of the statistics: the paired bootstrap (10,000 resamples x 500 paired tasks), vectorised vs a Python loop,
side by side, and the wall time of the paper DAG's dry-run (`snakemake --profile slurm -n all`) and of the
forced_keep ablation target's.

    .venv/bin/python benchmarks/stats.py [--repeat 5] [--no-dry-run]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from predict.stats import mcnemar_exact, paired_bootstrap, paired_bootstrap_loop

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--no-dry-run", action="store_true")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    a, b = rng.random(args.tasks) < 0.55, rng.random(args.tasks) < 0.50
    vec = timed(lambda: paired_bootstrap(a, b, resamples=args.resamples, seed=1, ci=0.95), args.repeat)
    loop = timed(lambda: paired_bootstrap_loop(a, b, resamples=args.resamples, seed=1, ci=0.95),
                 max(1, args.repeat // 2))
    mc = timed(lambda: mcnemar_exact(a, b), args.repeat)
    print(f"paired bootstrap, {args.resamples} resamples x {args.tasks} tasks (min / median of {args.repeat}):")
    print(f"  {'vectorised numpy':<22}{min(vec):8.3f} s {statistics.median(vec):8.3f} s")
    print(f"  {'python loop':<22}{min(loop):8.3f} s {statistics.median(loop):8.3f} s")
    print(f"  speed-up {min(loop) / min(vec):.1f}x;  exact McNemar (statsmodels) {1e3 * min(mc):.2f} ms")

    if not args.no_dry_run:
        snakemake = str(Path(sys.executable).with_name("snakemake"))
        for label, cmd in (
            ("paper DAG dry-run (slurm -n all)", [snakemake, "--profile", "slurm", "-n", "all"]),
            ("forced_keep target dry-run", [snakemake, "--profile", "slurm", "-n",
                                            "results/ablations/forced_keep.parquet"]),
            ("local DAG dry-run (local -n all)", [snakemake, "--profile", "workflow/profiles/local", "-n", "all"]),
        ):
            times = []
            for _ in range(max(1, args.repeat // 2)):
                t0 = time.perf_counter()
                subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
                times.append(time.perf_counter() - t0)
            print(f"{label:<36}{min(times):8.2f} s (min of {len(times)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

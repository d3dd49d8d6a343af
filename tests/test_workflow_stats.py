"""The evaluation/statistics/report DAG: an ablation target pulls exactly what it needs, and `all` ends in the report
(dry-runs of the paper design under the slurm profile and of the embedded default)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def job_counts(*args: str) -> dict[str, int]:
    out = subprocess.run([SNAKEMAKE, "-n", "-F", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout.split("Job stats:")[1].split("Reasons:")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def test_forced_keep_target_builds_exactly_what_it_needs() -> None:
    counts = job_counts("--profile", "slurm", "results/ablations/forced_keep.parquet")
    # val evaluations of forced_keep, its base arm B (selection) and arm A (the deficit), two seeds each
    assert counts == {"split_mbpp": 1, "evaluate": 3 * 2, "ablation": 1}


def test_paper_all_ends_in_the_report_with_every_ablation() -> None:
    counts = job_counts("--profile", "slurm", "all")
    assert counts["report"] == 1 and counts["ablation"] == 3 and counts["stats"] == 1 and counts["power"] == 1
    assert counts["evaluate"] == 5 * 2  # 5 runs x 2 seeds (base stand-in until trained checkpoints are wired)

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
    # val evaluations, two seeds each: arms A (the deficit) and B (the base arm) at sft + 4 steps, forced_keep at its
    # 4 steps (its SFT is B's); and the training they need on the paper's backend, prime-rl: its set-up, both arms'
    # SFT, the three runs' RL; check_serving before any serving job
    assert counts == {
        "split_mbpp": 1, "sft_traces": 1, "check_serving": 1, "prime_rl_setup": 1, "prime_rl_sft_config": 2,
        "prime_rl_sft": 2, "prime_rl_rl_config": 3 * 2, "prime_rl_rl": 3 * 2, "evaluate": 2 * 2 * 5 + 2 * 4,
        "ablation": 1,
    }  # fmt: skip


def test_paper_all_ends_in_the_report_with_every_ablation() -> None:
    counts = job_counts("--profile", "slurm", "all")
    assert counts["report"] == 1 and counts["ablation"] == 3 and counts["stats"] == 1 and counts["power"] == 1
    # arms: 2 runs x 2 seeds x (sft + 4 steps); ablations and extensions (their SFT is their base arm's): 9 runs x
    # 2 seeds x 4 steps
    assert counts["evaluate"] == 2 * 2 * 5 + 9 * 2 * 4
    # GRPO runs (arms, ablations, RL extensions) on prime-rl; the RFT extensions on our trainer
    assert counts["prime_rl_rl"] == 9 * 2 and counts["rft"] == 2 * 2 and counts["extension"] == 6


EXTENSIONS = ["expensive_tests_A", "expensive_tests_B", "edit_on_revise", "mask_decision", "rft_A", "rft_B"]


def dry_run(*args: str) -> str:
    out = subprocess.run([SNAKEMAKE, "-n", "-F", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_paper_all_includes_every_extension_run_table_and_report_input() -> None:
    text = dry_run("--profile", "slurm", "all")
    for run in EXTENSIONS:
        for seed in (42, 43):
            assert f"results/rl/{run}/seed{seed}/step100" in text, run
            assert f"results/eval/{run}/step100/val/seed{seed}.parquet" in text, run
            assert f"results/eval/{run}/sft/val/seed{seed}.parquet" not in text, run
        assert f"results/extensions/{run}.parquet" in text, run
    assert "predict rft " in text and "--run rft_B" in text and "--extensions " in text


def test_local_all_runs_every_extension_at_its_last_step_only() -> None:
    counts = job_counts("all")
    assert counts["rl"] == 9 and counts["rft"] == 2 and counts["extension"] == 6
    assert counts["evaluate"] == 2 * 2 + 3 + 6  # arms: sft + step2; ablations and extensions: step2 only


def test_expensive_tests_table_pulls_the_other_arm_at_the_same_cost() -> None:
    text = dry_run("--profile", "slurm", "results/extensions/expensive_tests_B.parquet")
    for run in ("expensive_tests_A", "expensive_tests_B", "A", "B"):
        assert f"results/eval/{run}/step100/val/seed42.parquet" in text, run

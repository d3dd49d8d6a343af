"""The GPU rules' SLURM time limit and memory come from the plan with a stated margin (issue 60), not from numbers
someone wrote; where no calibration gives a job they stay hand-set and the workflow says so; a job that outlives its
plan by more than the margin says so in its log."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pytest

from predict.config.models import StudyConfig
from predict.plan.calibration import load_calibration
from predict.plan.command import load_study
from predict.plan.costs import Pricer
from predict.plan.dag import Job, dry_run, parse_dry_run
from predict.plan.limits import (
    MIN_RUNTIME_MIN,
    RUNTIME_MARGIN,
    WorkflowLimits,
    device_kind,
    runtime_minutes,
    watch_planned,
)

REPO = Path(__file__).resolve().parents[1]
HAND_SET_RL = {"mem_mb": 8000, "runtime": 240}  # common.smk's RL_RESOURCES on the CPU


def test_a_jobs_limit_is_its_planned_time_times_the_margin() -> None:
    config = load_study([REPO / "config" / "local.yaml"])
    limits = WorkflowLimits(config, REPO, say=lambda line: None)
    assert limits.kind == "cpu"
    rl = limits.job("rl", {"run": "A", "seed": "42"}, HAND_SET_RL)
    # the same job as `predict plan` prices it, starting the shared server (its worst case)
    cost = Pricer(config, load_calibration(REPO, "cpu"), REPO).price(Job(0, "rl", wildcards={"run": "A", "seed": "42"}))
    planned = cost.startup_s + cost.load["start"] + cost.work_s
    assert rl.planned_s == round(planned) and not rl.fallback
    assert rl.runtime == max(MIN_RUNTIME_MIN, math.ceil(planned * RUNTIME_MARGIN / 60)) != HAND_SET_RL["runtime"]
    assert rl.mem_mb == 8000  # a serving job's peak leaves the shared server out: its memory stays hand-set
    sft = limits.job("train_sft", {"arm": "B"}, {"mem_mb": 8000, "runtime": 120})
    assert sft.mem_mb != 8000 and sft.planned_s > 0  # the trainer is the job's own process: its peak x the margin
    two, five = (limits.job("evaluate_A", {"seed": "42"}, HAND_SET_RL, checkpoints=n).planned_s for n in (2, 5))
    assert five > two  # an evaluation is planned for the checkpoints it serves
    assert runtime_minutes(3600) == 120 and runtime_minutes(1) == MIN_RUNTIME_MIN


def test_without_a_calibration_the_hand_set_limit_stays_and_the_workflow_says_so_once_per_rule() -> None:
    said: list[str] = []
    gpu = load_study([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"])
    assert device_kind(StudyConfig.model_validate(gpu)) is None
    limits = WorkflowLimits(gpu, REPO, say=said.append)
    for run in ("A", "B"):
        rl = limits.job("rl", {"run": run, "seed": "42"}, {"mem_mb": 128000, "runtime": 1440, "gpu": 1})
        assert (rl.runtime, rl.mem_mb, rl.planned_s) == (1440, 128000, 0)
    limits.job("evaluate_A", {"seed": "42"}, {"runtime": 240})
    limits.job("evaluate_B", {"seed": "42"}, {"runtime": 240})
    assert len(said) == 2 and "rule rl: hand-set runtime 1440 min" in said[0] and "cluster.device_kind" in said[0]
    assert said[1].startswith("rules evaluate*: hand-set runtime 240 min")
    # a named kind whose calibration lacks the 4B rollout: hand-set still, naming the figure it lacks
    named = load_study([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"])
    named["cluster"]["device_kind"] = "h200"
    said.clear()
    rl = WorkflowLimits(named, REPO, say=said.append).job("rl", {"run": "A", "seed": "42"}, {"runtime": 1440})
    assert rl.runtime == 1440 and "rl_rollout_episode_s" in rl.fallback and "h200.json" in said[0]


def test_the_embedded_defaults_jobs_get_the_plans_runtime_and_their_planned_time(tmp_path: Path) -> None:
    """Snakemake's own dry-run: each GPU rule's job asks the plan's runtime and passes its planned seconds to the
    stage (hand-set 240 minutes for RL before)."""
    jobs = parse_dry_run(dry_run(REPO, REPO / "workflow" / "profiles" / "local", [REPO / "config" / "local.yaml"]))
    planned = [j for j in jobs if "planned_s" in j.resources]
    assert {j.rule for j in planned} >= {"rl", "rft", "train_sft", "evaluate_A", "evaluate_test_campaign"}
    for j in planned:
        seconds = int(j.resources["planned_s"])
        assert seconds > 0, j.label
        assert int(j.resources["runtime"]) == runtime_minutes(seconds) or abs(
            int(j.resources["runtime"]) - runtime_minutes(seconds)) <= 1, j.label
        assert f"--planned {seconds} " in j.shell, j.label


def test_a_job_past_its_plan_by_more_than_the_margin_warns_once_in_its_log(caplog) -> None:
    caplog.set_level(logging.INFO, logger="predict.plan.limits")
    with watch_planned("0.05", margin=2.0, name="predict rl"):  # what Snakemake passes: the job's seconds
        time.sleep(0.4)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "predict rl" in warnings[0].message and "planned 0 s" in warnings[0].message
    assert "still running after" in warnings[0].message
    assert any("predict rl: took 0 s, planned 0 s" in r.message for r in caplog.records)
    caplog.clear()
    with watch_planned("train_sft=30", margin=2.0):  # within its plan: no warning
        pass
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    with watch_planned("rl=0"):  # no plan (no calibration): nothing to watch, and it says so
        pass
    assert any("no planned time" in r.message for r in caplog.records)
    with pytest.raises(ValueError, match="SECONDS"), watch_planned("soon"):
        pass


def test_every_stage_takes_its_planned_time() -> None:
    from predict.cli import build_parser

    args = build_parser(["rl"]).parse_args(["rl", "--planned", "64", "--config-slice", "x.json", "--run", "A",
                                            "--seed", "42", "--init", "m", "--tasks-file", "t", "--out-dir", "o"])
    assert args.planned == "64"


def test_the_report_shows_the_plan_beside_each_rules_benchmarks(tmp_path: Path) -> None:
    """The plan's table and Snakemake's benchmark files, read into one parquet table per job, drawn per rule in words
    (planned, took, their ratio, the job furthest from its plan) and as a figure."""
    import pyarrow.parquet as pq

    from predict.report.run_costs import run_costs_section, write_plan_vs_run

    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    bench = tmp_path / "results" / "benchmarks"
    for name, seconds in (("rl/A/seed42", 60.0), ("rl/B/seed42", 180.0), ("evaluate/A/val/seed42", 30.0)):
        (bench / name).parent.mkdir(parents=True, exist_ok=True)
        (bench / f"{name}.tsv").write_text(header + f"{seconds}\t0:01:00\t900.5\t1\t1\t1\t0\t0\t90\t40\n")
    plan = [{"rule": "rl", "job": f"rl[run={r},seed=42]", "benchmark": str(bench / f"rl/{r}/seed42.tsv"),
             "planned_s": 60.0, "not_calibrated": ""} for r in ("A", "B")]
    plan += [{"rule": "evaluate_A", "job": "evaluate_A[seed=42]", "benchmark": str(bench / "evaluate/A/val/seed42.tsv"),
              "planned_s": 40.0, "not_calibrated": ""},
             {"rule": "report", "job": "report", "benchmark": str(bench / "report.tsv"), "planned_s": 4.0,
              "not_calibrated": ""},  # planned, not run yet
             {"rule": "all", "job": "all", "benchmark": None, "planned_s": 0.0, "not_calibrated": ""}]
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(plan), tmp_path / "plan.parquet")
    out = write_plan_vs_run(tmp_path / "plan.parquet", bench, tmp_path / "plan_vs_run.parquet")
    rows = {r["job"]: r for r in pq.read_table(out).to_pylist()}
    assert set(rows) == {"rl[run=A,seed=42]", "rl[run=B,seed=42]", "evaluate_A[seed=42]", "report"}
    assert rows["rl[run=B,seed=42]"]["took_over_planned"] == 3.0 and rows["rl[run=A,seed=42]"]["host_peak_mib"] == 900.5
    assert rows["report"]["took_s"] is None  # planned, not measured: no made-up time
    html = run_costs_section(list(rows.values()))
    assert "took / planned" in html and "the job furthest from its plan" in html  # columns in words
    assert "rl[run=B,seed=42]: 180 s vs 60 s" in html and ">2.00</td>" in html  # 240 s took / 120 s planned
    assert "not run yet" in html and "<img" in html
    assert "No plan beside the run" in run_costs_section([])

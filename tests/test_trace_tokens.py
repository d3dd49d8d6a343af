"""Tokens per SFT trace of the runs with traces of their own (issue 60): the paper design trains its environment
variants (blind, irreversible) on their own traces, which the embedded default never trains on (``sft: base``), so
the plan had no tokens for their SFT jobs. benchmarks/trace_tokens.py renders and counts them as SFT does;
benchmarks/calibrate.py takes its JSON into the workload calibration, where no measured SFT job gives the figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predict.config import load_config
from predict.data import MBPP_SCHEMA, split_tasks
from predict.outputs import write_rows
from predict.plan.calibration import load_calibration
from predict.plan.costs import Pricer
from predict.plan.dag import Job
from predict.runs import resolve_run, sft_runs
from predict.traces.stage import run_stage

from .conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def counted(mbpp_rows: list[dict], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The benchmark's count over a finished run's folder holding the traces of 8 sft tasks."""
    results = tmp_path_factory.mktemp("results")
    sft = split_tasks(mbpp_rows, 42, {"sft": 212, "rl": 212, "test": 500})["sft"][:8]
    write_rows(sft, MBPP_SCHEMA, results / "data" / "sft.parquet")
    config = load_config(REPO / "config" / "config.yaml")
    config["traces"].update(n_direct=4, n_recovery=4)
    run_stage(sft, config, results / "sft" / "traces", progress=False)
    return benchmark_script("trace_tokens").count(REPO / "config" / "config.yaml", results)


def test_every_run_with_its_own_traces_is_counted_and_a_blind_trace_is_shorter(counted: dict) -> None:
    paper = load_config(REPO / "config" / "config.yaml")
    by_run = {r["run"]: r for r in counted["runs"]}
    assert list(by_run) == sft_runs(paper)  # the arms and every run the run_traces rule renders
    assert {"blind_A", "blind_B", "irreversible_A", "irreversible_B"} <= set(by_run)
    for name, r in by_run.items():
        spec = resolve_run(paper, name)
        assert (r["protocol"], r["variant"]) == (spec.protocol, spec.variant)
        assert r["traces"] == 8 and r["tokens"] > 0 and r["tokens_per_trace"] == r["tokens"] / 8
    # a blind trace never calls python_test: fewer turns than its arm's, so fewer tokens
    for arm in ("A", "B"):
        assert by_run[f"blind_{arm}"]["tokens"] < by_run[arm]["tokens"]
    # Arm B's traces carry a prediction and a decision after every patch
    assert by_run["B"]["tokens"] > by_run["A"]["tokens"]


def test_calibration_takes_a_variants_tokens_where_no_sft_job_measured_them(counted: dict, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calibrate = benchmark_script("calibrate")
    (tmp_path / "trace_tokens.json").write_text(json.dumps(counted))
    monkeypatch.setattr(calibrate, "BENCH", tmp_path)
    workload = calibrate.Figures()
    measured_a = {"protocol": "reactive", "variant": "none", "recovery_style": "revise", "mix": "study"}
    workload.add("sft_tokens_per_trace", 123.0, "tokens", "plan_measured_cpu_x.json: jobs[train_sft]", "measured",
                 **measured_a)
    calibrate.own_traces(workload)
    entries = workload.figures["sft_tokens_per_trace"]
    assert [e["value"] for e in entries if e["at"] == measured_a] == [123.0]  # a measured SFT job's stays alone
    blind_a = next(r for r in counted["runs"] if r["run"] == "blind_A")
    assert [e["value"] for e in entries if e["at"]["variant"] == "blind" and e["at"]["protocol"] == "reactive"] == [
        round(blind_a["tokens_per_trace"], 6)]
    assert workload.figures["output_bytes"][0]["at"] == {"rule": "run_traces"}


def test_the_paper_designs_every_sft_is_priced_by_its_tokens_on_an_h100() -> None:
    """With the committed calibration, no SFT job of the one-node study lacks its tokens (before: the four
    environment-variant SFTs were not calibrated)."""
    from predict.plan.command import load_study

    config = load_study([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"])
    pricer = Pricer(config, load_calibration(REPO, "h100"), REPO)
    for run in sft_runs(config):
        cost = pricer.price(Job(jobid=1, rule="train_sft", wildcards={"arm": run}, resources={"gpu": "1"}))
        assert not cost.missing, (run, [str(m) for m in cost.missing])
        assert cost.units["tokens"] > 0

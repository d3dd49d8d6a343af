"""The `predict rollout` stage (predict.rollouts): parquet out, resume after a crash, and the touched-once test split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.config import load_config
from predict.data import MBPP_SCHEMA
from predict.env.records import RECORD_SCHEMA
from predict.fingerprint import resumable_rows
from predict.outputs import read_rows, write_rows
from predict.rollouts import RolloutJob, SplitGuardError, job_fingerprint, run_job, select_tasks

from .conftest import REPO
from .scripted_endpoint import ScriptedEndpoint

SOLVE = 'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'


@pytest.fixture
def study() -> dict[str, Any]:
    return load_config(REPO / "config" / "local.yaml")


@pytest.fixture
def tasks_file(tmp_path: Path, mbpp_rows: list[dict]) -> Path:
    rows = [r for r in mbpp_rows if r["task_id"] in (127, 128, 129, 130)]
    return write_rows(rows, MBPP_SCHEMA, tmp_path / "val.parquet")


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    # task 127 gets solved; every other task gives up at once
    with ScriptedEndpoint({"multiply": [SOLVE, "FINAL: done"], "": ["FINAL: giving up"]}) as ep:
        yield ep


def _job(tasks: Path, out: Path, endpoint: ScriptedEndpoint, **kw: Any) -> RolloutJob:
    fields = dict(tasks_path=tasks, split="val", out=out, model="scripted", checkpoint="base", arm="A", seed=42,
                  base_url=endpoint.base_url)
    return RolloutJob(**{**fields, **kw})


def test_rollout_command_takes_its_task_count_from_env_rollout_tasks(study, mbpp_rows: list[dict], endpoint,
                                                                     tmp_path: Path) -> None:
    """`predict rollout` rolls out env.rollout_tasks tasks (the rule passes no --n-tasks); --n-tasks overrides it."""
    from predict.cli import main

    val = write_rows([r for r in mbpp_rows if r["task_id"] in (10, 28, 81)], MBPP_SCHEMA, tmp_path / "val.parquet")
    config = {**study, "env": {**study["env"], "rollout_tasks": 2}}
    args = ["rollout", "--config-json", json.dumps(config), "--tasks-file", str(val), "--split", "val",
            "--model", "scripted", "--checkpoint", "base", "--arm", "A", "--seed", "42", "--base-url", endpoint.base_url]
    assert main([*args, "--out", str(tmp_path / "two.parquet")]) == 0
    assert [r["task_id"] for r in read_rows(tmp_path / "two.parquet")] == [10, 28]
    assert main([*args, "--n-tasks", "1", "--out", str(tmp_path / "one.parquet")]) == 0
    assert [r["task_id"] for r in read_rows(tmp_path / "one.parquet")] == [10]


def test_select_tasks_takes_the_first_n_with_samples() -> None:
    rows = [{"task_id": t} for t in (5, 2, 9)]
    assert [(t["task_id"], t["sample"]) for t in select_tasks(rows, 2, 2)] == [(2, 0), (2, 1), (5, 0), (5, 1)]
    assert len(select_tasks(rows, None, 1)) == 3


def test_rollout_stage_writes_one_row_per_rollout(study, tasks_file: Path, endpoint, tmp_path: Path) -> None:
    out = tmp_path / "rollouts.parquet"
    summary = run_job(_job(tasks_file, out, endpoint, n_tasks=2), study)
    rows = read_rows(out)
    assert [r["task_id"] for r in rows] == [127, 128]
    assert {(r["arm"], r["seed"], r["checkpoint"], r["split"]) for r in rows} == {("A", 42, "base", "val")}
    assert [r["final_pass"] for r in rows] == [True, False]
    assert summary["pass_rate"] == 0.5 and summary["ran"] == 2
    # an endpoint was given: no server started here, so no start time is claimed (evaluate, which starts its own and
    # hands its URL, printed "server_start_s 0.000" beside its 191 s serve_s on the H200, 2026-12-05)
    assert "server_start_s" not in summary and summary["rollouts_s"] > 0
    assert {r["protocol"] for r in rows} == {"reactive"}  # arm A's protocol in the config
    isolation = json.loads(pq.read_schema(out).metadata[b"predict.isolation"])  # the sandbox layers of its checks
    assert isolation["missing"] == [] and set(isolation["required"]) <= set(isolation["active"])


def test_protocol_can_be_overridden_per_job(study, tasks_file: Path, endpoint, tmp_path: Path) -> None:
    out = tmp_path / "rollouts.parquet"
    run_job(_job(tasks_file, out, endpoint, n_tasks=1, protocol="predictive", variant="forced_keep"), study)
    (row,) = read_rows(out)
    assert (row["arm"], row["protocol"], row["variant"]) == ("A", "predictive", "forced_keep")
    # the solving patch got a prediction request (the scripted FINAL reply is malformed as a prediction)
    assert row["n_predictions"] == 1
    assert not out.with_name(out.name + ".partial").exists()


def test_interrupted_stage_resumes_without_redoing_rollouts(study, tasks_file: Path, endpoint, tmp_path: Path) -> None:
    out = tmp_path / "rollouts.parquet"
    run_job(_job(tasks_file, tmp_path / "first.parquet", endpoint, n_tasks=1), study)
    persisted = read_rows(tmp_path / "first.parquet")[0]
    # A crashed run of the same job had persisted task 127 (marked so we can tell it was not re-run) and nothing else.
    job = _job(tasks_file, out, endpoint, n_tasks=3)
    resumable_rows(out, RECORD_SCHEMA, ("task_id", "sample"), job_fingerprint(job, study)).append(
        [{**persisted, "trace_id": "persisted"}]
    )
    n_requests = len(endpoint.requests)

    summary = run_job(job, study)
    rows = read_rows(out)
    assert [r["task_id"] for r in rows] == [127, 128, 129]
    assert rows[0]["trace_id"] == "persisted", "a persisted rollout must not run again"
    assert summary["ran"] == 2
    assert len(endpoint.requests) - n_requests == 2  # one FINAL reply each for 128 and 129


@pytest.mark.parametrize("change", ["model", "temperature", "seed", "before fingerprints"])
def test_persisted_rollouts_of_other_inputs_are_redone(
    change: str, study, tasks_file: Path, endpoint, tmp_path: Path
) -> None:
    """Issue 15: rows a killed job persisted are reused only by a rerun with the same model (by content), settings
    and seed; otherwise they are dropped and rolled out again (old code kept them: a stale row in a new table)."""
    out = tmp_path / "rollouts.parquet"
    run_job(_job(tasks_file, tmp_path / "first.parquet", endpoint, n_tasks=1), study)
    persisted = read_rows(tmp_path / "first.parquet")[0]
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"sft v1")
    job = _job(tasks_file, out, endpoint, n_tasks=2, model=str(tmp_path / "ckpt"))
    killed = resumable_rows(out, RECORD_SCHEMA, ("task_id", "sample"), job_fingerprint(job, study))
    killed.append([{**persisted, "trace_id": "persisted"}])
    if change == "model":
        (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"sft v2")  # retrained at the same path
    elif change == "temperature":
        study["env"]["temperature"] = 0.5
    elif change == "seed":
        job = _job(tasks_file, out, endpoint, n_tasks=2, model=str(tmp_path / "ckpt"), seed=43)
    else:
        (killed.partial_dir / "fingerprint.json").unlink()
    summary = run_job(job, study)
    rows = read_rows(out)
    assert summary["ran"] == 2 and [r["task_id"] for r in rows] == [127, 128]
    assert "persisted" not in {r["trace_id"] for r in rows}


def test_test_split_needs_its_campaigns_admission_and_a_missing_ledger_is_a_refusal(
    study, mbpp_rows: list[dict], endpoint, tmp_path: Path
) -> None:
    """A rollout job on the test split runs only as an evaluation its campaign admitted (predict.campaign; the
    campaign's own tests are tests/test_campaign.py). Issue 26: the old guard passed when the ledger file was missing,
    so a job pointed at a fresh ledger path evaluated the test split outside any campaign."""
    test_file = write_rows([r for r in mbpp_rows if r["task_id"] == 127], MBPP_SCHEMA, tmp_path / "test.parquet")
    out = tmp_path / "test-eval.parquet"
    with pytest.raises(SplitGuardError, match="evaluated once"):
        run_job(_job(test_file, out, endpoint, split="test"), study)
    ledger = tmp_path / "ledger.jsonl"
    with pytest.raises(SplitGuardError, match="a missing ledger is a refusal"):
        run_job(_job(test_file, out, endpoint, split="test", test_ledger=ledger,
                     ledger_extra={"campaign": "0123456789abcdef"}), study)
    ledger.write_text(json.dumps({"event": "campaign", "campaign": "another", "plan": [["A", "base", 42]]}) + "\n")
    with pytest.raises(SplitGuardError, match="has no admission in test campaign 0123456789abcdef"):
        run_job(_job(test_file, out, endpoint, split="test", test_ledger=ledger,
                     ledger_extra={"campaign": "0123456789abcdef"}), study)
    assert not out.exists() and not endpoint.requests


def test_a_git_that_hangs_leaves_the_commit_unrecorded_instead_of_failing_the_rollout(monkeypatch) -> None:
    import subprocess

    from predict import rollouts

    def hang(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs.get("timeout", 10))

    monkeypatch.setattr(rollouts.subprocess, "run", hang)
    assert rollouts._git_commit() is None


def test_a_typed_object_fingerprints_and_rolls_out_as_its_plain_slice(study, tasks_file: Path, endpoint,
                                                                    tmp_path: Path) -> None:
    """The rollout stage's `main` hands its own typed object (`stage_settings`) on: the job's fingerprint is the
    plain slice's, byte for byte (a `.partial` folder saved before the typed object resumes), and the rows are the
    ones the dict gives."""
    from predict.stages import config_slice, stage_settings

    sliced = config_slice(study, "rollout")
    view = stage_settings("rollout", study)
    job = _job(tasks_file, tmp_path / "view.parquet", endpoint, n_tasks=1)
    assert job_fingerprint(job, view) == job_fingerprint(job, sliced)
    run_job(job, view)
    run_job(_job(tasks_file, tmp_path / "dict.parquet", endpoint, n_tasks=1), sliced)
    varying = ("trace_id", "created_at", "wall_s", "model_s", "env_s", "program_s")  # random ids and timings

    def rows(name: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in varying} for r in read_rows(tmp_path / name)]

    assert rows("view.parquet") == rows("dict.parquet")

"""The test split, sealed (src/predict/campaign/: seal.py, the seal; admission.py, the campaign): no stage reaches a
test task outside its campaign, whatever file, name, folder or ledger state it is handed. One test per door that was
open: test tasks under any file name through every stage that reads tasks; the campaign keyed on the test split, not on
its file (a subset, a superset); a missing ledger where a campaign left traces; --test-ledger at a new path; a
same-size, same-mtime rewrite of a resumable input. Each refusal names the file, the first task ids and what to do."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from predict.campaign import SplitGuardError, TestLedger, campaign_test_split, registry_ledger, split_history
from predict.config import load_config
from predict.data import MBPP_SCHEMA, split_tasks
from predict.outputs import read_rows, write_rows
from predict.stats import SELECTION_SCHEMA

from .conftest import REPO
from .scripted_endpoint import ScriptedEndpoint
from .synthetic import write_test_split

# the test split's first task (2) and a val task (10), solved by the scripted endpoint
SOLVE_TEST = ('CALL apply_patch {"find": "# Write your function here.", "replace": "def similar_elements(a, b):\\n'
              '    return tuple(set(a) & set(b))"}')
KEEP = ["<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>", "FINAL: done"]


@pytest.fixture
def study(tmp_path: Path) -> dict[str, Any]:
    config = load_config(REPO / "config" / "local.yaml")
    config["results_dir"] = str(tmp_path / "results")  # a whole config claims its results folder: this one
    config["evaluation"]["tasks"] = 1  # the test split's first task: enough for the ledger's rules
    return config


@pytest.fixture
def splits(mbpp_rows: list[dict]) -> dict[str, list[dict]]:
    return split_tasks(mbpp_rows, 42, {"sft": 212, "rl": 212, "test": 500})


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    with ScriptedEndpoint({"similar elements": [SOLVE_TEST, *KEEP], "": ["FINAL: no patch"]}) as ep:
        yield ep


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")) if folder.exists() else []


# -- 1. test tasks under any file name, through every stage that reads tasks -------------------------------------------


def _reached(name: str):
    def reached(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{name} was reached with test tasks: the stage did not refuse them")

    return reached


# stage -> (the function its main hands the tasks to, which must never be reached; its command line after the config)
STAGE_DOORS = {
    "rollout": ("predict.rollouts.run_job", lambda f, r: [
        "--tasks-file", f, "--split", "val", "--model", "m", "--checkpoint", "base", "--arm", "A", "--seed", "42",
        "--out", f"{r}/rollouts/A/base/val/seed42.parquet"]),
    "evaluate": ("predict.evaluate.evaluate_checkpoints", lambda f, r: [
        "--run", "A", "--split", "val", "--seed", "42", "--tasks-file", f, "--checkpoint", "sft", "--model", "m",
        "--out", f"{r}/eval/A/sft/val/seed42.parquet"]),
    "traces": ("predict.traces.stage.run_stage", lambda f, r: ["--tasks-file", f, "--out-dir", f"{r}/sft/traces"]),
    "run-traces": ("predict.traces.stage.run_traces_stage", lambda f, r: [
        "--run", "blind_B", "--arm-traces", f, "--tasks-file", f, "--out", f"{r}/sft/traces/blind_B.parquet"]),
    "sft": ("predict.train.sft.run_sft", lambda f, r: [
        "--arm", "A", "--traces", f, "--base-model", "m", "--out-dir", f"{r}/checkpoints/A/sft",
        "--metrics-out", f"{r}/sft/A/metrics.parquet", "--state-dir", f"{r}/sft/A/state"]),
    "rl": ("predict.train.rl.run_rl", lambda f, r: [
        "--run", "A", "--seed", "42", "--init", r, "--tasks-file", f, "--out-dir", f"{r}/rl/A/seed42"]),
    "rft": ("predict.train.rft.run_rft", lambda f, r: [
        "--run", "rft_A", "--seed", "42", "--init", r, "--tasks-file", f, "--out-dir", f"{r}/rl/rft_A/seed42"]),
    "prime-rl-config": ("predict.train.prime_rl.configs.rl_config", lambda f, r: [
        "rl", "--run", "A", "--seed", "42", "--tasks-file", f, "--model", "m", "--output-dir", f"{r}/rl/A/seed42/p",
        "--out", f"{r}/rl/A/seed42/prime-rl.toml"]),
}


@pytest.mark.parametrize("stage", list(STAGE_DOORS))
def test_test_tasks_under_any_file_name_are_refused_before_the_stage_writes_anything(
    stage: str, study: dict, splits: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture
) -> None:
    """Old code: rl, rft, traces, sft and prime-rl-config never asked the guard (RL trained on test tasks, traces put
    them into SFT data), and rollout/evaluate asked it only after writing their .partial folder or starting vLLM,
    and only with a registry (none here: a new clone) or a file named test.parquet."""
    from predict.cli import main

    target, argv = STAGE_DOORS[stage]
    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(module + "." + name, _reached(target))
    # two val tasks and three test tasks, named like the stage's own input, in a folder of no meaning
    rows = splits["val"][:2] + splits["test"][:3]
    named = {"rollout": "val", "evaluate": "val", "traces": "sft", "run-traces": "sft", "sft": "A"}.get(stage, "rl")
    tasks = tmp_path / "elsewhere" / f"{named}.parquet"
    if stage == "sft":  # SFT reads traces: task-keyed rows too
        tasks.parent.mkdir()
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"task_id": [r["task_id"] for r in rows], "messages": [[] for _ in rows]}), tasks)
    else:
        write_rows(rows, MBPP_SCHEMA, tasks)
    results = Path(study["results_dir"])
    results.mkdir()
    args = [stage, "--config-json", json.dumps(study)] + argv(str(tasks), str(results))
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    ids = ", ".join(str(r["task_id"]) for r in sorted(splits["test"][:3], key=lambda r: r["task_id"]))
    assert f"{tasks}: 3 of its 5 tasks are test tasks ({ids})" in err, err
    assert "split seed 42, 500 tasks" in err and "results/data/{sft,rl,val}.parquet" in err, err
    assert _files_under(results) == [], "a refused stage wrote (or claimed) its results folder"
    assert not registry_ledger().exists(), "a refused stage created the registry"


def test_the_signal_run_refuses_sft_tasks_a_campaign_evaluated(study: dict, splits: dict, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a task was evaluated in a test campaign, no stage trains on it again, whatever the config says now (here
    the registry's campaign holds a task the config's split puts into sft). Old code: the signal run had no guard."""
    import predict.traces.stage
    from predict.train.learning_signal import run_signal

    monkeypatch.setattr(predict.traces.stage, "run_stage", _reached("run_stage"))
    evaluated = splits["sft"][0]["task_id"]
    _campaign_line(registry_ledger(), [evaluated])
    with pytest.raises(SplitGuardError, match=rf"the sft split of .*: 1 of its 212 tasks are test tasks "
                                              rf"\({evaluated}\): test campaign c0ffee evaluated them"):
        run_signal(study, tmp_path / "signal")
    assert not (tmp_path / "signal").exists()


def _campaign_line(ledger: Path, task_ids: list[int]) -> None:
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger, "a") as f:
        f.write(json.dumps({"event": "campaign", "campaign": "c0ffee", "task_ids": task_ids, "time": "t0",
                            "split_sha256": "another split", "plan": []}) + "\n")


def test_a_task_once_evaluated_on_test_is_never_trained_on_whatever_the_split_says_now(
    study: dict, splits: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The registry remembers what a campaign evaluated: `predict rl` on the config's own rl split is refused when a
    campaign of this checkout evaluated one of its tasks (under another split seed). Old code: rl had no guard."""
    from predict.cli import main

    monkeypatch.setattr("predict.train.rl.run_rl", _reached("run_rl"))
    rl = write_rows(splits["rl"], MBPP_SCHEMA, tmp_path / "data" / "rl.parquet")
    evaluated = sorted(r["task_id"] for r in splits["rl"])[5:7]
    _campaign_line(registry_ledger(), evaluated)
    (tmp_path / "init").mkdir()
    assert main(["rl", "--config-json", json.dumps(study), "--run", "A", "--seed", "42", "--init",
                 str(tmp_path / "init"), "--tasks-file", str(rl), "--out-dir", str(tmp_path / "rl")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"2 of its 212 tasks are test tasks ({evaluated[0]}, {evaluated[1]}): test campaign c0ffee evaluated" in err
    assert not (tmp_path / "rl").exists()


def test_a_refused_rollout_or_evaluation_leaves_nothing_behind_and_starts_no_server(
    study: dict, splits: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Called as functions too (past the command line's seal), a job with a test task the registry knows is refused
    before its .partial folder exists or a server starts. Old code: rollouts.py wrote the .partial folder, and
    evaluate started vLLM for it, before the guard refused."""
    import predict.evaluate
    from predict.campaign import register_split
    from predict.evaluate import CheckpointEval, evaluate_checkpoints, evaluation_config
    from predict.rollouts import RolloutJob, run_job

    register_split(registry_ledger(), splits["test"], campaign_test_split(study).sha256)
    tasks = write_rows(splits["test"][:2], MBPP_SCHEMA, tmp_path / "val.parquet")
    out = tmp_path / "rollouts" / "seed42.parquet"
    with pytest.raises(SplitGuardError, match=r"val\.parquet: 2 of its tasks are test tasks"):
        run_job(RolloutJob(tasks_path=tasks, split="val", out=out, model="m", checkpoint="base", arm="A", seed=42),
                study)
    assert not out.with_name(out.name + ".partial").exists()
    started = []
    monkeypatch.setattr(predict.evaluate.CheckpointServer, "load", lambda self, model, version: started.append(model))
    evals = [CheckpointEval("sft", str(tmp_path), tmp_path / "eval" / "A" / "sft" / "val" / "seed42.parquet")]
    with pytest.raises(SplitGuardError, match=r"val\.parquet: 1 of its tasks are test tasks"):  # evaluation.tasks 1
        evaluate_checkpoints(evaluation_config(study, "val"), run="A", split="val", seed=42, tasks_path=tasks,
                             checkpoints=evals)
    assert started == [] and not (tmp_path / "eval").exists()


def test_a_files_name_never_decides(study: dict, splits: dict, tmp_path: Path, endpoint: Any) -> None:
    """Val tasks in a file named test.parquet are val tasks. Old code refused them by the file's name."""
    from predict.rollouts import RolloutJob, run_job

    named = write_rows(splits["val"][:1], MBPP_SCHEMA, tmp_path / "test.parquet")
    job = RolloutJob(tasks_path=named, split="val", out=tmp_path / "o.parquet", model="scripted", checkpoint="base",
                     arm="A", seed=42, base_url=endpoint.base_url)
    assert run_job(job, study)["rollouts"] == 1


def test_every_stage_flag_that_names_tasks_is_sealed() -> None:
    """A stage flag that hands it tasks (a split, traces) is in its stage table entry, so the seal checks it; a new
    stage or flag cannot slip past. The report's --tasks-file only prints the example's task text; inspect-logs' only
    renders the prompts of the evaluations it admitted (its own seal: tests/test_inspect_logs.py)."""
    import argparse

    from predict.cli import _stage_command
    from predict.stages import STAGES

    task_flags, display_only = {"tasks_file", "traces", "arm_traces"}, {("report", "tasks_file"),
                                                                        ("inspect-logs", "tasks_file")}
    for stage in STAGES.values():
        if stage.command is None:
            continue
        parser = argparse.ArgumentParser()
        _stage_command(stage.name)[0](parser)
        flags = {a.dest for a in parser._actions} & task_flags
        assert flags - {f for s, f in display_only if s == stage.name} <= set(stage.task_files), stage.name
        if stage.task_files:
            assert "data" in stage.reads, f"{stage.name}: the seal derives the test split from data"
    assert STAGES["evaluate-test"].task_files == ("tasks_file",)


# -- 2. the campaign is keyed on the test split, not on its file ------------------------------------------------------


def _val_stats(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    selection = write_rows([{"run": "B", "seed": 42, "mode": "fixed", "step": 2, "checkpoint": "step2",
                             "val_pass_at_1": 0.5, "fallback": False}], SELECTION_SCHEMA, folder / "selection.parquet")
    metrics = write_rows([{"run": "B", "checkpoint": c, "split": "val", "seed": 42} for c in ("sft", "step2")],
                         pa.schema([("run", pa.string()), ("checkpoint", pa.string()), ("split", pa.string()),
                                    ("seed", pa.int64())]), folder / "metrics.parquet")
    return selection, metrics


def _evaluate_test(study: dict, tasks: Path, results: Path, checkpoint: str, endpoint: Any, *extra: str) -> list[str]:
    selection, metrics = _val_stats(results / "stats")
    return ["evaluate", "--config-json", json.dumps(study), "--split", "test", "--run", "B", "--seed", "42",
            "--tasks-file", str(tasks), "--checkpoint", checkpoint, "--model", "scripted",
            "--out", str(results / "eval" / "B" / checkpoint / "test" / "seed42.parquet"), "--base-url",
            endpoint.base_url, "--selection", str(selection), "--val-metrics", str(metrics), *extra]


@pytest.mark.parametrize("variant", ["subset", "superset", "edited"])
def test_a_subset_or_superset_of_the_test_split_is_the_same_campaign_and_refused(
    variant: str, study: dict, splits: dict, endpoint: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Old code keyed a campaign on the content hash of the file it was handed: the test split minus two tasks (or
    plus a val task, or with an edited row) was a new, undeclared campaign, evaluated at once."""
    from predict.cli import main

    rows = sorted(splits["test"], key=lambda r: r["task_id"])
    if variant == "subset":
        rows, why = rows[2:], f"it lacks 2 of its 500 tasks ({rows[0]['task_id']}, {rows[1]['task_id']})"
    elif variant == "superset":
        rows, why = rows + splits["val"][:1], f"it holds 1 tasks outside it ({splits['val'][0]['task_id']})"
    else:
        rows = [{**rows[0], "text": rows[0]["text"] + " (edited)"}, *rows[1:]]
        why = f"1 of its rows differ from the split's ({rows[0]['task_id']})"
    copy = write_rows(list(reversed(rows)), MBPP_SCHEMA, tmp_path / "data" / "my-tasks.parquet")
    results = tmp_path / "results"
    assert main(_evaluate_test(study, copy, results, "step2", endpoint)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{copy}: not the test split of" in err and why in err and "results/data/test.parquet" in err, err
    assert not registry_ledger().exists() and not (results / "eval").exists() and not endpoint.requests


def test_a_finished_entry_is_not_evaluated_again_on_other_tasks(study: dict, endpoint: Any, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    """Old code: a finished campaign could evaluate its entry again on the test split minus two tasks (a new key)."""
    from predict.cli import main

    test = write_test_split(study, tmp_path / "data" / "test.parquet")
    results = tmp_path / "results"
    assert main(_evaluate_test(study, test, results, "step2", endpoint)) == 0
    assert read_rows(results / "eval" / "B" / "step2" / "test" / "seed42.parquet")[0]["final_pass"]
    lines = registry_ledger().read_text()
    fewer = write_rows(read_rows(test)[2:], MBPP_SCHEMA, tmp_path / "data" / "fewer.parquet")
    out = tmp_path / "again"
    assert main(_evaluate_test(study, fewer, out, "step2", endpoint)) == 2
    assert "it lacks 2 of its 500 tasks" in " ".join(capsys.readouterr().err.split())
    assert registry_ledger().read_text() == lines and not (out / "eval").exists()


# -- 3. missing history is a refusal -------------------------------------------------------------------------------------


@pytest.mark.parametrize("trace", ["evaluation", "interrupted", "statistics", "report"])
def test_a_deleted_ledger_with_a_campaigns_files_present_is_a_refusal(
    trace: str, study: dict, endpoint: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Old code read a missing ledger as a fresh start: with .test-campaigns/ deleted, the campaign began again and
    evaluated the test split a second time beside its earlier files."""
    from predict.cli import main

    test = write_test_split(study, tmp_path / "data" / "test.parquet")
    results = tmp_path / "results"
    assert main(_evaluate_test(study, test, results, "sft", endpoint)) == 0
    evaluation = results / "eval" / "B" / "sft" / "test" / "seed42.parquet"
    if trace == "interrupted":  # the campaign's only trace: a killed evaluation's persisted rows
        evaluation.with_name(evaluation.name + ".partial").mkdir()
        shutil.move(evaluation, evaluation.with_name(evaluation.name + ".partial") / "part-00000.parquet")
    elif trace == "statistics":
        evaluation.unlink()
        write_rows([{"n": 1}], pa.schema([("n", pa.int64())]), results / "test" / "stats" / "metrics.parquet")
    elif trace == "report":
        evaluation.unlink()
        (results / "report").mkdir()
        (results / "report" / "index.html").write_text('<section id="test-headline"><h2>The frozen test</h2>')
    shutil.rmtree(registry_ledger().parent)  # the checkout's .test-campaigns/, deleted
    requests = len(endpoint.requests)
    assert main(_evaluate_test(study, test, results, "step2", endpoint)) == 2
    err = " ".join(capsys.readouterr().err.split())
    found = {"evaluation": f"test evaluation {evaluation}", "interrupted": "an interrupted test evaluation",
             "statistics": f"test statistics {results / 'test' / 'stats'}", "report": "a report with a test section"}
    assert f"{registry_ledger()} is missing, yet a campaign's traces exist: {found[trace]}" in err, err
    assert f"restore {registry_ledger()}" in err
    assert not registry_ledger().parent.exists() and len(endpoint.requests) == requests
    assert not (results / "eval" / "B" / "step2").exists()


@pytest.mark.parametrize("registry", ["moved away", "a new file"])
def test_history_in_the_studys_results_dir_counts_whatever_folder_the_output_is_in(
    registry: str, study: dict, endpoint: Any, tmp_path: Path, capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code looked for a campaign's traces beside the output only (`results_origin` of --out): with the registry
    moved away, or PREDICT_TEST_CAMPAIGNS naming a ledger not written yet, a test evaluation whose --out lay outside
    the results folder started a new campaign although the study's results_dir held the frozen campaign's test
    evaluations. History counts wherever it is: the config's results_dir and the output's folder both."""
    from predict.cli import main

    test = write_test_split(study, tmp_path / "data" / "test.parquet")
    results = Path(study["results_dir"])
    assert main(_evaluate_test(study, test, results, "sft", endpoint)) == 0
    evaluation = results / "eval" / "B" / "sft" / "test" / "seed42.parquet"
    if registry == "moved away":
        shutil.move(registry_ledger().parent, tmp_path / "moved-registry")
    else:
        monkeypatch.setenv("PREDICT_TEST_CAMPAIGNS", str(tmp_path / "new-registry" / "ledger.jsonl"))
    requests = len(endpoint.requests)
    elsewhere = tmp_path / "elsewhere"  # a results-shaped folder of its own, holding no trace of the campaign
    assert main(_evaluate_test(study, test, elsewhere, "step2", endpoint)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{registry_ledger()} is missing, yet a campaign's traces exist: test evaluation {evaluation}" in err, err
    assert not registry_ledger().parent.exists() and len(endpoint.requests) == requests
    assert not (elsewhere / "eval").exists()


def test_a_fresh_campaign_starts_where_no_history_exists(study: dict, endpoint: Any, tmp_path: Path) -> None:
    """A new clone with no ledger and no campaign files: the campaign starts, and its registry with it."""
    from predict.cli import main

    test = write_test_split(study, tmp_path / "data" / "test.parquet")
    assert not registry_ledger().exists()
    assert main(_evaluate_test(study, test, tmp_path / "results", "step2", endpoint)) == 0
    (campaign,) = TestLedger(registry_ledger()).campaigns()
    assert campaign["split_sha256"] == campaign_test_split(study).sha256


def test_test_ledger_at_a_new_path_is_refused_and_never_created(study: dict, endpoint: Any, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    """Old code: `predict evaluate --test-ledger PATH` started a registry at any path, and the campaign ran there,
    beside (and unknown to) the checkout's."""
    from predict.cli import main

    test = write_test_split(study, tmp_path / "data" / "test.parquet")
    new = tmp_path / "elsewhere" / "ledger.jsonl"
    results = tmp_path / "results"
    assert main(_evaluate_test(study, test, results, "step2", endpoint, "--test-ledger", str(new))) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--test-ledger {new}: a test evaluation records in the checkout's campaign registry" in err, err
    assert not new.parent.exists() and not (results / "eval").exists() and not endpoint.requests
    # ... and `predict stats --test-ledger` reads a ledger for analysis, never creates one
    evaluation = tmp_path / "B-step2.parquet"
    evaluation.write_bytes(b"")
    assert main(["stats", "--config-json", json.dumps(study), "--eval", str(evaluation), "--selection",
                 str(results / "stats" / "selection.parquet"), "--test-ledger", str(new),
                 "--out-dir", str(tmp_path / "test-stats")]) == 2
    assert "never created" in " ".join(capsys.readouterr().err.split()) and not new.parent.exists()


# -- 4. resumable state trusted by content -------------------------------------------------------------------------------


def _rewrite_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    assert len(old) == len(new)
    st = path.stat()
    data = path.read_bytes()
    assert data.count(old) >= 1
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _wait_out_the_racy_window(path: Path) -> None:
    """Until the file is old enough for its digest to be cached (predict.fingerprint rule 5)."""
    import predict.fingerprint

    racy_ns = getattr(predict.fingerprint, "RACY_NS", 0)  # (old code cached at once)
    while path.stat().st_ctime_ns > time.time_ns() - racy_ns - 10_000_000:
        time.sleep(0.1)


def test_a_same_size_same_mtime_rewrite_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old code keyed the hash cache on (path, size, mtime, inode): a rewrite that kept the size and restored the
    mtime got the old file's sha256, so resumable state made from the old content was taken as this content's."""
    import hashlib

    from predict.fingerprint import file_sha256

    cache = tmp_path / "hash-cache"
    monkeypatch.setenv("PREDICT_HASH_CACHE", str(cache))
    path = tmp_path / "tasks.bin"
    path.write_bytes(b"the tasks the state was made from")
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not cache.exists(), "a file changed this recently is not cached: a rewrite in the same tick keeps stamps"
    _wait_out_the_racy_window(path)
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest() and any(cache.rglob("*"))
    _rewrite_keeping_size_and_mtime(path, b"made from", b"forged in")
    assert file_sha256(path) == hashlib.sha256(b"the tasks the state was forged in").hexdigest()


def test_a_rollouts_persisted_rows_are_redone_after_a_same_size_same_mtime_rewrite_of_its_tasks(
    study: dict, splits: dict, endpoint: Any, tmp_path: Path
) -> None:
    from predict.env.records import RECORD_SCHEMA
    from predict.fingerprint import resumable_rows
    from predict.rollouts import RolloutJob, job_fingerprint, run_job

    tasks = write_rows(splits["val"][:1], MBPP_SCHEMA, tmp_path / "val.parquet")
    first = RolloutJob(tasks_path=tasks, split="val", out=tmp_path / "first.parquet", model="scripted",
                       checkpoint="base", arm="A", seed=42, base_url=endpoint.base_url)
    run_job(first, study)
    (persisted,) = read_rows(first.out)
    _wait_out_the_racy_window(tasks)
    job = RolloutJob(**{**first.__dict__, "out": tmp_path / "out.parquet"})
    killed = resumable_rows(job.out, RECORD_SCHEMA, ("task_id", "sample"), job_fingerprint(job, study))
    killed.append([{**persisted, "trace_id": "persisted"}])  # a killed run's row, made from these tasks
    text = splits["val"][0]["text"].encode()
    _rewrite_keeping_size_and_mtime(tasks, text[:8], text[:8].swapcase())  # another task, same size and mtime
    run_job(job, study)
    assert [r["trace_id"] for r in read_rows(job.out)] != ["persisted"]


# -- the reviewer bundle's doors: one test split's registry lines, and the replay of recorded rollouts ----------------


def test_replay_clears_only_recorded_rollouts_and_writes_nowhere(study: dict, endpoint: Any, tmp_path: Path) -> None:
    from predict.campaign import replay
    from predict.cli import main

    test = write_test_split(study, tmp_path / "data" / "test.parquet")
    assert main(_evaluate_test(study, test, tmp_path / "results", "step2", endpoint)) == 0
    ledger = registry_ledger()
    before = {p: p.read_bytes() for p in ledger.parent.iterdir()}
    first = sorted(campaign_test_split(study).task_ids)[0]
    cleared = replay(study, run="B", checkpoint="step2", seed=42, model="scripted", task_ids=[first])
    assert [(t["task_id"], t["sample"]) for t in cleared.tasks] == [(first, 0)]
    assert cleared.done["status"] == "done" and cleared.done["sha256"]
    refusals = {
        "were not among the tasks it evaluated": dict(task_ids=[sorted(campaign_test_split(study).task_ids)[1]]),
        "has no done test evaluation": dict(checkpoint="sft"),
        "is not the checkpoint the ledger recorded": dict(model=str(tmp_path)),
    }
    for message, change in refusals.items():
        with pytest.raises(SplitGuardError, match=message):
            replay(study, **{**dict(run="B", checkpoint="step2", seed=42, model="scripted", task_ids=[first]),
                             **change})
    changed = {**study, "evaluation": {**study["evaluation"], "max_tokens": 5}}
    with pytest.raises(SplitGuardError, match=r"differs from the frozen design .* in evaluation\.max_tokens"):
        replay(changed, run="B", checkpoint="step2", seed=42, model="scripted", task_ids=[first])
    with pytest.raises(SplitGuardError, match="no such ledger"):
        replay(study, run="B", checkpoint="step2", seed=42, model="scripted", task_ids=[first],
               ledger=tmp_path / "none" / "ledger.jsonl")
    assert {p: p.read_bytes() for p in ledger.parent.iterdir()} == before and not (tmp_path / "none").exists()
    # the split's registry lines, read only: its campaign, started and done
    history = split_history(ledger, campaign_test_split(study).sha256)
    assert [e.get("event") or e.get("status") for e in history] == ["campaign", "started", "done"]
    assert split_history(ledger, "another split") == []


def test_the_campaigns_split_is_derived_with_no_registry_and_no_split_file(study: dict, tmp_path: Path) -> None:
    """What `predict split` writes is what the seal derives: the same ids and content hash, in a folder of its own."""
    from predict.cli import main

    (tmp_path / "slice.json").write_text(json.dumps({"data": study["data"]}))
    assert main(["split", "--config-slice", str(tmp_path / "slice.json"), "--out-dir", str(tmp_path / "data")]) == 0
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())["splits"]["test"]
    split = campaign_test_split(study)
    assert split.sha256 == manifest["content_sha256"] and sorted(split.task_ids) == manifest["task_ids"]
    assert re.fullmatch(r"the test split of .*mbpp\.jsonl \(split seed 42, 500 tasks\)", split.describe())

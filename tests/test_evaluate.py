"""The `predict evaluate` stage: greedy sampling from the evaluation section, runs (arms and ablations), and the
test split behind the selection and the ledger (config hash and selection recorded)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from predict.campaign import SplitGuardError, campaign_from_stats, config_hash, registry_ledger
from predict.config import ConfigError, load_config
from predict.data import MBPP_SCHEMA
from predict.evaluate import (
    CheckpointEval,
    evaluate,
    evaluate_checkpoints,
    evaluation_config,
    evaluation_job,
    run_identity,
)
from predict.outputs import read_rows, write_rows
from predict.serving.server import VLLMServer
from predict.stats import SELECTION_SCHEMA

from .conftest import REPO
from .scripted_endpoint import ScriptedEndpoint
from .synthetic import write_test_split

SOLVE = 'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'
# the test split's first task (2): the campaign's tests evaluate it alone (evaluation.tasks 1)
SOLVE_TEST = ('CALL apply_patch {"find": "# Write your function here.", "replace": "def similar_elements(a, b):\\n'
              '    return tuple(set(a) & set(b))"}')


@pytest.fixture
def study(tmp_path: Path) -> dict[str, Any]:
    config = load_config(REPO / "config" / "local.yaml")
    # a results folder of its own: the campaign looks for history in the study's results_dir, and the checkout's
    # results/ may hold a real campaign (CI runs `all` before the tests) that this test's ledger does not know
    config["results_dir"] = str(tmp_path / "results")
    config["env"]["temperature"] = 1.0
    config["evaluation"].update({"temperature": 0.0, "max_tokens": 77, "tasks": 1})
    return config


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    keep = ["<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>", "FINAL: done"]
    with ScriptedEndpoint({"multiply": [SOLVE, *keep], "similar elements": [SOLVE_TEST, *keep]}) as ep:
        yield ep


@pytest.fixture
def task_file(tmp_path: Path, mbpp_rows: list[dict]) -> Path:
    return write_rows([r for r in mbpp_rows if r["task_id"] == 127], MBPP_SCHEMA, tmp_path / "tasks.parquet")


@pytest.fixture
def test_file(tmp_path: Path, study: dict[str, Any]) -> Path:
    """The test split of the study's data section: the only tasks file a campaign takes."""
    return write_test_split(study, tmp_path / "test.parquet")


def test_runs_are_arms_or_ablations_of_their_base_arm(study) -> None:
    assert run_identity(study, "A") == ("A", "none")
    assert run_identity(study, "forced_keep") == ("B", "forced_keep")
    assert run_identity(study, "alpha0") == ("B", "none")
    with pytest.raises(ConfigError, match="neither an arm, an ablation nor an extension"):
        run_identity(study, "C")


def test_evaluation_is_greedy_with_its_own_settings(study, task_file: Path, endpoint, tmp_path: Path) -> None:
    out = tmp_path / "eval" / "forced_keep" / "base" / "val" / "seed42.parquet"
    summary = evaluate(study, run="forced_keep", checkpoint="base", split="val", seed=42, tasks_path=task_file,
                       model="scripted", out=out, base_url=endpoint.base_url)
    (row,) = read_rows(out)
    assert (row["arm"], row["protocol"], row["variant"], row["checkpoint"]) == ("B", "predictive", "forced_keep", "base")
    assert summary["pass_rate"] == 1.0 and row["final_pass"]
    sampling = [r["sampling"] for r in endpoint.requests if "sampling" in r]
    assert sampling and all(s.get("temperature") == 0.0 and s.get("max_tokens") == 77 for s in sampling)


def _val_stats(tmp_path: Path, selected: str = "step100") -> tuple[Path, Path]:
    """The val statistics a campaign reads: B and forced_keep at seed 42 (B evaluated at sft and two steps)."""
    selection = write_rows(
        [{"run": run, "seed": 42, "mode": "fixed", "step": 100, "checkpoint": selected, "val_pass_at_1": 0.5,
          "fallback": False} for run in ("B", "forced_keep")], SELECTION_SCHEMA, tmp_path / "selection.parquet")
    metrics = write_rows(
        [{"run": "B", "checkpoint": c, "split": "val", "seed": 42} for c in ("sft", "step50", "step100")]
        + [{"run": "forced_keep", "checkpoint": c, "split": "val", "seed": 42} for c in ("step50", "step100")],
        pa.schema([("run", pa.string()), ("checkpoint", pa.string()), ("split", pa.string()), ("seed", pa.int64())]),
        tmp_path / "metrics.parquet")
    return selection, metrics


def _campaign(study, task_file: Path, tmp_path: Path, *checkpoints: str, run: str = "B", **kw: Any) -> list[dict]:
    selection, metrics = _val_stats(tmp_path)
    evals = [CheckpointEval(c, "scripted", tmp_path / "eval" / run / c / "test" / "seed42.parquet") for c in checkpoints]
    return evaluate_checkpoints(evaluation_config(study, "test"), run=run, split="test", seed=42,
                                tasks_path=task_file, checkpoints=evals,
                                selection_path=selection, val_metrics=metrics, **kw)


def test_test_split_only_through_the_campaign(study, task_file: Path, endpoint, tmp_path: Path) -> None:
    kw = dict(run="B", split="test", seed=42, tasks_path=task_file, model="scripted", base_url=endpoint.base_url)
    with pytest.raises(SplitGuardError, match="evaluated once"):
        evaluation_job(evaluation_config(study, "test"), checkpoint="step100", out=tmp_path / "t.parquet", **kw)
    with pytest.raises(SplitGuardError, match="evaluate_checkpoints"):
        evaluate(study, checkpoint="step100", out=tmp_path / "t.parquet", **kw)


def test_campaign_plan_is_reference_selected_and_listed_checkpoints(study, tmp_path: Path) -> None:
    selection, metrics = _val_stats(tmp_path)
    assert campaign_from_stats(study, metrics, selection) == [("B", "sft", 42), ("B", "step100", 42),
                                                              ("forced_keep", "step100", 42)]
    listed = {**study, "evaluation": {**study["evaluation"], "test_checkpoints": ["step50", "step75"]}}
    # step75 was never evaluated on val: not on the list; an ablation has no reference of its own
    assert campaign_from_stats(listed, metrics, selection) == [("B", "sft", 42), ("B", "step100", 42),
                                                               ("B", "step50", 42), ("forced_keep", "step100", 42),
                                                               ("forced_keep", "step50", 42)]


def test_campaign_records_hash_and_list_then_refuses_a_second_evaluation(study, test_file: Path, endpoint,
                                                                         tmp_path: Path) -> None:
    summaries = _campaign(study, test_file, tmp_path, "sft", "step100", base_url=endpoint.base_url)
    assert [s["checkpoint"] for s in summaries] == ["sft", "step100"] and all(s["ran"] == 1 for s in summaries)
    ledger = registry_ledger()
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    campaign = entries[0]
    assert campaign["event"] == "campaign" and campaign["config_hash"] == config_hash(study)
    assert campaign["plan"] == [["B", "sft", 42], ["B", "step100", 42], ["forced_keep", "step100", 42]]
    done = [e for e in entries if e.get("status") == "done"]
    assert [(e["run"], e["checkpoint"]) for e in done] == [("B", "sft"), ("B", "step100")]
    assert done[1]["selection"]["checkpoint"] == "step100" and done[1]["evaluation"]["temperature"] == 0.0
    for c in ("sft", "step100"):
        assert read_rows(tmp_path / "eval" / "B" / c / "test" / "seed42.parquet")[0]["split"] == "test"
    with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}:\d+: B step100 seed 42 was already evaluated"):
        _campaign(study, test_file, tmp_path, "step100", base_url=endpoint.base_url)


def test_campaign_runs_on_the_stages_own_config_view(study, test_file: Path, endpoint, tmp_path: Path) -> None:
    """`predict evaluate` hands the campaign its stage's typed object (typed sections inside): the rollout job's
    fingerprint and ledger entry must take it as they take a plain dict (CI's local `all` crashed here)."""
    from predict.stages import stage_settings

    view = stage_settings("evaluate-test", study)
    summaries = _campaign(view, test_file, tmp_path, "sft", base_url=endpoint.base_url)
    assert [(s["checkpoint"], s["ran"]) for s in summaries] == [("sft", 1)]
    done = [json.loads(line) for line in (registry_ledger()).read_text().splitlines()][-1]
    assert done["status"] == "done" and done["evaluation"]["selection"]["mode"] == study["evaluation"]["selection"]["mode"]


def test_campaign_refuses_a_checkpoint_outside_its_list(study, test_file: Path, endpoint, tmp_path: Path) -> None:
    _campaign(study, test_file, tmp_path, "step100", base_url=endpoint.base_url)
    ledger = registry_ledger()
    for run, checkpoint in (("B", "step50"), ("forced_keep", "sft")):  # evaluated on val, but not selected
        with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}: {run} {checkpoint} seed 42 is not in "
                                                  "the test campaign's list"):
            _campaign(study, test_file, tmp_path, checkpoint, run=run, base_url=endpoint.base_url)
    assert not (tmp_path / "eval" / "B" / "step50" / "test").exists()


def test_a_second_campaign_under_a_changed_config_is_refused(study, test_file: Path, endpoint, tmp_path: Path) -> None:
    _campaign(study, test_file, tmp_path, "sft", base_url=endpoint.base_url)
    # what does not shape results is not a new design ...
    cosmetic = {**study, "run_name": "renamed", "power": {**study["power"], "simulations": 7}}
    assert config_hash(cosmetic) == config_hash(study)
    # ... what does is: even an entry never evaluated is refused, naming the ledger and the changed key
    changed = {**study, "evaluation": {**study["evaluation"], "max_tokens": 78}}
    ledger = registry_ledger()
    with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}: the test campaign on this split and base "
                                              r"model .* was frozen .* differs in evaluation\.max_tokens"):
        _campaign(changed, test_file, tmp_path, "step100", base_url=endpoint.base_url)
    assert not (tmp_path / "eval" / "B" / "step100" / "test").exists()


def test_an_interrupted_campaign_resumes_without_redoing_rollouts(study, test_file: Path, endpoint, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import predict.evaluate as evaluate_mod

    real_roll_out, calls = evaluate_mod.roll_out, []

    def killed_on_the_second_checkpoint(job, config):
        calls.append(job.checkpoint)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real_roll_out(job, config)

    monkeypatch.setattr(evaluate_mod, "roll_out", killed_on_the_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        _campaign(study, test_file, tmp_path, "sft", "step100", base_url=endpoint.base_url)
    sft_out = tmp_path / "eval" / "B" / "sft" / "test" / "seed42.parquet"
    # nothing published (Snakemake would delete a failed job's outputs), the rollouts persisted
    assert not sft_out.exists() and any(sft_out.with_name(sft_out.name + ".partial").glob("part-*.parquet"))
    monkeypatch.setattr(evaluate_mod, "roll_out", real_roll_out)
    requests = len(endpoint.requests)
    summaries = _campaign(study, test_file, tmp_path, "sft", "step100", base_url=endpoint.base_url)
    assert [(s["checkpoint"], s["ran"], s["rollouts"]) for s in summaries] == [("sft", 0, 1), ("step100", 1, 1)]
    assert read_rows(sft_out)[0]["final_pass"] and len(endpoint.requests) > requests


def test_a_test_evaluation_whose_rollouts_failed_publishes_nothing_and_a_rerun_runs_them(
    study, test_file: Path, endpoint, tmp_path: Path
) -> None:
    """A model server that refuses (2026-12-06: a 4B GPU server whose every episode made no model call) must not
    become the test campaign's one evaluation: the statistics drop failed rows, so it would be published with fewer
    tasks and never rerun. Nothing is published, the ledger has no ``done`` line, and a rerun runs the failed task."""
    from predict.rollouts import EvaluationRolloutsFailed

    from .scripted_endpoint import HttpError

    scripts = dict(endpoint.scripts)
    endpoint.scripts = {marker: [HttpError(500, "EngineDeadError: the engine died")] for marker in scripts}
    out = tmp_path / "eval" / "B" / "sft" / "test" / "seed42.parquet"
    with pytest.raises(EvaluationRolloutsFailed, match=r"1 of the B sft test evaluation's rollouts failed.*task \d+"):
        _campaign(study, test_file, tmp_path, "sft", base_url=endpoint.base_url)
    assert not out.exists()
    lines = [json.loads(line) for line in registry_ledger().read_text().splitlines()]
    assert [e.get("status") for e in lines if e.get("checkpoint") == "sft"] == ["started"]
    endpoint.scripts = scripts  # the server works again: the rerun resumes the campaign and runs the task
    (summary,) = _campaign(study, test_file, tmp_path, "sft", base_url=endpoint.base_url)
    assert (summary["ran"], summary["rollouts"], summary["failed_infra"]) == (1, 1, 0)
    assert all(r["ok"] for r in read_rows(out))


class FakeServer:
    """predict.serving.server.VLLMServer's surface, serving the scripted endpoint; records starts and reloads."""

    log: list[tuple[str, str]] = []
    from_serving = classmethod(VLLMServer.from_serving.__func__)  # the real constructor from the serving section

    def __init__(self, model, *, served_model_name=None, worker_extension=False, **kw: Any) -> None:
        assert worker_extension and served_model_name == "policy"
        self.model = str(model)

    def start(self) -> FakeServer:
        FakeServer.log.append(("start", self.model))
        return self

    def reload_weights(self, weights_dir, *, version=None, drain=True) -> list[str]:
        FakeServer.log.append(("reload", str(weights_dir)))
        return []

    def stop(self) -> None:
        FakeServer.log.append(("stop", self.model))


def test_one_server_per_run_and_seed_reloaded_between_checkpoints(study, task_file: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import predict.serving.server

    study = {**study, "serving": {**study["serving"], "shared": None}}  # a server of this job's own: counted here
    with ScriptedEndpoint({"multiply": [SOLVE, "FINAL: done"]}) as ep:
        FakeServer.base_url = ep.base_url
        FakeServer.log = []
        monkeypatch.setattr(predict.serving.server, "VLLMServer", FakeServer)
        folders = [tmp_path / c for c in ("sft", "step1", "step2")]
        for folder in folders:
            folder.mkdir()
        evals = [CheckpointEval(c.name, str(c), tmp_path / "eval" / "A" / c.name / "val" / "seed42.parquet")
                 for c in folders]
        summaries = evaluate_checkpoints(evaluation_config(study, "val"), run="A", split="val", seed=42,
                                         tasks_path=task_file, checkpoints=evals)
        assert FakeServer.log == [("start", str(folders[0])), ("reload", str(folders[1])),
                                  ("reload", str(folders[2])), ("stop", str(folders[0]))]
        assert [read_rows(e.out)[0]["checkpoint"] for e in evals] == ["sft", "step1", "step2"]
        assert {r.get("model") for r in ep.requests if r.get("model")} <= {"policy"}
        assert all(s["server_starts"] == 1 for s in summaries)
        # an HF id has no folder to reload from: a fresh server
        FakeServer.log = []
        hub = [CheckpointEval("base", "Qwen/Qwen3-4B-Base", tmp_path / "eval" / "A" / "base" / "val" / "seed42.parquet"),
               CheckpointEval("sft2", str(folders[0]), tmp_path / "eval" / "A" / "sft2" / "val" / "seed42.parquet")]
        evaluate_checkpoints(evaluation_config(study, "val"), run="A", split="val", seed=42, tasks_path=task_file,
                             checkpoints=hub)
        assert [e[0] for e in FakeServer.log] == ["start", "reload", "stop"]


@pytest.mark.parametrize("one_job", [False, True], ids=["a job per run", "the campaign as one job"])
def test_campaign_runs_from_the_val_statistics_to_the_test_statistics(study, mbpp_rows: list[dict], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      one_job: bool) -> None:
    """The stages as the workflow chains them: val evaluations -> `predict stats` (selection) -> the campaign's test
    evaluations (reference + selected) -> `predict stats --selection` on the test files. The campaign as the paper
    runs it (a job per run and seed) or as the embedded default does (issue 41: its jobs share one server, so the
    whole campaign is one `predict evaluate` with a --run and --seed per checkpoint)."""
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.cli import main

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    config = {**study, "ablations": {}, "extensions": {}, "evaluation": {**study["evaluation"], "tasks": 2}}
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    tasks = {"val": write_rows([r for r in mbpp_rows if r["task_id"] in (10, 28)], MBPP_SCHEMA, tmp_path / "val.parquet"),
             "test": write_test_split(config, tmp_path / "test.parquet")}  # val tasks; the whole test split

    def files(split: str, checkpoints: list[str], arm: str) -> list[CheckpointEval]:
        return [CheckpointEval(c, "scripted", tmp_path / "eval" / arm / c / split / "seed42.parquet") for c in checkpoints]

    with ScriptedEndpoint({"multiply": [SOLVE, "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",
                                        "FINAL: done"], "": ["FINAL: no patch"]}) as endpoint:
        _val_to_test_stats(config, tasks, files, endpoint, tmp_path, main, one_job)


def _val_to_test_stats(config, tasks, files, endpoint, tmp_path: Path, main, one_job: bool = False) -> None:
    for arm in ("A", "B"):
        evaluate_checkpoints(evaluation_config(config, "val"), run=arm, split="val", seed=42, tasks_path=tasks["val"],
                             checkpoints=files("val", ["sft", "step2"], arm), base_url=endpoint.base_url)
    val = sorted(str(p) for p in (tmp_path / "eval").glob("*/*/val/*.parquet"))
    assert main(["stats", "--config-json", json.dumps(config), "--eval", *val, "--out-dir", str(tmp_path / "stats")]) == 0
    selection, metrics = tmp_path / "stats" / "selection.parquet", tmp_path / "stats" / "metrics.parquet"
    assert campaign_from_stats(config, metrics, selection) == [("A", "sft", 42), ("A", "step2", 42),
                                                               ("B", "sft", 42), ("B", "step2", 42)]
    if one_job:
        args = [a for arm in ("A", "B") for e in files("test", ["sft", "step2"], arm)
                for a in ("--run", arm, "--seed", "42", "--checkpoint", e.checkpoint, "--model", e.model, "--out",
                          str(e.out))]
        assert main(["evaluate", "--config-json", json.dumps(config), "--split", "test", "--tasks-file",
                     str(tasks["test"]), *args, "--base-url", endpoint.base_url,
                     "--selection", str(selection), "--val-metrics", str(metrics)]) == 0
        lines = [json.loads(line) for line in registry_ledger().read_text().splitlines()]
        assert {(e["run"], e["checkpoint"]) for e in lines if e.get("status") == "done"} == {(a, c) for a in ("A", "B") for c in ("sft", "step2")}
        # the campaign froze the design of the stage's slice, though main read it through the typed view (issue 40)
        from predict.campaign import design_config
        from predict.stages import config_slice

        frozen = config_slice(config, "evaluate-test")
        (campaign,) = [e for e in lines if e.get("event") == "campaign"]
        assert campaign["config_hash"] == config_hash(frozen) and campaign["design"] == design_config(frozen)
        for arm in ("A", "B"):
            assert {r["arm"] for c in ("sft", "step2") for r in read_rows(tmp_path / "eval" / arm / c / "test" /
                                                                          "seed42.parquet")} == {arm}
    else:
        for arm in ("A", "B"):
            evaluate_checkpoints(evaluation_config(config, "test"), run=arm, split="test", seed=42,
                                 tasks_path=tasks["test"],
                                 checkpoints=files("test", ["sft", "step2"], arm), base_url=endpoint.base_url,
                                 selection_path=selection, val_metrics=metrics)
    test = sorted(str(p) for p in (tmp_path / "eval").glob("*/*/test/*.parquet"))
    assert len(test) == 4
    assert main(["stats", "--config-json", json.dumps(config), "--eval", *test, "--selection", str(selection),
                 "--out-dir", str(tmp_path / "test" / "stats")]) == 0  # the checkout's ledger: the campaign's
    test_metrics = read_rows(tmp_path / "test" / "stats" / "metrics.parquet")
    assert {(m["run"], m["checkpoint"], m["split"], m["n_scored"]) for m in test_metrics} == {
        (arm, c, "test", 2) for arm in ("A", "B") for c in ("sft", "step2")}


def test_an_evaluation_resumes_only_rows_of_the_same_checkpoint_and_settings(
    study, task_file: Path, endpoint, tmp_path: Path
) -> None:
    """Issue 15: a killed evaluation's persisted rows are reused by the unchanged rerun and dropped when the
    evaluation settings changed (old code kept them under the new settings)."""
    from predict.env.records import RECORD_SCHEMA
    from predict.fingerprint import resumable_rows
    from predict.rollouts import job_fingerprint

    kw = dict(run="B", checkpoint="base", split="val", seed=42, tasks_path=task_file, model="scripted",
              base_url=endpoint.base_url)
    evaluate(study, **kw, out=tmp_path / "first.parquet")
    (row,) = read_rows(tmp_path / "first.parquet")
    out = tmp_path / "eval" / "B" / "base" / "val" / "seed42.parquet"

    def killed_with_one_row() -> None:
        fp = job_fingerprint(evaluation_job(evaluation_config(study, "val"), **kw, out=out), study)
        resumable_rows(out, RECORD_SCHEMA, ("task_id", "sample"), fp).append(
            [{**row, "trace_id": "persisted"}]
        )

    killed_with_one_row()
    assert evaluate(study, **kw, out=out)["ran"] == 0 and read_rows(out)[0]["trace_id"] == "persisted"
    out.unlink()
    killed_with_one_row()
    study["evaluation"]["max_tokens"] = 99
    assert evaluate(study, **kw, out=out)["ran"] == 1 and read_rows(out)[0]["trace_id"] != "persisted"


def _ledger_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_ledger_is_read_by_its_file_lines_and_a_torn_line_stops_both_readers(study, test_file: Path,
                                                                                  tmp_path: Path) -> None:
    """Both readers of the test ledger (the rollout guard, the campaign) skip blank lines, name the file line of an
    earlier evaluation, and stop on a line that is not an entry (a torn write) instead of crashing in json."""
    from predict.campaign import TestLedger, guard_tasks

    plan = [("B", "sft", 42)]
    ledger = tmp_path / "ledger.jsonl"

    def admit() -> str:
        return TestLedger(ledger).admit(study, plan, [("B", "sft", 42, "m")], tasks_path=test_file)[0].campaign

    ident = admit()  # line 1: the campaign
    campaign = ledger.read_text().strip()
    done = json.dumps({"run": "B", "arm": "B", "checkpoint": "sft", "seed": 42, "status": "done", "time": "t0",
                       "campaign": ident})

    def guard() -> None:
        guard_tasks(split="test", tasks_path=test_file, task_ids=[2], run="B", checkpoint="sft", seed=42,
                    admission={"campaign": ident}, ledger=ledger)

    _ledger_lines(ledger, campaign, "", done)
    with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}:3: run B checkpoint sft seed 42 was already"):
        guard()
    with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}:3: B sft seed 42 was already evaluated"):
        admit()
    _ledger_lines(ledger, campaign, done[:25])
    for read in (guard, admit):
        with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}:2: not a ledger entry \(not JSON"):
            read()
    _ledger_lines(ledger, campaign, "[1, 2]")
    with pytest.raises(SplitGuardError, match=r":2: not a ledger entry \(a JSON list, not an object\)"):
        guard()


# -- the typed view (issue 40): `predict evaluate` reads its slice as the typed config models -------------------------


@pytest.mark.parametrize("split", ["val", "test"])
def test_the_stage_main_gets_its_typed_view_and_a_key_outside_its_entry_raises(
    split: str, study, mbpp_rows: list[dict], test_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`predict evaluate` (val: the evaluate row; test: evaluate-test) hands its main its own typed object (issue
    61): typed reads, a key outside the row refused naming stage and key, and the declared campaign's reason read
    from it. Old code: main got a typed view over the dict slice."""
    import predict.evaluate as evaluate_mod
    from predict.cli import main
    from predict.config.models import plain_data
    from predict.stages import SliceError, StageSettings, config_slice, slice_file, stage_model

    stage = "evaluate-test" if split == "test" else "evaluate"
    study["evaluation"]["new_campaign"] = "a second look"  # in evaluate-test's entry only
    seen: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(evaluate_mod, "evaluate_checkpoints", lambda config, **kw: seen.append((config, kw)) or [])
    val_task = write_rows([r for r in mbpp_rows if r["task_id"] == 10], MBPP_SCHEMA, tmp_path / "val.parquet")
    tasks = test_file if split == "test" else val_task  # the seal lets only these through
    out = tmp_path / "eval" / "B" / "sft" / split / "seed42.parquet"
    assert main(["evaluate", "--config-slice", slice_file(study, stage, tmp_path / "slices"), "--split", split,
                 "--run", "B", "--seed", "42", "--tasks-file", str(tasks), "--checkpoint", "sft", "--model", "m",
                 "--out", str(out)]) == 0
    ((config, kw),) = seen
    assert isinstance(config, StageSettings) and type(config) is stage_model(stage)
    assert plain_data(config) == config_slice(study, stage)  # its plain data is the slice, unchanged
    assert type(config.evaluation.samples) is int and config.evaluation.max_tokens == 77
    assert type(config.env.concurrency) is int and config.env.concurrency == study["env"]["concurrency"]
    assert kw["new_campaign"] == ("a second look" if split == "test" else None)
    outside = "power" if split == "test" else "evaluation.new_campaign"
    with pytest.raises(SliceError, match=rf"stage '{stage}' read config key '{re.escape(outside)}'.*stages\.py"):
        _ = config.power if split == "test" else config.evaluation.new_campaign


def test_the_typed_view_hashes_and_records_the_bytes_of_the_slice(study, test_file: Path, tmp_path: Path) -> None:
    """What a test evaluation hashes or records comes from the slice's plain data (`plain_data` of the stage's typed
    object), so the typed object changes no frozen design, ledger line or resume fingerprint: the design hash is the
    slice's, the ledger's evaluation section is the slice's section, and a YAML `temperature: 0` (an int the model
    accepts; typed it reads 0.0) reaches the job as the int. Old code: evaluation_job could not read a typed config."""
    from dataclasses import replace

    from predict.campaign import design_config
    from predict.rollouts import job_fingerprint
    from predict.runs import resolve_run
    from predict.stages import StageSettings, config_slice, stage_settings

    study["evaluation"]["temperature"] = 0
    sliced = config_slice(study, "evaluate-test")
    view = stage_settings("evaluate-test", study)  # as `predict evaluate --split test` hands it to main
    assert isinstance(view, StageSettings) and view.evaluation.temperature == 0.0  # typed: a float
    assert isinstance(view.evaluation.temperature, float)
    job = evaluation_job(view, run="B", checkpoint="step100", split="test", seed=42, tasks_path=test_file,
                         model="scripted", out=tmp_path / "t.parquet", test_ledger=registry_ledger(),
                         selection=[{"run": "B", "seed": 42, "checkpoint": "step100"}])
    assert job.ledger_extra is not None
    design = json.dumps(design_config(sliced), sort_keys=True, separators=(",", ":")).encode()
    assert job.ledger_extra["config_hash"] == config_hash(sliced) == __import__("hashlib").sha256(design).hexdigest()
    # the ledger's evaluation section: the bytes the old JSON round trip of the slice's section gave
    assert json.dumps(job.ledger_extra["evaluation"]) == json.dumps(json.loads(json.dumps(sliced["evaluation"])))
    assert json.dumps(job.sampling) == '{"temperature": 0, "max_tokens": 77}'
    assert (job.samples, job.n_tasks) == (sliced["evaluation"]["samples"], sliced["evaluation"]["tasks"])
    # the resume fingerprint is the one of the job the old code built from the raw values
    old = replace(job, sampling={"temperature": 0, "max_tokens": 77}, samples=1, n_tasks=1)
    run_config = resolve_run(view, "B").env(view)
    assert job_fingerprint(job, run_config).digest == job_fingerprint(old, run_config).digest


def test_a_val_evaluation_runs_from_the_stages_typed_slice(study, mbpp_rows: list[dict], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`predict evaluate --config-slice` on val, as the workflow runs it, end to end through the typed view: the
    rollouts under the evaluation section's sampling, one row per task."""
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.cli import main
    from predict.stages import slice_file

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    tasks = write_rows([r for r in mbpp_rows if r["task_id"] == 10], MBPP_SCHEMA, tmp_path / "val.parquet")
    out = tmp_path / "eval" / "A" / "sft" / "val" / "seed42.parquet"
    with ScriptedEndpoint({"": ["FINAL: no patch"]}) as endpoint:
        assert main(["evaluate", "--config-slice", slice_file(study, "evaluate", tmp_path / "slices"), "--split",
                     "val", "--run", "A", "--seed", "42", "--tasks-file", str(tasks), "--checkpoint", "sft", "--model",
                     "scripted", "--out", str(out), "--base-url", endpoint.base_url]) == 0
        sampling = [r["sampling"] for r in endpoint.requests if "sampling" in r]
    assert [(r["task_id"], r["arm"], r["split"]) for r in read_rows(out)] == [(10, "A", "val")]
    assert sampling and all(s.get("temperature") == 0.0 and s.get("max_tokens") == 77 for s in sampling)

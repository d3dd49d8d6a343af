"""The `predict evaluate` stage: greedy sampling from the evaluation section, runs (arms and ablations), and the
test split behind the selection and the ledger (config hash and selection recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from predict.config import ConfigError, load_config
from predict.data import MBPP_SCHEMA
from predict.evaluate import config_hash, evaluate, evaluation_job, run_identity
from predict.io import read_rows, write_rows
from predict.rollouts import SplitGuardError
from predict.stats import SELECTION_SCHEMA

from .conftest import REPO
from .scripted_endpoint import ScriptedEndpoint

SOLVE = 'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'


@pytest.fixture
def study() -> dict[str, Any]:
    config = load_config(REPO / "config" / "local.yaml")
    config["env"]["temperature"] = 1.0
    config["evaluation"].update({"temperature": 0.0, "max_tokens": 77})
    return config


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    with ScriptedEndpoint({"multiply": [SOLVE, "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",
                                        "FINAL: done"]}) as ep:
        yield ep


@pytest.fixture
def task_file(tmp_path: Path, mbpp_rows: list[dict]) -> Path:
    return write_rows([r for r in mbpp_rows if r["task_id"] == 127], MBPP_SCHEMA, tmp_path / "tasks.parquet")


def test_runs_are_arms_or_ablations_of_their_base_arm(study) -> None:
    assert run_identity(study, "A") == ("A", "none")
    assert run_identity(study, "forced_keep") == ("B", "forced_keep")
    assert run_identity(study, "alpha0") == ("B", "none")
    with pytest.raises(ConfigError, match="neither an arm nor an ablation"):
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


def test_test_split_needs_the_selected_checkpoint_and_records_it(study, task_file: Path, endpoint,
                                                                  tmp_path: Path) -> None:
    selection = tmp_path / "selection.parquet"
    write_rows([{"run": "B", "seed": 42, "mode": "fixed", "step": 100, "checkpoint": "step100",
                 "val_pass_at_1": 0.5, "fallback": False}], SELECTION_SCHEMA, selection)
    ledger = tmp_path / "ledger.jsonl"
    kw = dict(run="B", split="test", seed=42, tasks_path=task_file, model="scripted", base_url=endpoint.base_url)
    with pytest.raises(SplitGuardError, match="evaluated once"):
        evaluation_job(study, checkpoint="step100", out=tmp_path / "t.parquet", **kw)
    with pytest.raises(SplitGuardError, match="selected checkpoint step100"):
        evaluation_job(study, checkpoint="sft", out=tmp_path / "t.parquet", test_ledger=ledger,
                       selection_path=selection, **kw)
    evaluate(study, checkpoint="step100", out=tmp_path / "t.parquet", test_ledger=ledger, selection_path=selection,
             **kw)
    done = [json.loads(line) for line in ledger.read_text().splitlines()][-1]
    assert done["status"] == "done" and done["run"] == "B"
    assert done["config_hash"] == config_hash(study) and len(done["config_hash"]) == 64
    assert done["selection"]["checkpoint"] == "step100" and done["selection"]["mode"] == "fixed"
    assert done["evaluation"]["temperature"] == 0.0
    with pytest.raises(SplitGuardError, match="already evaluated"):
        evaluate(study, checkpoint="step100", out=tmp_path / "t2.parquet", test_ledger=ledger,
                 selection_path=selection, **kw)

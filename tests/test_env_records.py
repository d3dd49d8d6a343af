"""Records: the row built from an episode result, the parquet schema, the atomic and resumable writers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from predict.env.protocol import Episode, ProtocolConfig, Step
from predict.env.records import (
    RECORD_COLUMNS,
    STEP_FIELDS,
    build_record,
    read_records,
    rollout_key,
    write_records,
)
from predict.vocabulary import Outcome

META = {
    "arm": "B",
    "seed": 42,
    "checkpoint": "step-0",
    "protocol": "predictive",
    "variant": "none",
    "model": "m",
    "client": "eval",
    "budget": 8,
    "revise_costs_call": True,
    "split": "rl",
}


def episode_result() -> dict:
    ep = Episode(ProtocolConfig("predictive"), lambda code: Outcome.PASS if "*" in code else Outcome.ASSERTION_FAILURE)
    for reply in [
        'CALL apply_patch {"find": "# Write your function here.", "replace": "def f(x, y):\\n    return x + y"}',
        "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>REVISE</DECISION>",
        'CALL apply_patch {"find": "# Write your function here.", "replace": "def f(x, y):\\n    return x * y"}',
        "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",
        "FINAL: done",
    ]:
        ep.step(reply)
    return {"config": ep.config.to_dict(), "steps": [s.to_dict() for s in ep.steps], "summary": ep.summary()}


def record(task_id: int = 7, sample: int = 0, final: str = "PASS") -> dict:
    return build_record(
        meta=META,
        task={"task_id": task_id, "sample": sample},
        agent_result=episode_result(),
        final_verdict={"outcome": final},
        reward=1.0 if final == "PASS" else 0.0,
        ok=True,
        error=None,
        wall_s=0.3,
    )


def test_step_struct_matches_the_step_dataclass() -> None:
    assert [f.name for f in dataclasses.fields(Step)] == [name for name, _ in STEP_FIELDS]


def test_build_record_columns_and_derived_fields() -> None:
    r = record()
    assert set(r) == set(RECORD_COLUMNS)
    assert r["rollout_key"] == rollout_key("B", 42, "step-0", 7, 0) == "B|42|step-0|7|0"
    assert (r["split"], r["stop_reason"], r["calls_used"], r["n_model_calls"]) == ("rl", "final", 2, 5)
    assert (r["ever_revised"], r["n_revised"], r["first_patch_outcome"]) == (True, 1, "ASSERTION_FAILURE")
    assert (r["final_outcome"], r["final_pass"], r["recovered"], r["reward"]) == ("PASS", True, True, 1.0)
    patches = [s for s in r["steps"] if s["action"] == "apply_patch" and s["applied"]]
    assert [(s["prediction"], s["outcome"], s["outcome_seen"]) for s in patches] == [
        ("ASSERTION_FAILURE", "ASSERTION_FAILURE", False),
        ("PASS", "PASS", False),
    ]


def test_failed_rollout_record_has_error_and_null_outcome() -> None:
    r = build_record(
        meta=META,
        task={"task_id": 3},
        agent_result=None,
        final_verdict=None,
        reward=None,
        ok=False,
        error="InterceptionError: gone",
        wall_s=1.0,
    )
    assert (r["stop_reason"], r["final_pass"], r["reward"], r["recovered"], r["steps"]) == (
        "error",
        None,
        None,
        None,
        [],
    )
    assert "gone" in r["error"]


def test_write_records_roundtrip_is_atomic(tmp_path: Path) -> None:
    path = write_records([record(1), record(2, final="ASSERTION_FAILURE")], tmp_path / "r.parquet")
    rows = read_records(path)
    assert [r["task_id"] for r in rows] == [1, 2]
    assert rows[1]["final_pass"] is False and rows[1]["recovered"] is False
    assert rows[0]["steps"][1]["prediction"] == "ASSERTION_FAILURE"
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]  # no temporary file left behind
    empty = read_records(write_records([], tmp_path / "empty.parquet"))
    assert empty == []


def test_rollout_settings_from_the_study_config() -> None:
    from predict.config import load_config
    from predict.env.runner import RolloutSettings
    from predict.stages import EPISODE_VIEW, stage_settings

    config = load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")
    s = RolloutSettings.from_study_config(
        stage_settings(EPISODE_VIEW, config),
        arm="B", seed=42, checkpoint="sft", base_url="http://127.0.0.1:1/v1", model="m", variant="forced_keep"
    )
    p = s.protocol_config
    assert (p.protocol, p.variant, p.budget, s.max_tokens, s.timeout_s, s.arm, s.seed) == (
        "predictive",
        "forced_keep",
        8,
        512,
        3.0,
        "B",
        42,
    )
    assert s.meta()["budget"] == 8 and s.protocol_config.model_call_cap == 17

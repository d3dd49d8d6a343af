"""The environment variants of issue #11 through the real verifiers v1 stack (make_agent + SubprocessConfig +
LocalAgentHarness + the agent program + the sandbox) against a scripted endpoint, as in test_env_rollouts.py:
expensive tests (``test_cost: 3``, both arms) and edit on REVISE (``variant: edit_on_revise``, eval and train
clients). All scenarios run once per module, one `run_rollouts` call per setting, concurrently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from predict.env.protocol import (
    ERRORS,
    RESULT_PATCH_APPLIED,
    RESULT_PATCH_KEPT,
    ProtocolConfig,
    error_result,
)
from predict.env.records import patch_steps, read_records, write_records
from predict.env.runner import default_tokenizer_dir
from tests.test_env_rollouts import (
    ADD,
    AF_REVISE,
    FAILED_AF,
    FINAL,
    MUL_FROM_ADD,
    MUL_FROM_STUB,
    PASS_KEEP,
    PASSED,
    READ,
    READ_STUB,
    STUB,
    TEST,
    CaseRun,
    scripted_case_rollouts,
)

SUB_FROM_STUB = (
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x - y"}'
)


def applied(depth: int, cap: int = 2) -> str:
    return f"status: success\npatch reverted\nreplacement patch applied (chained revision {depth} of {cap})"


CASES: dict[str, tuple[str, list[str]]] = {
    "[case:x_reactive]": ("expensive_reactive", [ADD, TEST, MUL_FROM_ADD, TEST, FINAL]),
    "[case:x_refused]": ("expensive_reactive", [READ] * 8 + [TEST, FINAL]),
    "[case:x_predictive]": ("expensive_predictive", [ADD, AF_REVISE, MUL_FROM_STUB, PASS_KEEP, FINAL]),
    "[case:edit]": ("edit", [ADD, AF_REVISE + "\n" + MUL_FROM_STUB, PASS_KEEP, TEST, FINAL]),
    "[case:edit_chain]": (
        "edit",
        [
            ADD,
            AF_REVISE + "\n" + SUB_FROM_STUB,
            AF_REVISE + "\n" + ADD,
            AF_REVISE + "\n" + MUL_FROM_STUB,  # over the cap: not applied
            READ,
            FINAL,
        ],
    ),
    "[case:edit_missing]": ("edit", [ADD, AF_REVISE, READ, FINAL]),
    "[case:edit_train]": ("edit_train", [ADD, AF_REVISE + "\n" + MUL_FROM_STUB, PASS_KEEP, TEST, FINAL]),
}

SETTINGS: dict[str, dict[str, Any]] = {
    "expensive_reactive": {"protocol": "reactive", "arm": "A", "test_cost": 3},
    "expensive_predictive": {"protocol": "predictive", "arm": "B", "test_cost": 3},
    "edit": {"protocol": "predictive", "variant": "edit_on_revise", "arm": "B"},
    "edit_train": {"protocol": "predictive", "variant": "edit_on_revise", "arm": "B", "client": "train"},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, mbpp_path: Path) -> CaseRun:
    return scripted_case_rollouts(CASES, SETTINGS, mbpp_path, tmp_path_factory.mktemp("verifiers-home"),
                                  first_task_id=9100, tokenizer_json=Path(default_tokenizer_dir()) / "tokenizer.json")


def test_every_extension_rollout_completed_ok(run: CaseRun) -> None:
    assert set(run.records) == set(CASES)
    for marker, rec in run.records.items():
        assert rec["ok"] and rec["error"] is None, (marker, rec["error"])


def test_expensive_tests_reactive_arm(run: CaseRun) -> None:
    marker = "[case:x_reactive]"
    rec = run.records[marker]
    assert run.results(marker) == [RESULT_PATCH_APPLIED, FAILED_AF, RESULT_PATCH_APPLIED, PASSED]
    assert run.conversation(marker)[0]["content"] == ProtocolConfig.resolve("reactive", test_cost=3).system_prompt()
    assert (rec["test_cost"], rec["budget"], rec["calls_used"], rec["n_test_calls"], rec["reward"]) == (
        3,
        10,
        8,
        6,
        1.0,
    )
    assert [s["cost"] for s in rec["steps"]] == [1, 3, 1, 3, 0]


def test_expensive_tests_refusal(run: CaseRun) -> None:
    marker = "[case:x_refused]"
    rec = run.records[marker]
    assert run.results(marker) == [READ_STUB] * 8 + [error_result(ERRORS["test_unaffordable"].format(cost=3, left=2))]
    assert (rec["stop_reason"], rec["calls_used"], rec["n_tests_refused"], rec["n_test_calls"]) == ("final", 9, 1, 1)


def test_expensive_tests_predictive_arm_saves_calls(run: CaseRun) -> None:
    rec = run.records["[case:x_predictive]"]
    assert (rec["test_cost"], rec["budget"], rec["calls_used"], rec["reward"], rec["n_tests"]) == (3, 10, 2, 1.0, 0)
    system = run.conversation("[case:x_predictive]")[0]["content"]
    assert system == ProtocolConfig.resolve("predictive", test_cost=3).system_prompt() and "It costs 3" in system
    # the same task solved by Arm A above used 8 calls
    assert run.records["[case:x_reactive]"]["calls_used"] - rec["calls_used"] == 6


def test_edit_on_revise_replacement_applied_and_predicted(run: CaseRun) -> None:
    marker = "[case:edit]"
    rec = run.records[marker]
    assert run.results(marker) == [RESULT_PATCH_APPLIED, applied(1), RESULT_PATCH_KEPT, PASSED]
    assert run.conversation(marker)[0]["content"] == ProtocolConfig("predictive", "edit_on_revise").system_prompt()
    revised, edit = patch_steps(rec["steps"])
    assert (revised["outcome"], revised["outcome_seen"], revised["reverted"], revised["prediction"]) == (
        "ASSERTION_FAILURE",
        False,
        True,
        "ASSERTION_FAILURE",
    )
    assert (edit["action"], edit["edited_from"], edit["revision_depth"], edit["prediction"], edit["decision"]) == (
        "prediction",
        0,
        1,
        "PASS",
        "KEEP",
    )
    assert (edit["outcome"], edit["outcome_seen"], edit["cost"]) == ("PASS", True, 0)
    assert (rec["variant"], rec["calls_used"], rec["reward"], rec["ever_edited"], rec["n_edit_revisions"]) == (
        "edit_on_revise",
        2,
        1.0,
        True,
        1,
    )
    assert (rec["n_patches"], rec["n_revised"], rec["max_chained_revisions"]) == (2, 1, 2)


def test_edit_on_revise_chain_stops_at_the_cap(run: CaseRun) -> None:
    marker = "[case:edit_chain]"
    rec = run.records[marker]
    cap = "status: error\npatch reverted\n" + ERRORS["revision_cap"].format(cap=2)
    assert run.results(marker) == [RESULT_PATCH_APPLIED, applied(1), applied(2), cap, READ_STUB]
    patches = patch_steps(rec["steps"])
    assert [(p["revision_depth"], p["outcome"], p["outcome_seen"], p["reverted"]) for p in patches] == [
        (0, "ASSERTION_FAILURE", False, True),
        (1, "ASSERTION_FAILURE", False, True),
        (2, "ASSERTION_FAILURE", False, True),
    ]
    assert rec["steps"][3]["edit_error"] == "revision_cap"
    assert (rec["max_revision_depth"], rec["n_edit_errors"], rec["final_solution"], rec["reward"]) == (2, 1, STUB, 0.0)


def test_edit_on_revise_missing_replacement(run: CaseRun) -> None:
    marker = "[case:edit_missing]"
    rec = run.records[marker]
    missing = "status: error\npatch reverted\n" + ERRORS["replacement_missing"].format()
    assert run.results(marker) == [RESULT_PATCH_APPLIED, missing, READ_STUB]
    assert (rec["steps"][1]["edit_error"], rec["n_edit_errors"], rec["ever_edited"], rec["calls_used"]) == (
        "replacement_missing",
        1,
        False,
        2,
    )


def test_edit_on_revise_train_client_keeps_one_step_per_sampled_call(run: CaseRun, tmp_path: Path) -> None:
    """RL aligns sampled calls with steps one to one: a replacement patch adds no step."""
    (rec,) = read_records(write_records([run.records["[case:edit_train]"]], tmp_path / "r.parquet"))
    sampled = [n for n in rec["tokens"] if n["sampled"]]
    assert len(sampled) == rec["n_model_calls"] == len(rec["steps"]) == 5
    assert [s["action"] for s in rec["steps"]] == ["apply_patch", "prediction", "prediction", "python_test", "final"]
    assert (rec["reward"], rec["n_edit_revisions"], rec["steps"][2]["patch_step"]) == (1.0, 1, 1)

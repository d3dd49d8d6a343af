"""The environment variants of issue 28 (irreversible, blind) through the real verifiers v1 stack (make_agent +
SubprocessConfig + LocalAgentHarness + the agent program + the sandbox) against a scripted endpoint, as in
test_env_extension_rollouts.py: what the model is sent, when the program stops asking, and what the task's own
check grades (irreversible: the state the final python_test ran on; blind: the final state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from predict.env.protocol import RESULT_PATCH_APPLIED, RESULT_PATCH_KEPT, RESULT_PATCH_REVERTED, ProtocolConfig
from predict.env.records import patch_steps
from predict.vocabulary import OUTCOMES
from tests.test_env_rollouts import (
    ADD,
    AF_REVISE,
    FINAL,
    MUL_FROM_ADD,
    MUL_FROM_STUB,
    PASS_KEEP,
    READ,
    TEST,
    CaseRun,
    scripted_case_rollouts,
)

UNAVAILABLE = (
    "status: error\nthere is no python_test tool here: the tests run only when the episode ends, and their result is "
    "never shown. Available tools: read_file, apply_patch."
)

CASES: dict[str, tuple[str, list[str]]] = {
    # the first test runs on the failing x + y: the episode ends there, graded on that state, never asked again
    "[case:irr_reactive]": ("irreversible_reactive", [ADD, TEST, MUL_FROM_ADD, TEST, FINAL]),
    "[case:irr_predictive]": ("irreversible_predictive", [ADD, AF_REVISE, MUL_FROM_STUB, PASS_KEEP, TEST, FINAL]),
    # no test tool: the call is an invalid action; graded at FINAL
    "[case:blind_reactive]": ("blind_reactive", [ADD, TEST, MUL_FROM_ADD, FINAL]),
    "[case:blind_predictive]": ("blind_predictive", [ADD, AF_REVISE, READ, MUL_FROM_STUB, PASS_KEEP, TEST, FINAL]),
}
SETTINGS: dict[str, dict[str, Any]] = {
    "irreversible_reactive": {"protocol": "reactive", "variant": "irreversible", "arm": "irreversible_A"},
    "irreversible_predictive": {"protocol": "predictive", "variant": "irreversible", "arm": "irreversible_B"},
    "blind_reactive": {"protocol": "reactive", "variant": "blind", "arm": "blind_A"},
    "blind_predictive": {"protocol": "predictive", "variant": "blind", "arm": "blind_B"},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, mbpp_path: Path) -> CaseRun:
    return scripted_case_rollouts(CASES, SETTINGS, mbpp_path, tmp_path_factory.mktemp("verifiers-home"),
                                  first_task_id=9200)


def test_every_rollout_completed_ok_and_graded(run: CaseRun) -> None:
    assert set(run.records) == set(CASES)
    for marker, rec in run.records.items():
        assert rec["ok"] and rec["error"] is None and rec["reward"] is not None, (marker, rec["error"])
        variant = SETTINGS[CASES[marker][0]]["variant"]
        protocol = SETTINGS[CASES[marker][0]]["protocol"]
        assert rec["variant"] == variant and rec["protocol"] == protocol
        assert run.conversation(marker)[0]["content"] == ProtocolConfig(protocol, variant).system_prompt()


def test_irreversible_reactive_is_graded_on_the_state_its_one_test_ran_on(run: CaseRun) -> None:
    marker = "[case:irr_reactive]"
    rec = run.records[marker]
    # two model calls (the patch, the test), no third: the test ended the episode and its result was never sent
    assert len(run.requests(marker)) == 2 and run.results(marker) == [RESULT_PATCH_APPLIED]
    assert (rec["stop_reason"], rec["n_tests"], rec["calls_used"], rec["n_model_calls"]) == ("final_test", 1, 2, 2)
    assert (rec["final_outcome"], rec["final_pass"], rec["reward"]) == ("ASSERTION_FAILURE", False, 0.0)
    (p,) = patch_steps(rec["steps"])
    test = rec["steps"][1]
    assert (test["outcome"], test["outcome_seen"], test["result_sent"]) == ("ASSERTION_FAILURE", False, False)
    assert rec["final_solution"] == p["patched_code"] and "x + y" in rec["final_solution"]


def test_irreversible_predictive_revises_then_its_test_is_final(run: CaseRun) -> None:
    marker = "[case:irr_predictive]"
    rec = run.records[marker]
    assert run.results(marker) == [RESULT_PATCH_APPLIED, RESULT_PATCH_REVERTED, RESULT_PATCH_APPLIED, RESULT_PATCH_KEPT]
    assert len(run.requests(marker)) == 5  # FINAL is never asked for
    assert (rec["stop_reason"], rec["reward"], rec["final_outcome"], rec["n_revised"]) == ("final_test", 1.0, "PASS", 1)
    revised, kept = patch_steps(rec["steps"])
    assert (revised["outcome"], revised["outcome_seen"], revised["prediction"]) == (
        "ASSERTION_FAILURE", False, "ASSERTION_FAILURE")
    assert (kept["outcome"], kept["outcome_seen"], kept["decision"]) == ("PASS", False, "KEEP")


def test_blind_reactive_tests_nothing_and_is_graded_at_final(run: CaseRun) -> None:
    marker = "[case:blind_reactive]"
    rec = run.records[marker]
    assert run.results(marker) == [RESULT_PATCH_APPLIED, UNAVAILABLE, RESULT_PATCH_APPLIED]
    assert (rec["stop_reason"], rec["n_tests"], rec["calls_used"], rec["reward"]) == ("final", 0, 3, 1.0)
    assert [(p["outcome"], p["outcome_seen"]) for p in patch_steps(rec["steps"])] == [
        ("ASSERTION_FAILURE", False), ("PASS", False)]
    assert (rec["steps"][1]["tool"], rec["steps"][1]["error"]) == ("python_test", "test_unavailable")


def test_blind_predictive_never_sees_an_outcome(run: CaseRun) -> None:
    marker = "[case:blind_predictive]"
    rec = run.records[marker]
    results = run.results(marker)
    assert results[:2] == [RESULT_PATCH_APPLIED, RESULT_PATCH_REVERTED] and results[-1] == UNAVAILABLE
    for request in run.requests(marker):
        for message in request["messages"][1:]:
            if message["role"] == "user":  # the task prompt and every tool result the model got
                assert not any(cls in message["content"] for cls in OUTCOMES), message["content"]
    assert (rec["stop_reason"], rec["reward"], rec["n_tests"], rec["ever_revised"]) == ("final", 1.0, 0, True)
    assert [(p["outcome"], p["prediction"]) for p in patch_steps(rec["steps"])] == [
        ("ASSERTION_FAILURE", "ASSERTION_FAILURE"), ("PASS", "PASS")]

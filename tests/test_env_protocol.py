"""Unit tests of the rollout protocol: parsing and the episode state machine, with an injected run_tests."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from predict.env.protocol import (
    ERRORS,
    MALFORMED,
    RESULT_PATCH_APPLIED,
    RESULT_PATCH_KEPT,
    RESULT_PATCH_REVERTED,
    RESULT_TESTS_PASSED,
    STUB,
    Episode,
    ProtocolConfig,
    parse_action,
    parse_args,
    parse_prediction,
    resolve_path,
    task_prompt,
)
from predict.vocabulary import OUTCOMES, Outcome

STUB_LINE = "# Write your function here."
ADD = json.dumps({"find": STUB_LINE, "replace": "def multiply_int(x, y):\n    return x + y"})
TEST = 'CALL python_test {"project_path": "solution.py"}'
READ = 'CALL read_file {"file_path": "solution.py"}'


def patch(find: str, replace: str) -> str:
    return "CALL apply_patch " + json.dumps({"find": find, "replace": replace})


def predict(cls: str, decision: str) -> str:
    return f"<PREDICTION>{cls}</PREDICTION> <DECISION>{decision}</DECISION>"


class FakeTests:
    """Deterministic stand-in for the sandbox: the class follows from the code; calls are counted."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, code: str) -> Outcome:
        self.calls[code] += 1
        if "return x * y" in code:
            return Outcome.PASS
        if "(" in code and ":" not in code:
            return Outcome.SYNTAX_ERROR
        if "def multiply_int" in code:
            return Outcome.ASSERTION_FAILURE
        return Outcome.RUNTIME_ERROR  # the stub: NameError


def episode(protocol: str = "reactive", variant: str = "none", **kw: object) -> tuple[Episode, FakeTests]:
    tests = FakeTests()
    budget_neutral_budget = kw.pop("budget_neutral_budget", None)
    config = ProtocolConfig.resolve(protocol, variant, budget_neutral_budget=budget_neutral_budget, **kw)  # type: ignore[arg-type]
    return Episode(config, tests), tests


def run(ep: Episode, replies: list[str]) -> list[str | None]:
    return [ep.step(r) for r in replies]


# -------------------------------------------------------------------------------------------------- parsing
def test_task_prompt_is_text_plus_asserts() -> None:
    tests = ["assert multiply_int(10,20)==200", "assert multiply_int(5,10)==50", "assert multiply_int(4,8)==32"]
    assert task_prompt("Write a function to multiply two integers.", tests) == (
        "Write a function to multiply two integers.\nYour code should pass these tests:\n\n"
        "assert multiply_int(10,20)==200\nassert multiply_int(5,10)==50\nassert multiply_int(4,8)==32"
    )


def test_parse_action_takes_first_action_line_around_free_text() -> None:
    reply = f"Let me look first.\n{READ}\nFINAL: no"
    a = parse_action(reply)
    assert (a.kind, a.tool, json.loads(a.args_text or "")) == ("call", "read_file", {"file_path": "solution.py"})
    assert parse_action("thinking...\nFINAL: all good ").summary == "all good"
    assert parse_action("no action here").kind == "none"


def test_parse_action_ignores_actions_inside_closed_think_blocks() -> None:
    reply = f"<think>maybe\nCALL read_file {{}}\n</think>\n{TEST}"
    assert parse_action(reply).tool == "python_test"


def test_parse_args_object_on_one_line() -> None:
    assert parse_args('{"find": "a", "replace": "b"} trailing words') == {"find": "a", "replace": "b"}
    for bad in ("", '{"find": "a", ', "[1, 2]", "find=a"):
        with pytest.raises(ValueError):
            parse_args(bad)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (predict("PASS", "KEEP"), ("PASS", "KEEP", True)),
        ("I expect it works. " + predict("runtime_error", "revise"), ("RUNTIME_ERROR", "REVISE", True)),
        ("<PREDICTION>PASS</PREDICTION>", (MALFORMED, None, False)),
        (predict("FAIL", "KEEP"), (MALFORMED, "KEEP", False)),
        (predict("PASS", "MAYBE"), (MALFORMED, None, False)),
        ("it will pass, keep it", (MALFORMED, None, False)),
    ],
)
def test_parse_prediction(reply: str, expected: tuple[str, str | None, bool]) -> None:
    p = parse_prediction(reply)
    assert (p.prediction, p.decision, p.valid) == expected


def test_resolve_path_stays_inside_workdir() -> None:
    assert resolve_path("solution.py") == "solution.py"
    assert resolve_path("./sub/../solution.py") == "solution.py"
    for outside in ("../solution.py", "/etc/passwd", "a/../../b", "~/x", "", None, 3):
        assert resolve_path(outside) is None


def test_config_validation_and_variants() -> None:
    with pytest.raises(ValueError):
        ProtocolConfig("reactive", "forced_keep")
    with pytest.raises(ValueError):
        ProtocolConfig("predictive", "nope")  # type: ignore[arg-type]
    free = ProtocolConfig.resolve("predictive", "budget_neutral")
    assert (free.budget, free.revise_costs_call, free.model_call_cap) == (8, False, 33)
    raised = ProtocolConfig.resolve("predictive", "budget_neutral", budget_neutral_budget=1000)
    assert (raised.budget, raised.revise_costs_call) == (1000, True)
    assert ProtocolConfig().model_call_cap == 17
    assert "<PREDICTION>" not in ProtocolConfig().system_prompt()
    assert (
        "<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>"
        in ProtocolConfig("predictive").system_prompt()
    )
    assert "budget of 8 tool calls" in ProtocolConfig().system_prompt()


# -------------------------------------------------------------------------------------------------- episodes
def test_reactive_episode_results_outcomes_and_reward_inputs() -> None:
    ep, tests = episode()
    results = run(ep, [READ, "CALL apply_patch " + ADD, TEST, patch("x + y", "x * y"), TEST, "FINAL: done"])
    assert results == [
        "status: success\n" + STUB,
        RESULT_PATCH_APPLIED,
        "status: failed\ntests failed (actual: ASSERTION_FAILURE)",
        RESULT_PATCH_APPLIED,
        RESULT_TESTS_PASSED,
        None,
    ]
    assert ep.done and ep.stop_reason == "final" and ep.calls_used == 5
    patches = [s for s in ep.steps if s.action == "apply_patch"]
    assert [(s.outcome, s.outcome_seen, s.outcome_step) for s in patches] == [
        ("ASSERTION_FAILURE", True, 2),
        ("PASS", True, 4),
    ]
    assert ep.solution == "def multiply_int(x, y):\n    return x * y\n"
    s = ep.summary()
    assert (s["first_patch_outcome"], s["n_patches"], s["n_tests"], s["ever_revised"]) == (
        "ASSERTION_FAILURE",
        2,
        2,
        False,
    )
    assert sum(tests.calls.values()) == 2


def test_reactive_untested_patches_get_hidden_shadow_outcomes() -> None:
    ep, tests = episode()
    run(ep, ["CALL apply_patch " + ADD, READ, patch("x + y", "x * y"), "FINAL: done"])
    first, second = (s for s in ep.steps if s.action == "apply_patch")
    assert (first.outcome, first.outcome_seen) == ("ASSERTION_FAILURE", False)  # shadowed when patch 2 changed it
    assert (second.outcome, second.outcome_seen) == ("PASS", False)  # shadowed at the end
    assert all(s.result is None or "actual" not in s.result for s in ep.steps)


def test_read_and_failed_patch_do_not_break_test_in_view() -> None:
    ep, _ = episode()
    run(ep, ["CALL apply_patch " + ADD, READ, patch("nope", "x"), TEST, "FINAL: x"])
    first = ep.steps[0]
    assert (first.outcome, first.outcome_seen, first.outcome_step) == ("ASSERTION_FAILURE", True, 3)


def test_predictive_keep_then_test_in_view() -> None:
    ep, _ = episode("predictive")
    results = run(
        ep, [patch(STUB_LINE, "def multiply_int(x, y):\n    return x * y"), predict("PASS", "KEEP"), TEST, "FINAL: ok"]
    )
    assert results == [RESULT_PATCH_APPLIED, RESULT_PATCH_KEPT, RESULT_TESTS_PASSED, None]
    p, pred = ep.steps[0], ep.steps[1]
    assert (p.prediction, p.decision_sampled, p.decision, p.forced, p.reverted) == (
        "PASS",
        "KEEP",
        "KEEP",
        False,
        False,
    )
    assert (p.outcome, p.outcome_seen, p.prediction_step, pred.patch_step) == ("PASS", True, 1, 0)
    assert pred.action == "prediction" and not pred.counted and ep.calls_used == 2


def test_predictive_revise_reverts_shadows_and_reveals_nothing() -> None:
    ep, tests = episode("predictive")
    results = run(ep, ["CALL apply_patch " + ADD, predict("ASSERTION_FAILURE", "REVISE"), READ])
    assert results[1] == RESULT_PATCH_REVERTED
    assert not any(cls in results[1] for cls in OUTCOMES)
    assert results[2] == "status: success\n" + STUB  # reverted
    p = ep.steps[0]
    assert (p.outcome, p.outcome_seen, p.reverted, p.decision, p.forced) == (
        "ASSERTION_FAILURE",
        False,
        True,
        "REVISE",
        False,
    )
    assert ep.calls_used == 2  # the reverted patch stays spent
    assert tests.calls["def multiply_int(x, y):\n    return x + y\n"] == 1  # shadow ran on the patched code
    run(ep, [TEST])  # a test after the revert is of the stub, not of the reverted patch
    assert ep.steps[3].outcome == "RUNTIME_ERROR" and p.outcome_step is None


def test_non_pass_prediction_forces_revise() -> None:
    ep, _ = episode("predictive")
    run(ep, ["CALL apply_patch " + ADD, predict("RUNTIME_ERROR", "KEEP")])
    pred = ep.steps[1]
    assert (pred.prediction, pred.decision_sampled, pred.decision, pred.forced) == (
        "RUNTIME_ERROR",
        "KEEP",
        "REVISE",
        True,
    )
    assert pred.result == RESULT_PATCH_REVERTED and ep.solution == STUB and ep.summary()["n_forced"] == 1


def test_malformed_prediction_counts_as_non_pass_and_reverts() -> None:
    ep, _ = episode("predictive")
    results = run(ep, ["CALL apply_patch " + ADD, "I am confident it passes. KEEP"])
    assert results[1] == "status: error\n" + ERRORS["malformed_prediction"].format(fate="reverted")
    assert "<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>" in (results[1] or "")
    p = ep.steps[0]
    assert (p.prediction, p.decision_sampled, p.decision, p.forced, p.reverted) == (
        MALFORMED,
        None,
        "REVISE",
        True,
        True,
    )
    assert ep.steps[1].reply == "I am confident it passes. KEEP" and ep.steps[1].error == "malformed_prediction"
    assert ep.solution == STUB and ep.summary()["n_malformed_predictions"] == 1


def test_forced_keep_keeps_every_patch_but_records_the_prediction() -> None:
    ep, _ = episode("predictive", "forced_keep")
    results = run(
        ep, ["CALL apply_patch " + ADD, predict("ASSERTION_FAILURE", "REVISE"), patch("x + y", "x * y"), "garbage"]
    )
    assert results[1] == RESULT_PATCH_KEPT
    assert results[3] == "status: error\n" + ERRORS["malformed_prediction"].format(fate="kept")
    p1, p2 = ep.steps[0], ep.steps[2]
    assert (p1.prediction, p1.decision_sampled, p1.decision, p1.forced, p1.reverted) == (
        "ASSERTION_FAILURE",
        "REVISE",
        "KEEP",
        True,
        False,
    )
    assert (p2.prediction, p2.decision, p2.reverted) == (MALFORMED, "KEEP", False)
    assert ep.solution == "def multiply_int(x, y):\n    return x * y\n" and not ep.summary()["ever_revised"]


def test_budget_neutral_revise_is_free() -> None:
    ep, _ = episode("predictive", "budget_neutral")
    for _ in range(10):  # more patch+REVISE rounds than the budget
        run(ep, ["CALL apply_patch " + ADD, predict("ASSERTION_FAILURE", "REVISE")])
    assert ep.calls_used == 0 and not ep.done
    assert ep.summary()["n_revised"] == 10
    run(ep, [patch(STUB_LINE, "def multiply_int(x, y):\n    return x * y"), predict("PASS", "KEEP"), "FINAL: ok"])
    assert ep.calls_used == 1 and ep.stop_reason == "final"


def test_free_revise_loop_hits_the_model_call_cap() -> None:
    ep, _ = episode("predictive", "budget_neutral", budget=2)
    replies = ["CALL apply_patch " + ADD, predict("PASS", "REVISE")] * 10
    for r in replies:
        if ep.step(r) is None:
            break
    assert ep.stop_reason == "max_turns" and len(ep.steps) == ep.config.model_call_cap == 9


def test_budget_exhaustion_ends_without_sending_the_last_result() -> None:
    ep, _ = episode(budget=3)
    assert run(ep, [READ, READ]) == ["status: success\n" + STUB] * 2
    assert ep.step(READ) is None
    assert ep.done and ep.stop_reason == "budget" and ep.budget_exhausted
    assert ep.steps[-1].result == "status: success\n" + STUB and not ep.steps[-1].result_sent
    with pytest.raises(RuntimeError):
        ep.step(READ)


def test_a_budget_ending_test_is_not_seen() -> None:
    ep, _ = episode(budget=2)
    assert ep.step("CALL apply_patch " + ADD) == RESULT_PATCH_APPLIED
    assert ep.step(TEST) is None  # the last call: run, but never shown
    patch_step, test_step = ep.steps
    assert (test_step.outcome, test_step.outcome_seen, test_step.result_sent) == ("ASSERTION_FAILURE", False, False)
    assert (patch_step.outcome, patch_step.outcome_seen, patch_step.outcome_step) == ("ASSERTION_FAILURE", False, None)


def test_budget_exhaustion_on_a_patch_still_takes_its_prediction() -> None:
    ep, tests = episode("predictive", budget=2)
    assert run(ep, [READ, "CALL apply_patch " + ADD]) == ["status: success\n" + STUB, RESULT_PATCH_APPLIED]
    assert not ep.done and ep.awaiting_prediction
    assert ep.step(predict("PASS", "KEEP")) is None
    assert ep.stop_reason == "budget" and ep.budget_exhausted
    p = ep.steps[1]
    assert (p.prediction, p.decision, p.outcome, p.outcome_seen) == ("PASS", "KEEP", "ASSERTION_FAILURE", False)


def test_budget_neutral_refund_on_the_last_call_continues() -> None:
    ep, _ = episode("predictive", "budget_neutral", budget=1)
    assert ep.step("CALL apply_patch " + ADD) == RESULT_PATCH_APPLIED
    assert ep.step(predict("ASSERTION_FAILURE", "REVISE")) == RESULT_PATCH_REVERTED
    assert not ep.done and ep.calls_used == 0


@pytest.mark.parametrize(
    ("reply", "kind", "needle"),
    [
        (patch("def nothing():", "x"), "find_not_found", "was not found"),
        (patch("e", "x"), "find_ambiguous", "occurs 3 times"),
        (patch("", "x"), "find_empty", "empty"),
        ('CALL apply_patch {"find": "# Write", "replace": ', "malformed_json", "malformed JSON"),
        ("CALL apply_patch", "malformed_json", "no JSON arguments"),
        ('CALL apply_patch {"find": "# Write"}', "missing_args", "find, replace"),
        ('CALL python_test {"path": "solution.py"}', "missing_args", "project_path"),
        ('CALL run_shell {"cmd": "ls"}', "unknown_tool", "unknown tool 'run_shell'"),
        ("I will now write the function.", "no_action", "no action line"),
        ('CALL read_file {"file_path": "../../etc/passwd"}', "path_outside_workdir", "outside the workdir"),
        ('CALL python_test {"project_path": "/tmp/solution.py"}', "path_outside_workdir", "outside the workdir"),
        ('CALL read_file {"file_path": "tests.py"}', "no_such_file", "no such file"),
        (
            'CALL apply_patch {"find": "# Write", "replace": "x", "file_path": "../x.py"}',
            "path_outside_workdir",
            "outside",
        ),
    ],
)
def test_malformed_actions_get_an_error_and_cost_a_call(reply: str, kind: str, needle: str) -> None:
    ep, tests = episode("predictive")
    result = ep.step(reply)
    assert result is not None and result.startswith("status: error\n") and needle in result
    step = ep.steps[0]
    assert (step.status, step.error, step.counted, ep.calls_used, step.applied) == ("error", kind, True, 1, False)
    assert ep.solution == STUB and not ep.awaiting_prediction and not tests.calls


def test_error_replies_exhaust_the_budget() -> None:
    ep, _ = episode()
    results = run(ep, ["hmm"] * 8)
    assert results[-1] is None and ep.stop_reason == "budget" and ep.summary()["n_errors"] == 8


def test_cut_off_prediction_leaves_the_patch_and_null_prediction() -> None:
    ep, _ = episode("predictive")
    ep.step("CALL apply_patch " + ADD)
    ep.finish("error", error="endpoint gone")
    p = ep.steps[0]
    assert (p.prediction, p.decision, p.reverted, p.outcome, p.outcome_seen) == (
        None,
        None,
        False,
        "ASSERTION_FAILURE",
        False,
    )
    assert ep.summary()["error"] == "endpoint gone" and ep.stop_reason == "error"


def test_outcomes_are_memoised_per_solution_text() -> None:
    ep, tests = episode()
    run(ep, ["CALL apply_patch " + ADD, TEST, TEST, "FINAL: x"])
    assert list(tests.calls.values()) == [1]


def test_run_tests_may_return_a_verdict_with_detail() -> None:
    class V:
        outcome, detail = Outcome.RUNTIME_ERROR, "NameError: name 'multiply_int' is not defined"

    ep = Episode(ProtocolConfig(), lambda code: V())
    assert ep.step(TEST) == "status: failed\ntests failed (actual: RUNTIME_ERROR)"
    assert ep.steps[0].outcome_detail == V.detail

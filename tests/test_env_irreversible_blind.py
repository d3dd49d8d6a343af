"""The environment variants of issue 28 on scripted replies through `Episode`, both protocols: irreversible (the first
python_test that runs is final) and blind (no test tool). Every rule in protocol.py's docstring for them has a test
here, and the study's settings (variant none) are pinned byte for byte against the protocol before issue 28."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from predict.env.protocol import (
    ERRORS,
    MALFORMED,
    RESULT_PATCH_APPLIED,
    RESULT_PATCH_KEPT,
    RESULT_PATCH_REVERTED,
    STOP_REASONS,
    STUB,
    Episode,
    ProtocolConfig,
    error_result,
)
from predict.env.records import build_record, patch_steps, read_records, write_records
from predict.vocabulary import ENVIRONMENT_VARIANTS, OUTCOMES, PREDICTIVE_VARIANTS, VARIANTS, Outcome
from tests.test_env_protocol import ADD, READ, STUB_LINE, TEST, FakeTests, patch, predict

ADD_PATCH = "CALL apply_patch " + ADD
BAD = "def multiply_int(x, y):\n    return x + y"  # FakeTests: ASSERTION_FAILURE
GOOD = "def multiply_int(x, y):\n    return x * y"  # PASS
PROTOCOLS = ("reactive", "predictive")
UNAVAILABLE = error_result(
    "there is no python_test tool here: the tests run only when the episode ends, and their result is never shown. "
    "Available tools: read_file, apply_patch."
)


def episode(protocol: str, variant: str, **kw: Any) -> tuple[Episode, FakeTests]:
    tests = FakeTests()
    return Episode(ProtocolConfig.resolve(protocol, variant, **kw), tests), tests


def run(ep: Episode, replies: list[str]) -> list[str | None]:
    """Step the replies until the episode ends (replies after that are never asked for)."""
    return [ep.step(r) for r in replies if not ep.done]


def sol(code: str) -> str:
    return code + "\n"


def keep(protocol: str) -> list[str]:
    return [predict("PASS", "KEEP")] if protocol == "predictive" else []


# ============================================================================================ the study, unchanged
STUDY_PROMPT = ProtocolConfig().system_prompt()
TEST_LINE = (
    'CALL python_test {"project_path": "solution.py"}\n  runs the task\'s tests on solution.py and reports the outcome '
    "class: PASS, ASSERTION_FAILURE, RUNTIME_ERROR, SYNTAX_ERROR, TIMEOUT or OTHER.\n"
)


def _script() -> list[str]:
    """Replies reaching every result string of the study's protocol (errors, tests, predictions, FINAL)."""
    call = "CALL {} {}".format
    return [
        "no action", 'CALL run_shell {"cmd": "ls"}', 'CALL apply_patch {"find": "x", ',
        'CALL apply_patch {"find": "x"}',
        call("read_file", json.dumps({"file_path": "../x"})), call("read_file", json.dumps({"file_path": "t.py"})),
        patch("", "y"), patch("nope", "y"), TEST, patch(STUB_LINE, BAD), predict("ASSERTION_FAILURE", "REVISE"),
        patch(STUB_LINE, BAD), "garbage", TEST, patch("x + y", "x * y"), predict("PASS", "KEEP"), READ, TEST,
        "FINAL: done",
    ]


def study_fingerprint() -> str:
    """Every study-setting config (both protocols, the predictive variants, test_cost 1 and 3, two budgets): its
    config, system prompt, and the results, steps and summary of `_script`; sha256 of it all."""
    out = []
    for protocol in PROTOCOLS:
        for variant in ("none",) if protocol == "reactive" else ("none", *PREDICTIVE_VARIANTS):
            for test_cost in (1, 3):
                for budget in (8, 30):
                    config = ProtocolConfig.resolve(protocol, variant, budget=budget, test_cost=test_cost)
                    ep = Episode(config, FakeTests())
                    results = [ep.step(r) for r in _script() if not ep.done]
                    ep.finish("final")
                    steps = [s.to_dict() for s in ep.steps]
                    out.append([config.to_dict(), config.system_prompt(), results, steps, ep.summary()])
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def test_the_study_settings_are_byte_identical_to_the_protocol_before_issue_28() -> None:
    """The golden is `study_fingerprint()` computed at 9882a9f (before the environment variants): prompts, results,
    step records and summaries of every study setting are unchanged."""
    assert study_fingerprint() == "9fb97143e8b37d49268e5f5f099e7fcd2e71b8d9960e83486e4b4e3b20e3d0c3"
    assert TEST_LINE in STUDY_PROMPT


def test_variant_names_and_which_protocols_they_need() -> None:
    assert ENVIRONMENT_VARIANTS == ("irreversible", "blind")
    assert VARIANTS == ("none", "forced_keep", "budget_neutral", "edit_on_revise", "irreversible", "blind")
    assert "final_test" in STOP_REASONS
    for variant in ENVIRONMENT_VARIANTS:
        for protocol in PROTOCOLS:
            config = ProtocolConfig.resolve(protocol, variant)
            assert (config.variant, config.budget, config.revise_costs_call) == (variant, 8, True)
            assert config.model_call_cap == ProtocolConfig(protocol).model_call_cap  # 17 / 17: never binds
    for variant in PREDICTIVE_VARIANTS:
        with pytest.raises(ValueError, match="needs the predictive protocol"):
            ProtocolConfig("reactive", variant)  # type: ignore[arg-type]
    assert ProtocolConfig("reactive", "blind").tools == ("read_file", "apply_patch")
    assert ProtocolConfig("predictive", "irreversible").tools == ProtocolConfig().tools


# ============================================================================================ irreversible
IRREVERSIBLE_LINE = (
    'CALL python_test {"project_path": "solution.py"}\n  runs the task\'s tests on solution.py and ends the episode: '
    "solution.py as tested is graded, and you get no result. Only one test can run, so test only when solution.py "
    "is done.\n"
)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_irreversible_system_prompt_states_the_rule_exactly(protocol: str) -> None:
    study = ProtocolConfig(protocol).system_prompt()  # type: ignore[arg-type]
    prompt = ProtocolConfig.resolve(protocol, "irreversible").system_prompt()
    assert IRREVERSIBLE_LINE in prompt and prompt == study.replace(TEST_LINE, IRREVERSIBLE_LINE)
    note = (
        "\n  It costs 3 tool calls of the budget (every other tool call costs one). With fewer than 3 calls left it "
        "is refused with status: error, and that reply uses one call.\n"
    )
    expensive = ProtocolConfig.resolve(protocol, "irreversible", test_cost=3).system_prompt()
    assert IRREVERSIBLE_LINE.replace("done.\n", "done." + note) in expensive and "budget of 10 tool calls" in expensive


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_irreversible_the_first_test_that_runs_ends_the_episode_unseen(protocol: str) -> None:
    ep, tests = episode(protocol, "irreversible")
    results = run(ep, [READ, patch(STUB_LINE, BAD), *keep(protocol), TEST])
    assert results[-1] is None and ep.done and ep.stop_reason == "final_test"
    p, t = next(s for s in ep.steps if s.action == "apply_patch"), ep.steps[-1]
    # the test ran (its outcome is recorded) but never reached the model: test and patch are unseen
    assert (t.action, t.cost, t.outcome, t.outcome_seen, t.result_sent) == (
        "python_test", 1, "ASSERTION_FAILURE", False, False)
    assert (p.outcome, p.outcome_seen, p.outcome_step) == ("ASSERTION_FAILURE", False, None)
    assert ep.solution == sol(BAD) == p.patched_code  # graded on exactly the state it tested
    assert tests.calls == {sol(BAD): 1}
    s = ep.summary()
    assert (s["stop_reason"], s["n_tests"], s["n_test_calls"], s["final_solution"], s["calls_used"]) == (
        "final_test", 1, 1, sol(BAD), 3)
    with pytest.raises(RuntimeError, match="already ended"):
        ep.step(patch("x + y", "x * y"))  # nothing after the test can change the graded state


def test_irreversible_ends_even_on_a_test_of_the_stub() -> None:
    ep, _ = episode("reactive", "irreversible")
    assert ep.step(TEST) is None
    assert (ep.stop_reason, ep.solution, ep.steps[0].outcome) == ("final_test", STUB, "RUNTIME_ERROR")


def test_irreversible_arm_b_revise_is_the_last_chance_before_the_test() -> None:
    ep, tests = episode("predictive", "irreversible")
    results = run(
        ep,
        [ADD_PATCH, predict("ASSERTION_FAILURE", "REVISE"), patch(STUB_LINE, GOOD), predict("PASS", "KEEP"), TEST],
    )
    assert results == [RESULT_PATCH_APPLIED, RESULT_PATCH_REVERTED, RESULT_PATCH_APPLIED, RESULT_PATCH_KEPT, None]
    revised, kept = ep.steps[0], ep.steps[2]
    assert (revised.outcome, revised.outcome_seen, revised.reverted) == ("ASSERTION_FAILURE", False, True)  # shadow
    assert (kept.outcome, kept.outcome_seen, kept.decision) == ("PASS", False, "KEEP")  # the final test's, unseen
    assert (ep.stop_reason, ep.solution, ep.calls_used) == ("final_test", sol(GOOD), 3)
    assert tests.calls == {sol(BAD): 1, sol(GOOD): 1}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_irreversible_without_a_test_ends_at_final_or_the_budget_as_in_the_study(protocol: str) -> None:
    ep, tests = episode(protocol, "irreversible")
    run(ep, [patch(STUB_LINE, BAD), *keep(protocol), "FINAL: done"])
    assert (ep.stop_reason, ep.steps[0].outcome, ep.steps[0].outcome_seen) == ("final", "ASSERTION_FAILURE", False)
    ep, _ = episode(protocol, "irreversible", budget=2)
    assert run(ep, [READ, patch(STUB_LINE, GOOD), *keep(protocol)])[-1] is None
    assert (ep.stop_reason, ep.steps[1].outcome, ep.steps[1].outcome_seen) == ("budget", "PASS", False)


def test_irreversible_tests_that_do_not_run_end_nothing() -> None:
    ep, tests = episode("reactive", "irreversible", test_cost=3)  # budget 10
    result = ep.step('CALL python_test {"project_path": "../x.py"}')  # a bad path: an invalid action
    assert result is not None and "outside the workdir" in result and not ep.done
    run(ep, [READ] * 7)  # 8 used, 2 left: a test costs 3
    assert ep.step(TEST) == error_result(ERRORS["test_unaffordable"].format(cost=3, left=2))
    assert not ep.done and not tests.calls and ep.steps[-1].error == "test_unaffordable"
    assert ep.step("FINAL: out of calls") is None and ep.stop_reason == "final"


def test_irreversible_with_expensive_tests_spends_k_and_ends_on_the_last_calls() -> None:
    ep, _ = episode("predictive", "irreversible", test_cost=3)
    run(ep, [READ, patch(STUB_LINE, GOOD), predict("PASS", "KEEP"), TEST])
    assert (ep.config.budget, ep.calls_used, ep.steps[-1].cost, ep.stop_reason) == (10, 5, 3, "final_test")
    ep, _ = episode("reactive", "irreversible", test_cost=3)
    run(ep, [READ] * 6 + [ADD_PATCH])  # 7 used: the test takes exactly the last 3
    assert ep.step(TEST) is None and (ep.stop_reason, ep.calls_used) == ("final_test", 10)


def test_irreversible_keeps_the_test_memo_and_the_malformed_prediction_rules() -> None:
    ep, _ = episode("predictive", "irreversible")
    results = run(ep, [ADD_PATCH, "garbage", READ])
    assert results[1] == "status: error\n" + ERRORS["malformed_prediction"].format(fate="reverted")
    assert ep.steps[0].prediction == MALFORMED and results[2] == "status: success\n" + STUB


# ============================================================================================ blind
BLIND_RULE = (
    "\nNo tool runs the tests: they run only when the episode ends and solution.py is graded, and you never see "
    "their result.\n"
)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_blind_system_prompt_offers_no_test_tool_and_states_the_rule(protocol: str) -> None:
    study = ProtocolConfig(protocol).system_prompt()  # type: ignore[arg-type]
    prompt = ProtocolConfig.resolve(protocol, "blind").system_prompt()
    assert "python_test" not in prompt and BLIND_RULE in prompt
    graded = "ends the episode; solution.py as it is then is graded.\n"
    assert prompt == study.replace(TEST_LINE, "").replace(graded, graded + BLIND_RULE)
    # test_cost: the budget is the scaled one, and there is no test whose cost a note could state
    expensive = ProtocolConfig.resolve(protocol, "blind", test_cost=3).system_prompt()
    assert expensive == prompt.replace("budget of 8", "budget of 10")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_blind_a_python_test_call_is_an_invalid_action_that_runs_nothing(protocol: str) -> None:
    ep, tests = episode(protocol, "blind")
    assert ep.step(TEST) == UNAVAILABLE
    step = ep.steps[0]
    assert (step.action, step.tool, step.status, step.error, step.cost, step.outcome) == (
        "invalid", "python_test", "error", "test_unavailable", 1, None)
    assert not tests.calls and ep.calls_used == 1 and not ep.done
    assert ep.summary()["n_tests"] == 0 and ep.summary()["n_errors"] == 1
    # the other error messages name only the tools there are
    assert ep.step("no action here") == error_result(
        'no action line found. Reply with exactly one action line: CALL <tool> {"arg": "value"} (tools: read_file, '
        "apply_patch) or FINAL: <summary>."
    )
    assert ep.step('CALL run_shell {"cmd": "ls"}') == error_result(
        "unknown tool 'run_shell'. Available tools: read_file, apply_patch."
    )
    ep, _ = episode(protocol, "blind", test_cost=3)
    assert ep.step(TEST) == UNAVAILABLE and ep.calls_used == 1  # one call, not test_cost


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_blind_every_patch_gets_a_hidden_shadow_and_the_final_state_is_graded(protocol: str) -> None:
    ep, tests = episode(protocol, "blind")
    replies = [READ, patch(STUB_LINE, BAD), *keep(protocol), TEST, patch("x + y", "x * y"), *keep(protocol), "FINAL: x"]
    run(ep, replies)
    patches = patch_steps([s.to_dict() for s in ep.steps])
    assert [(p["outcome"], p["outcome_seen"], p["outcome_step"]) for p in patches] == [
        ("ASSERTION_FAILURE", False, None), ("PASS", False, None)]
    assert (ep.stop_reason, ep.solution, ep.calls_used) == ("final", sol(GOOD), 4)
    assert tests.calls == {sol(BAD): 1, sol(GOOD): 1}  # shadows only: the python_test call ran nothing
    s = ep.summary()
    assert (s["n_tests"], s["n_test_calls"], s["first_patch_outcome"], s["final_solution"]) == (
        0, 0, "ASSERTION_FAILURE", sol(GOOD))


def test_blind_arm_b_predicts_and_revises_on_shadow_labels() -> None:
    ep, tests = episode("predictive", "blind")
    results = run(
        ep, [ADD_PATCH, predict("ASSERTION_FAILURE", "REVISE"), patch(STUB_LINE, GOOD), predict("PASS", "KEEP")]
    )
    assert results == [RESULT_PATCH_APPLIED, RESULT_PATCH_REVERTED, RESULT_PATCH_APPLIED, RESULT_PATCH_KEPT]
    revised, kept = ep.steps[0], ep.steps[2]
    assert (revised.prediction, revised.decision, revised.reverted, revised.outcome) == (
        "ASSERTION_FAILURE", "REVISE", True, "ASSERTION_FAILURE")
    assert (kept.prediction, kept.outcome, kept.outcome_seen) == ("PASS", None, None)  # untested until the end
    assert ep.step("FINAL: done") is None
    assert (kept.outcome, kept.outcome_seen, ep.stop_reason) == ("PASS", False, "final")
    ep, _ = episode("predictive", "blind", budget=1)  # the budget-ending patch still gets its prediction
    assert ep.step(ADD_PATCH) == RESULT_PATCH_APPLIED and ep.step(predict("PASS", "KEEP")) is None
    assert (ep.stop_reason, ep.steps[0].decision, ep.steps[0].outcome) == ("budget", "KEEP", "ASSERTION_FAILURE")


class ScriptedTests:
    """run_tests with a fixed outcome for every code and a detail text that names it."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def __call__(self, code: str) -> Any:
        class Verdict:
            outcome, detail = self.outcome, f"Traceback: the hidden test output of {self.outcome.value}"

        return Verdict()


def observations(protocol: str, variant: str, outcome: Outcome) -> list[str]:
    """Every message the model sees (system prompt, then each result that was sent) over a script that patches,
    predicts, tries python_test, errs and ends, with every test giving `outcome`."""
    ep = Episode(ProtocolConfig.resolve(protocol, variant), ScriptedTests(outcome))
    b = protocol == "predictive"
    replies = [READ, patch(STUB_LINE, BAD), *([predict("RUNTIME_ERROR", "REVISE"), patch(STUB_LINE, BAD)] * b),
               *keep(protocol), TEST, READ, patch("x + y", "x - y"), *(["garbage"] * b), "CALL python_test {}",
               "FINAL: done"]
    seen = [ep.config.system_prompt()]
    for reply in replies:
        if ep.done:
            break
        if (answer := ep.step(reply)) is not None:
            seen.append(answer)
    assert ep.stop_reason == "final" or variant != "blind"
    return seen


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_blind_the_hidden_outcome_never_reaches_the_model(protocol: str) -> None:
    """What the model sees in blind is the same whatever the tests say (PASS everywhere, or a failure with a test
    output), and no result it gets names an outcome class or carries test output. The same check tells the study's
    protocol apart: its python_test shows the outcome."""
    worlds = [observations(protocol, "blind", o) for o in (Outcome.PASS, Outcome.ASSERTION_FAILURE, Outcome.TIMEOUT)]
    assert worlds[0] == worlds[1] == worlds[2]
    fixed_text = ERRORS["malformed_prediction"].format(fate="reverted")  # the format's class list, constant text
    for message in worlds[0][1:]:  # every user message: the tool results and errors
        text = message.replace(fixed_text, "")
        assert not any(cls in text for cls in OUTCOMES), message
        assert "tests passed" not in text and "tests failed" not in text and "hidden test output" not in text
    assert UNAVAILABLE in worlds[0]
    study = [observations(protocol, "none", o) for o in (Outcome.PASS, Outcome.ASSERTION_FAILURE)]
    assert study[0] != study[1] and any("ASSERTION_FAILURE" in m for m in study[1][1:])


def test_blind_steps_keep_the_hidden_outcome_for_training_only() -> None:
    """The shadow outcome and its detail are on the patch steps (CE labels, mechanism metrics), never in a result."""
    ep = Episode(ProtocolConfig.resolve("predictive", "blind"), ScriptedTests(Outcome.RUNTIME_ERROR))
    run(ep, [ADD_PATCH, predict("PASS", "KEEP"), "FINAL: x"])
    p = ep.steps[0]
    assert (p.outcome, p.outcome_seen, p.outcome_detail) == (
        "RUNTIME_ERROR", False, "Traceback: the hidden test output of RUNTIME_ERROR")
    assert all("RUNTIME_ERROR" not in (s.result or "") for s in ep.steps)


# ============================================================================================ records
@pytest.mark.parametrize("variant", ENVIRONMENT_VARIANTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_records_round_trip(protocol: str, variant: str, tmp_path: Path) -> None:
    ep, _ = episode(protocol, variant, test_cost=2)
    run(ep, [patch(STUB_LINE, BAD), *keep(protocol), TEST, patch("x + y", "x * y"), *keep(protocol), "FINAL: x"])
    result = {"config": ep.config.to_dict(), "steps": [s.to_dict() for s in ep.steps], "summary": ep.summary()}
    meta = {"arm": f"{variant}_{protocol[0]}", "seed": 1, "checkpoint": "step2", "protocol": protocol,
            "variant": variant}
    graded = Outcome.ASSERTION_FAILURE.value if variant == "irreversible" else Outcome.PASS.value  # the task's check
    row = build_record(meta=meta, task={"task_id": 1}, agent_result=result, final_verdict={"outcome": graded},
                       reward=float(graded == "PASS"), ok=True, error=None, wall_s=0.1)
    (back,) = read_records(write_records([row], tmp_path / "r.parquet"))
    assert (back["variant"], back["protocol"], back["test_cost"], back["budget"]) == (variant, protocol, 2, 9)
    patches = patch_steps(back["steps"])
    if variant == "irreversible":  # the test ended it: one patch, graded on the tested (failing) state
        assert (back["stop_reason"], back["n_tests"], back["n_test_calls"], back["calls_used"]) == (
            "final_test", 1, 2, 3)
        assert back["final_solution"] == sol(BAD) and len(patches) == 1
        assert (back["final_pass"], back["recovered"], back["reward"]) == (False, False, 0.0)
    else:  # blind: the test call was invalid, both patches shadowed, the final state graded
        assert (back["stop_reason"], back["n_tests"], back["n_test_calls"], back["calls_used"]) == ("final", 0, 0, 3)
        assert back["steps"][len(keep(protocol)) + 1]["error"] == "test_unavailable"
        assert back["final_solution"] == sol(GOOD) and (back["final_pass"], back["recovered"]) == (True, True)
    assert [(p["outcome"], p["outcome_seen"]) for p in patches][0] == ("ASSERTION_FAILURE", False)
    if protocol == "predictive":
        assert all(p["prediction"] == "PASS" and p["decision"] == "KEEP" for p in patches)


def test_the_program_runs_the_variant_the_harness_passes() -> None:
    from predict.env.program import parse_args as program_args
    from predict.env.runner import RolloutSettings, build_agent_config

    for variant in ENVIRONMENT_VARIANTS:
        settings = RolloutSettings.of(base_url="http://127.0.0.1:1/v1", model="m", protocol="reactive", variant=variant)
        harness = build_agent_config(settings).harness.protocol
        args = program_args(["--model", "m", "--prompt", "p", f"--protocol-config={json.dumps(harness.to_dict())}"])
        assert ProtocolConfig(**json.loads(args.protocol_config)) == harness == ProtocolConfig("reactive", variant)
        assert settings.meta()["variant"] == variant

"""The environment variants of issue #11 on scripted replies through `Episode`: expensive tests (``test_cost``) and
edit on REVISE (``variant: edit_on_revise``). Every rule in protocol.py's docstring for them has a test here."""

from __future__ import annotations

import json
from pathlib import Path

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
    edit_reply,
    error_result,
    scaled_budget,
)
from predict.env.records import build_record, patch_steps, read_records, write_records
from tests.test_env_protocol import ADD, READ, STUB_LINE, TEST, FakeTests, patch, predict

ADD_PATCH = "CALL apply_patch " + ADD
BAD = "def multiply_int(x, y):\n    return x + y"  # FakeTests: ASSERTION_FAILURE
GOOD = "def multiply_int(x, y):\n    return x * y"  # PASS
SUB = "def multiply_int(x, y):\n    return x - y"  # ASSERTION_FAILURE
POW = "def multiply_int(x, y):\n    return x ** y"  # ASSERTION_FAILURE
FAILED_AF = "status: failed\ntests failed (actual: ASSERTION_FAILURE)"


def episode(protocol: str = "reactive", variant: str = "none", **kw: object) -> tuple[Episode, FakeTests]:
    tests = FakeTests()
    return Episode(ProtocolConfig.resolve(protocol, variant, **kw), tests), tests  # type: ignore[arg-type]


def run(ep: Episode, replies: list[str]) -> list[str | None]:
    return [ep.step(r) for r in replies]


def applied(depth: int, cap: int = 2) -> str:
    return f"status: success\npatch reverted\nreplacement patch applied (chained revision {depth} of {cap})"


def sol(code: str) -> str:
    return code + "\n"


# ============================================================================================ expensive tests
def test_budget_scales_with_the_test_cost_after_the_variant() -> None:
    assert [scaled_budget(8, k) for k in (1, 2, 3, 5)] == [8, 9, 10, 12]
    assert ProtocolConfig.resolve(test_cost=3).budget == 10
    assert ProtocolConfig.resolve("predictive", "budget_neutral", budget_neutral_budget=20, test_cost=3).budget == 22
    free = ProtocolConfig.resolve("predictive", "budget_neutral", test_cost=3)
    assert (free.budget, free.revise_costs_call, free.test_cost) == (10, False, 3)
    with pytest.raises(ValueError, match="test_cost"):
        ProtocolConfig(test_cost=0)


@pytest.mark.parametrize("protocol", ["reactive", "predictive"])
def test_a_direct_solve_fits_and_the_test_spends_k_calls(protocol: str) -> None:
    ep, _ = episode(protocol, test_cost=3)
    keep = [predict("PASS", "KEEP")] if protocol == "predictive" else []
    results = run(ep, [READ, patch(STUB_LINE, GOOD), *keep, TEST, "FINAL: done"])
    assert results[-2:] == [RESULT_TESTS_PASSED, None]
    test = next(s for s in ep.steps if s.action == "python_test")
    assert (test.cost, test.counted, test.calls_used, test.outcome_seen) == (3, True, 5, True)
    assert (ep.calls_used, ep.config.budget, ep.stop_reason) == (5, 10, "final")
    assert ep.config.budget - ep.calls_used == 8 - 3  # the spare calls of a direct solve at test_cost 1
    s = ep.summary()
    assert (s["test_cost"], s["n_tests"], s["n_test_calls"], s["n_tests_refused"]) == (3, 1, 3, 0)
    assert [st.cost for st in ep.steps if st.action in ("read_file", "apply_patch")] == [1, 1]


def test_a_test_the_budget_cannot_pay_for_is_refused_and_costs_one_call() -> None:
    ep, tests = episode(test_cost=3)  # budget 10
    run(ep, [READ] * 8)  # 2 calls left
    result = ep.step(TEST)
    assert result == error_result(ERRORS["test_unaffordable"].format(cost=3, left=2))
    assert result == (
        "status: error\npython_test costs 3 tool calls, calls left: 2. Nothing was run (this reply used one call). "
        "Use the remaining calls for other tools, or end with FINAL: <summary>."
    )
    test = ep.steps[-1]
    assert (test.action, test.status, test.error, test.cost, test.outcome) == (
        "python_test",
        "error",
        "test_unaffordable",
        1,
        None,
    )
    assert ep.calls_used == 9 and not tests.calls and not ep.done
    assert ep.step(TEST) is None  # refused again, and that was the last call
    assert (ep.stop_reason, ep.calls_used, ep.summary()["n_tests_refused"]) == ("budget", 10, 2)
    assert not tests.calls


def test_a_refused_test_leaves_the_untested_patch_untested() -> None:
    ep, _ = episode(test_cost=3)
    run(ep, [READ] * 7 + [ADD_PATCH, TEST, "FINAL: x"])  # 8 used, 2 left: refused, then FINAL
    p, t = ep.steps[7], ep.steps[8]
    assert (t.error, p.outcome, p.outcome_seen, p.outcome_step) == (
        "test_unaffordable",
        "ASSERTION_FAILURE",
        False,
        None,
    )
    assert ep.stop_reason == "final" and ep.calls_used == 9


def test_a_test_on_exactly_the_last_k_calls_runs_unseen() -> None:
    ep, tests = episode(test_cost=3)
    run(ep, [READ] * 6 + [ADD_PATCH])  # 7 used, 3 left
    assert ep.step(TEST) is None
    test, p = ep.steps[-1], ep.steps[-2]
    assert (test.cost, test.result_sent, test.outcome, test.outcome_seen) == (3, False, "ASSERTION_FAILURE", False)
    assert (p.outcome, p.outcome_seen, p.outcome_step) == ("ASSERTION_FAILURE", False, None)
    assert ep.calls_used == ep.config.budget == 10 and sum(tests.calls.values()) == 1


def test_an_invalid_python_test_costs_one_call_not_k() -> None:
    ep, tests = episode(test_cost=3)
    result = ep.step('CALL python_test {"project_path": "../x.py"}')
    assert result is not None and "outside the workdir" in result
    assert (ep.steps[0].cost, ep.calls_used, ep.summary()["n_test_calls"]) == (1, 1, 1)
    assert not tests.calls


def test_prediction_saves_calls_when_tests_are_expensive() -> None:
    """Arm B's REVISE of a failing patch costs one call; Arm A's test of it costs k."""
    a, _ = episode("reactive", test_cost=3)
    run(a, [ADD_PATCH, TEST, patch("x + y", "x * y"), TEST, "FINAL: ok"])
    b, _ = episode("predictive", test_cost=3)
    run(
        b,
        [
            ADD_PATCH,
            predict("ASSERTION_FAILURE", "REVISE"),
            patch(STUB_LINE, GOOD),
            predict("PASS", "KEEP"),
            "FINAL: ok",
        ],
    )
    assert (a.calls_used, b.calls_used) == (8, 2)
    assert a.solution == b.solution == sol(GOOD)


def test_system_prompts_state_the_test_cost_exactly() -> None:
    note = (
        "\n  It costs 3 tool calls of the budget (every other tool call costs one). With fewer than 3 calls left it "
        "is refused with status: error, and that reply uses one call."
    )
    for protocol in ("reactive", "predictive"):
        base = ProtocolConfig(protocol).system_prompt()  # type: ignore[arg-type]
        assert "costs" not in base and "refused" not in base  # test_cost 1: the study's prompt
        expensive = ProtocolConfig.resolve(protocol, test_cost=3).system_prompt()
        assert note in expensive and "budget of 10 tool calls" in expensive
        assert expensive.replace(note, "").replace("budget of 10", "budget of 8") == base


# ============================================================================================ edit on REVISE
def edit_episode(**kw: object) -> tuple[Episode, FakeTests]:
    return episode("predictive", "edit_on_revise", **kw)


def test_edit_on_revise_applies_the_replacement_at_no_call() -> None:
    ep, tests = edit_episode()
    results = run(
        ep,
        [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD), predict("PASS", "KEEP"), TEST, "FINAL: ok"],
    )
    assert results == [RESULT_PATCH_APPLIED, applied(1), RESULT_PATCH_KEPT, RESULT_TESTS_PASSED, None]
    assert "ASSERTION_FAILURE" not in (results[1] or "")  # the answer reveals nothing about the outcome
    revised, edit, pred = ep.steps[0], ep.steps[1], ep.steps[2]
    # the REVISEd patch: its prediction, reverted, its hidden shadow outcome (run before the revert)
    assert (revised.prediction, revised.decision, revised.reverted, revised.prediction_step) == (
        "ASSERTION_FAILURE",
        "REVISE",
        True,
        1,
    )
    assert (revised.outcome, revised.outcome_seen) == ("ASSERTION_FAILURE", False)
    assert tests.calls[sol(BAD)] == 1
    # the REVISE reply's step is the replacement's patch step, with the replacement's own prediction
    assert (edit.action, edit.applied, edit.edited_from, edit.revision_depth, edit.patch_step) == (
        "prediction",
        True,
        0,
        1,
        0,
    )
    assert (edit.find, edit.replace, edit.patched_code) == (STUB_LINE, GOOD, sol(GOOD))
    assert (edit.prediction, edit.decision, edit.prediction_step, edit.reverted) == ("PASS", "KEEP", 2, False)
    assert (edit.outcome, edit.outcome_seen, edit.outcome_step) == ("PASS", True, 3)
    assert (edit.counted, edit.cost, edit.calls_used, edit.status, edit.edit_error) == (False, 0, 1, "success", None)
    assert pred.patch_step == 1
    assert ep.calls_used == 2 and ep.solution == sol(GOOD)
    s = ep.summary()
    assert (s["n_patches"], s["n_predictions"], s["n_revised"], s["ever_revised"]) == (2, 2, 1, True)
    assert (s["n_edit_revisions"], s["ever_edited"], s["max_revision_depth"], s["n_edit_errors"]) == (1, True, 1, 0)


def test_chained_revisions_up_to_the_cap_then_revise_only_reverts() -> None:
    ep, _ = edit_episode()  # max_chained_revisions 2
    results = run(
        ep,
        [
            ADD_PATCH,
            edit_reply("ASSERTION_FAILURE", STUB_LINE, SUB),
            edit_reply("ASSERTION_FAILURE", STUB_LINE, POW),
            edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD),  # a third replacement: over the cap
            READ,
        ],
    )
    cap = "status: error\npatch reverted\n" + ERRORS["revision_cap"].format(cap=2)
    assert results == [RESULT_PATCH_APPLIED, applied(1), applied(2), cap, "status: success\n" + STUB]
    assert results[3] == (
        "status: error\npatch reverted\nchained revision limit reached (2 replacement patches in a row), so the "
        "replacement patch was not applied. Continue with a tool call."
    )
    p0, r1, r2, refused = ep.steps[:4]
    assert [(s.applied, s.revision_depth, s.edited_from) for s in (p0, r1, r2)] == [
        (True, 0, None),
        (True, 1, 0),
        (True, 2, 1),
    ]
    assert [(s.outcome, s.outcome_seen, s.reverted, s.decision) for s in (p0, r1, r2)] == [
        ("ASSERTION_FAILURE", False, True, "REVISE")
    ] * 3
    assert (refused.applied, refused.edited_from, refused.edit_error, refused.status) == (
        False,
        None,
        "revision_cap",
        "error",
    )
    assert refused.prediction == "ASSERTION_FAILURE" and refused.patch_step == 2  # a plain prediction step
    assert ep.solution == STUB and ep.calls_used == 2 and not ep.awaiting_prediction
    s = ep.summary()
    assert (s["n_patches"], s["n_edit_revisions"], s["max_revision_depth"], s["n_edit_errors"]) == (3, 2, 2, 1)


def test_a_revise_at_the_cap_without_a_replacement_is_a_plain_revert() -> None:
    ep, _ = edit_episode(max_chained_revisions=1)
    results = run(ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, SUB), predict("RUNTIME_ERROR", "REVISE")])
    assert results[1:] == [applied(1, cap=1), RESULT_PATCH_REVERTED]
    assert ep.steps[2].edit_error is None and ep.solution == STUB
    # ... and another action line there is ignored, like in any prediction reply
    ep, tests = edit_episode(max_chained_revisions=1)
    results = run(
        ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, SUB), predict("OTHER", "REVISE") + "\n" + TEST]
    )
    assert results[2] == RESULT_PATCH_REVERTED and sum(tests.calls.values()) == 2  # two shadows, no test


def test_the_cap_counts_replacements_in_a_row_not_per_episode() -> None:
    ep, _ = edit_episode(max_chained_revisions=1)
    results = run(
        ep,
        [
            ADD_PATCH,
            edit_reply("ASSERTION_FAILURE", STUB_LINE, SUB),
            predict("PASS", "KEEP"),
            patch("x - y", "x + y"),  # a tool call's patch starts a new chain
            edit_reply("ASSERTION_FAILURE", "x - y", "x * y"),
        ],
    )
    assert results[4] == applied(1, cap=1) and ep.solution == sol(GOOD)


@pytest.mark.parametrize(
    ("tail", "kind", "message"),
    [
        ("", "replacement_missing", ERRORS["replacement_missing"].format()),
        ("\n" + TEST, "replacement_not_patch", ERRORS["replacement_not_patch"].format(tool="python_test")),
        ("\nFINAL: done", "replacement_not_patch", ERRORS["replacement_not_patch"].format(tool="FINAL")),
        (
            "\n" + patch("no such text", "x"),
            "find_not_found",
            ERRORS["replacement_failed"].format(detail=ERRORS["find_not_found"].format(path="solution.py")),
        ),
        (
            "\n" + patch("e", "x"),
            "find_ambiguous",
            ERRORS["replacement_failed"].format(detail=ERRORS["find_ambiguous"].format(path="solution.py", count=3)),
        ),
        ('\nCALL apply_patch {"find": "# Write", ', "malformed_json", None),
        ('\nCALL apply_patch {"find": "# Write"}', "missing_args", None),
    ],
)
def test_a_revise_without_a_usable_replacement_reverts_applies_nothing_and_says_why(
    tail: str, kind: str, message: str | None
) -> None:
    ep, tests = edit_episode()
    results = run(ep, [ADD_PATCH, predict("ASSERTION_FAILURE", "REVISE") + tail])
    result = results[1] or ""
    assert result.startswith("status: error\npatch reverted\n")
    if message is not None:
        assert result == "status: error\npatch reverted\n" + message
    else:
        assert result.startswith("status: error\npatch reverted\nthe replacement patch was not applied: ")
    step = ep.steps[1]
    assert (step.action, step.status, step.error, step.edit_error, step.applied, step.edited_from) == (
        "prediction",
        "error",
        kind,
        kind,
        False,
        None,
    )
    assert (step.counted, ep.calls_used, ep.solution, ep.awaiting_prediction) == (False, 1, STUB, False)
    assert step.prediction == "ASSERTION_FAILURE"  # a plain prediction step: it repeats its patch's prediction
    assert list(tests.calls) == [sol(BAD)]  # only the REVISEd patch's shadow ran
    assert ep.step(READ) == "status: success\n" + STUB  # the next reply is a tool call again
    assert ep.summary()["n_edit_errors"] == 1


def test_missing_replacement_message_is_exact() -> None:
    assert ERRORS["replacement_missing"].format() == (
        "no replacement patch. After REVISE, put the replacement on a later line of the same reply: CALL apply_patch "
        '{"find": "<exact text>", "replace": "<new text>"}, written against solution.py without the reverted patch. '
        "Nothing was applied."
    )


def test_forced_and_malformed_revise_also_take_the_replacement() -> None:
    ep, _ = edit_episode()
    results = run(ep, [ADD_PATCH, edit_reply("RUNTIME_ERROR", STUB_LINE, GOOD).replace("REVISE", "KEEP")])
    assert results[1] == applied(1) and ep.steps[0].forced and ep.solution == sol(GOOD)
    ep, _ = edit_episode()
    reply = "It fails, I rewrite it.\n" + patch(STUB_LINE, GOOD)
    results = run(ep, [ADD_PATCH, reply])
    assert results[1] == (
        "status: error\n"
        + ERRORS["malformed_prediction"].format(fate="reverted")
        + "\nreplacement patch applied (chained revision 1 of 2)"
    )
    edit = ep.steps[1]
    assert (ep.steps[0].prediction, edit.error, edit.edit_error, edit.applied) == (
        MALFORMED,
        "malformed_prediction",
        None,
        True,
    )


def test_keep_ignores_an_action_line_in_the_prediction_reply() -> None:
    ep, tests = edit_episode()
    results = run(ep, [patch(STUB_LINE, GOOD), predict("PASS", "KEEP") + "\n" + patch("x * y", "x + y")])
    assert results[1] == RESULT_PATCH_KEPT and ep.solution == sol(GOOD) and not ep.steps[1].applied


def test_replacement_is_written_against_the_reverted_solution() -> None:
    ep, _ = edit_episode()
    run(ep, [patch(STUB_LINE, BAD), predict("PASS", "KEEP"), patch("x + y", "x - y")])
    # the find text of the REVISEd patch's result ("x - y") is gone after the revert; the kept state has "x + y"
    results = run(ep, [edit_reply("ASSERTION_FAILURE", "x - y", "x * y")])
    assert ep.steps[-1].edit_error == "find_not_found" and ep.solution == sol(BAD)
    ep, _ = edit_episode()
    run(ep, [patch(STUB_LINE, BAD), predict("PASS", "KEEP"), patch("x + y", "x - y")])
    results = run(ep, [edit_reply("ASSERTION_FAILURE", "x + y", "x * y")])
    assert results == [applied(1)] and ep.solution == sol(GOOD)


def test_replacement_gets_shadowed_when_a_later_patch_or_the_end_comes_first() -> None:
    ep, tests = edit_episode()
    run(ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, SUB), predict("PASS", "KEEP"), "FINAL: x"])
    edit = ep.steps[1]
    assert (edit.outcome, edit.outcome_seen, edit.reverted) == ("ASSERTION_FAILURE", False, False)
    assert tests.calls[sol(SUB)] == 1


def test_replacement_after_the_budget_ending_patch_still_gets_its_prediction() -> None:
    ep, _ = edit_episode(budget=2)
    assert run(ep, [READ, ADD_PATCH]) == ["status: success\n" + STUB, RESULT_PATCH_APPLIED]
    assert ep.step(edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD)) == applied(1)
    assert ep.awaiting_prediction and not ep.done
    assert ep.step(predict("PASS", "KEEP")) is None
    edit = ep.steps[2]
    assert (ep.stop_reason, ep.solution, edit.outcome, edit.outcome_seen, edit.decision) == (
        "budget",
        sol(GOOD),
        "PASS",
        False,
        "KEEP",
    )


def test_cut_off_after_a_replacement_leaves_it_applied_with_a_null_prediction() -> None:
    ep, _ = edit_episode()
    run(ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD)])
    ep.finish("max_turns")
    edit = ep.steps[1]
    assert (edit.applied, edit.prediction, edit.decision, edit.forced) == (True, None, None, None)
    assert (edit.outcome, edit.outcome_seen, ep.solution) == ("PASS", False, sol(GOOD))


def test_edit_on_revise_config_rules_and_incompatible_combinations() -> None:
    config = ProtocolConfig.resolve("predictive", "edit_on_revise")
    assert (config.budget, config.max_chained_revisions, config.model_call_cap) == (8, 2, 33)
    assert ProtocolConfig.resolve("predictive", "edit_on_revise", max_chained_revisions=1).model_call_cap == 25
    with pytest.raises(ValueError, match="predictive"):
        ProtocolConfig("reactive", "edit_on_revise")
    with pytest.raises(ValueError, match="revise_costs_call"):
        ProtocolConfig("predictive", "edit_on_revise", revise_costs_call=False)
    with pytest.raises(ValueError, match="max_chained_revisions"):
        ProtocolConfig("predictive", "edit_on_revise", max_chained_revisions=0)
    # one variant at a time: forced_keep / budget_neutral never apply a replacement, whatever the reply holds
    for variant in ("none", "forced_keep", "budget_neutral"):
        ep, _ = episode("predictive", variant)
        run(ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD)])
        assert not ep.steps[1].applied and ep.solution != sol(GOOD) and ep.summary()["n_edit_revisions"] == 0


def test_edit_on_revise_composes_with_expensive_tests() -> None:
    ep, _ = edit_episode(test_cost=3)
    run(ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD), predict("PASS", "KEEP"), TEST, "FINAL: x"])
    assert (ep.config.budget, ep.calls_used, ep.stop_reason) == (10, 4, "final")


def test_edit_on_revise_system_prompt() -> None:
    prompt = ProtocolConfig.resolve("predictive", "edit_on_revise").system_prompt()
    assert prompt.startswith(ProtocolConfig("reactive").system_prompt())
    assert (
        "REVISE reverts the patch (the tool call stays spent) and must be followed, on a later line of the same reply, "
        "by a replacement patch written against solution.py as it was before the reverted patch:\n"
        'CALL apply_patch {"find": "<exact text>", "replace": "<new text>"}\n'
        "The replacement costs no tool call; it is applied and then needs its own prediction line. At most 2 "
        "replacements can follow one another; a REVISE of the last one only reverts it."
    ) in prompt
    assert (
        "At most 3 replacements"
        in ProtocolConfig("predictive", "edit_on_revise", max_chained_revisions=3).system_prompt()
    )


def test_edit_on_revise_records_round_trip(tmp_path: Path) -> None:
    ep, _ = edit_episode(test_cost=2)
    run(ep, [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD), predict("PASS", "KEEP"), TEST, "FINAL: x"])
    result = {"config": ep.config.to_dict(), "steps": [s.to_dict() for s in ep.steps], "summary": ep.summary()}
    meta = {"arm": "B", "seed": 1, "checkpoint": "sft", "protocol": "predictive", "variant": "edit_on_revise"}
    row = build_record(
        meta=meta,
        task={"task_id": 1},
        agent_result=result,
        final_verdict={"outcome": "PASS"},
        reward=1.0,
        ok=True,
        error=None,
        wall_s=0.1,
    )
    (back,) = read_records(write_records([row], tmp_path / "r.parquet"))
    assert (back["test_cost"], back["max_chained_revisions"], back["budget"], back["calls_used"]) == (2, 2, 9, 3)
    assert (back["ever_edited"], back["n_edit_revisions"], back["max_revision_depth"], back["n_test_calls"]) == (
        True,
        1,
        1,
        2,
    )
    patches = patch_steps(back["steps"])
    assert [(p["action"], p["edited_from"], p["prediction"], p["outcome"]) for p in patches] == [
        ("apply_patch", None, "ASSERTION_FAILURE", "ASSERTION_FAILURE"),
        ("prediction", 0, "PASS", "PASS"),
    ]
    assert json.loads(back["steps"][1]["args"]) == {"find": STUB_LINE, "replace": GOOD}


# ============================================================================================ plumbing
def test_rollout_cli_takes_the_variant_and_the_protocol_knobs(tmp_path: Path) -> None:
    from predict.cli import build_parser
    from predict.config import load_config
    from predict.env.runner import RolloutSettings
    from predict.runs import with_env
    from predict.stages import EPISODE_VIEW, stage_settings

    base = ["rollout", "--config", "config/local.yaml", "--tasks-file", "t", "--split", "val", "--model", "m"]
    base += ["--checkpoint", "base", "--arm", "B", "--seed", "1", "--out", str(tmp_path / "o.parquet")]
    args = build_parser().parse_args([*base, "--variant", "edit_on_revise", "--test-cost", "3"])
    assert (args.variant, args.test_cost, args.max_chained_revisions) == ("edit_on_revise", 3, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--test-cost", "0"])
    config = stage_settings(EPISODE_VIEW, load_config(Path(__file__).resolve().parents[1] / "config" / "local.yaml"))
    assert (config.env.test_cost, config.env.max_chained_revisions) == (1, 2)  # the study's protocol
    assert with_env(config, test_cost=None) is config
    overridden = with_env(config, test_cost=args.test_cost, max_chained_revisions=args.max_chained_revisions)
    settings = RolloutSettings.from_study_config(
        overridden,
        arm="B", seed=1, checkpoint="sft", base_url="http://x/v1", model="m", variant=args.variant
    )
    protocol = settings.protocol_config
    assert (protocol.variant, protocol.test_cost, protocol.budget, protocol.max_chained_revisions) == (
        "edit_on_revise",
        3,
        10,
        2,
    )
    assert (settings.meta()["budget"], settings.meta()["test_cost"]) == (10, 3)
    assert RolloutSettings.from_study_config(
        config, arm="A", seed=1, checkpoint="sft", base_url="u", model="m"
    ).protocol_config == ProtocolConfig("reactive")


def test_harness_passes_the_protocol_knobs_to_the_program() -> None:
    from predict.env.program import parse_args as program_args
    from predict.env.runner import RolloutSettings, build_agent_config

    settings = RolloutSettings.of(
        base_url="http://127.0.0.1:1/v1",
        model="m",
        protocol="predictive",
        variant="edit_on_revise",
        test_cost=2,
        max_chained_revisions=3,
    )
    harness = build_agent_config(settings).harness.protocol
    assert (harness.variant, harness.budget, harness.test_cost, harness.max_chained_revisions) == (
        "edit_on_revise",
        9,
        2,
        3,
    )
    args = program_args(["--model", "m", "--prompt", "p", f"--protocol-config={json.dumps(harness.to_dict())}"])
    assert ProtocolConfig(**json.loads(args.protocol_config)) == harness  # the program runs the same episode


def test_protocol_knobs_are_declared_in_protocol_config_only() -> None:
    """Rollout settings, the harness config and the program embed one ProtocolConfig (issue 18 item 5): none of
    them re-declares a knob, so a new knob touches the schema and protocol.py only."""
    import inspect
    from dataclasses import fields

    from predict.env.harness import LocalAgentHarnessConfig
    from predict.env.program import parse_args as program_args
    from predict.env.runner import RolloutSettings

    knobs = set(inspect.signature(ProtocolConfig.resolve).parameters) | {f.name for f in fields(ProtocolConfig)}
    assert not knobs & {f.name for f in fields(RolloutSettings)}
    assert not knobs & (set(LocalAgentHarnessConfig.model_fields) - {"protocol"})
    assert LocalAgentHarnessConfig.model_fields["protocol"].annotation is ProtocolConfig
    assert not knobs & set(vars(program_args(["--model", "m", "--prompt", "p"])))
    harness = LocalAgentHarnessConfig(protocol={"protocol": "predictive", "variant": "forced_keep", "budget": 5})
    assert harness.protocol == ProtocolConfig("predictive", "forced_keep", 5)  # a TOML table validates into it

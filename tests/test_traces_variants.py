"""SFT traces that follow the environment variant (issue 28): a run with its own SFT (irreversible, blind) gets its
base arm's traces re-rendered by stepping its own `Episode` (`predict.traces.render`, `predict.traces.stage
.run_traces`, `predict run-traces`). A blind trace never calls python_test, an irreversible one tests once, at the
end; Arm B's recovery predicts the faulty patch's verified class and REVISEs. The study's traces stay byte-identical."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.cli import main
from predict.config import ConfigError, load_config
from predict.config.models import EnvSettings
from predict.data import MBPP_SCHEMA, split_tasks
from predict.env.protocol import Episode, ProtocolConfig, prediction_line, task_prompt
from predict.outputs import write_rows
from predict.runs import resolve_run, sft_runs
from predict.sandbox import Verifier
from predict.traces.render import RECOVERY_STYLES, Trace, TraceError, render, replies, solution_text
from predict.traces.stage import (
    TRACE_SCHEMA,
    Synthesis,
    TracesConfigError,
    render_arm,
    run_stage,
    run_traces,
)
from predict.vocabulary import ENVIRONMENT_VARIANTS, Outcome

REPO = Path(__file__).resolve().parents[1]
GOOD = "def multiply_int(x, y):\n    return x * y"
BAD = "def multiply_int(x, y):\n    return x + y"
TESTS = ["assert multiply_int(2,3)==6"]
TASK = {"task_id": 2, "text": "Write a function to multiply two integers.", "test_list": TESTS, "test_setup_code": ""}
PROMPT = task_prompt(TASK["text"], TESTS)
DIRECT = Trace(1, "direct", PROMPT, "multiply_int", GOOD)
RECOVERY = Trace(2, "recovery", PROMPT, "multiply_int", GOOD, BAD, "op", "m", "ASSERTION_FAILURE")
OUTCOMES = {solution_text(GOOD): Outcome.PASS, solution_text(BAD): Outcome.ASSERTION_FAILURE}
OPEN_QUESTION = {"irreversible_A": ("A", "irreversible"), "irreversible_B": ("B", "irreversible"),
                 "blind_A": ("A", "blind"), "blind_B": ("B", "blind")}


def verified(code: str) -> Outcome:
    return OUTCOMES[code]


def own_sft_config() -> dict[str, Any]:
    """The embedded default with the open-question runs on their own SFT (the paper's choice)."""
    config = copy.deepcopy(load_config(REPO / "config" / "local.yaml"))
    for run in OPEN_QUESTION:
        config["extensions"][run].pop("sft", None)
    return config


def assistant(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


def test_the_study_traces_are_byte_identical_to_before_issue_28() -> None:
    """sha256 of both arms' messages, steps and summaries for a direct and a recovery trace in both recovery styles,
    computed at 9882a9f (before the variants)."""
    out = []
    for protocol in ("reactive", "predictive"):
        for style in RECOVERY_STYLES:
            for trace in (DIRECT, RECOVERY):
                messages, episode = render(trace, ProtocolConfig.resolve(protocol), verified, style)
                out.append([messages, [s.to_dict() for s in episode.steps], episode.summary()])
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    assert digest == "a6898b8e093afc3c82750a49e1773381df1f6fc062f495b037d1d8272add2689"


@pytest.mark.parametrize("style", RECOVERY_STYLES)
@pytest.mark.parametrize("protocol", ["reactive", "predictive"])
@pytest.mark.parametrize("variant", ENVIRONMENT_VARIANTS)
def test_variant_traces_follow_the_variant_rules(variant: str, protocol: str, style: str) -> None:
    config = ProtocolConfig.resolve(protocol, variant)
    for trace in (DIRECT, RECOVERY):
        messages, episode = render(trace, config, verified, style)
        said = assistant(messages)
        assert messages[0] == {"role": "system", "content": config.system_prompt()}
        tests = [r for r in said if r.startswith("CALL python_test")]
        if variant == "blind":  # never a test; the trace ends at FINAL, claiming no test result
            assert tests == [] and said[-1] == "FINAL: solution.py defines multiply_int."
            assert episode.stop_reason == "final"
        else:  # one test, the last message: the episode ends on it, its result never sent
            assert tests == [said[-1]] and messages[-1]["role"] == "assistant"
            assert episode.stop_reason == "final_test" and not episode.steps[-1].result_sent
        assert episode.solution == solution_text(GOOD) and not any(s.status == "error" for s in episode.steps)
        patches = [s for s in episode.steps if s.action == "apply_patch"]
        assert all(p.outcome_seen is False for p in patches)  # nothing is tested in view under these variants
        if trace.role == "recovery":
            assert [p.outcome for p in patches] == ["ASSERTION_FAILURE", "PASS"]
            if protocol == "predictive" and style == "revise":  # the verified class, REVISE, then the gold patch
                assert said[2] == prediction_line("ASSERTION_FAILURE", "REVISE") and patches[0].reverted
                assert all(p.prediction == p.outcome for p in patches)
            else:  # no test to fail: the faulty code is read back, then repaired
                look = 1 + 1 + (protocol == "predictive")  # read, faulty patch, [its PASS / KEEP], then this
                assert said[look] == 'CALL read_file {"file_path": "solution.py"}'
                assert messages[2 + 2 * look + 1]["content"] == "status: success\n" + solution_text(BAD)
        # an independent episode of the variant gives back exactly the user messages
        replay = Episode(config, verified)
        answers = [replay.step(r) for r in said]
        assert [a for a in answers if a is not None] == [m["content"] for m in messages[2:] if m["role"] == "user"]
        assert answers[-1] is None and replay.done


def test_irreversible_traces_fit_the_scaled_budget_at_a_test_cost() -> None:
    config = ProtocolConfig.resolve("reactive", "irreversible", test_cost=3)  # budget 10
    _, episode = render(RECOVERY, config, verified)
    assert (episode.calls_used, episode.steps[-1].cost, episode.stop_reason) == (7, 3, "final_test")


def test_other_variants_are_not_rendered() -> None:
    for variant in ("forced_keep", "budget_neutral", "edit_on_revise"):
        with pytest.raises(TraceError, match="not '" + variant):
            replies(DIRECT, ProtocolConfig.resolve("predictive", variant))


# ---------------------------------------------------------------------------------------------- runs with own SFT
def arm_rows(arm: str) -> list[dict[str, Any]]:
    config = ProtocolConfig.resolve("reactive" if arm == "A" else "predictive")
    synthesis = Synthesis([DIRECT, RECOVERY], [], {(t, s): o for t in (1, 2) for s, o in OUTCOMES.items()})
    return render_arm(synthesis, arm, config, recovery_style="revise", seed=42)


def test_which_runs_get_their_own_sft() -> None:
    config = own_sft_config()
    assert sft_runs(config) == ["A", "B", *OPEN_QUESTION]
    for run, (arm, variant) in OPEN_QUESTION.items():
        spec = resolve_run(config, run)
        assert (spec.arm, spec.variant, spec.sft_run, spec.own_sft) == (arm, variant, run, True)
    for run in ("A", "alpha0", "forced_keep", "expensive_tests_A", "edit_on_revise", "rft_B"):
        spec = resolve_run(config, run)
        assert spec.sft_run == spec.arm and not spec.own_sft, run
    local = load_config(REPO / "config" / "local.yaml")  # locally: the base arm's SFT (sft: base), for CI's time
    assert sft_runs(local) == ["A", "B"] and resolve_run(local, "blind_B").sft_run == "B"
    paper = load_config(REPO / "config" / "config.yaml")
    assert sft_runs(paper) == ["A", "B", *OPEN_QUESTION]


def test_bad_sft_and_variant_settings_are_named() -> None:
    config = own_sft_config()
    config["extensions"]["keep_own"] = {"base_arm": "B", "variant": "forced_keep", "sft": "own"}
    with pytest.raises(ConfigError, match="extensions.keep_own.sft: own needs SFT traces of its variant"):
        resolve_run(config, "keep_own")
    del config["extensions"]["keep_own"]
    # a value outside the key's allowed ones is the config model's to refuse, naming the key, the values and the bad one
    config["extensions"]["x"] = {"base_arm": "A", "variant": "blind", "sft": "mine"}
    with pytest.raises(ConfigError, match="extensions.x.sft: Input should be 'own' or 'base', got 'mine'"):
        resolve_run(config, "x")
    del config["extensions"]["x"]
    for variant in ("forced_keep", "budget_neutral"):
        config["extensions"]["y"] = {"base_arm": "A", "variant": variant}
        with pytest.raises(ConfigError, match=f"extensions.y: variant {variant} needs a predictive base arm"):
            resolve_run(config, "y")
    del config["extensions"]["y"]
    config["extensions"]["z"] = {"base_arm": "A", "variant": "deaf"}
    with pytest.raises(ConfigError, match="extensions.z.variant: Input should be .*'none'.*got 'deaf'"):
        resolve_run(config, "z")


@pytest.mark.parametrize("run", list(OPEN_QUESTION))
def test_run_traces_are_the_arms_traces_under_the_runs_own_episode(run: str) -> None:
    arm, variant = OPEN_QUESTION[run]
    rows = run_traces(own_sft_config(), run, arm_rows(arm), [TASK | {"task_id": 1}, TASK])
    expected = render_arm(Synthesis([DIRECT, RECOVERY], [], {(t, s): o for t in (1, 2) for s, o in OUTCOMES.items()}),
                          run, ProtocolConfig.resolve(resolve_run(own_sft_config(), run).protocol, variant),
                          recovery_style="revise", seed=42)
    assert rows == expected
    for base, row in zip(arm_rows(arm), rows, strict=True):
        assert row["arm"] == run and row["protocol"] == base["protocol"]
        assert {k: row[k] for k in ("task_id", "role", "gold_code", "faulty_code", "verified_class", "operator")} == {
            k: base[k] for k in ("task_id", "role", "gold_code", "faulty_code", "verified_class", "operator")}
        assert row["messages"][1] == base["messages"][1] and row["messages"][0] != base["messages"][0]
        assert row["messages"] != base["messages"] and row["faulty_message"] == base["faulty_message"]
        calls = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert sum(c.startswith("CALL python_test") for c in calls) == (1 if variant == "irreversible" else 0)


def test_run_traces_refuse_what_they_cannot_stand_behind() -> None:
    config = own_sft_config()
    with pytest.raises(TracesConfigError, match="run edit_on_revise: it trains from B's SFT"):
        run_traces(config, "edit_on_revise", arm_rows("B"), [TASK])
    with pytest.raises(TraceError, match="a trace of arm B"):  # the wrong arm's file
        run_traces(config, "blind_A", arm_rows("B"), [TASK | {"task_id": 1}, TASK])
    stale = [{**r, "recovery_style": "keep_test"} for r in arm_rows("A")]
    with pytest.raises(TraceError, match="rerun `predict traces`"):
        run_traces(config, "blind_A", stale, [TASK | {"task_id": 1}, TASK])
    with pytest.raises(TraceError, match="task 1: not in the sft split"):
        run_traces(config, "blind_A", arm_rows("A"), [TASK])
    other_task = [TASK | {"task_id": 1, "text": "Another task."}, TASK]
    with pytest.raises(TraceError, match="task 1: the trace's task prompt is not the sft split's"):
        run_traces(config, "blind_A", arm_rows("A"), other_task)


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    with Verifier(timeout_s=3.0, memory_mb=1024, workers=2) as v:
        yield v


def test_run_traces_stage_replays_through_the_sandbox_with_reward_one(
    mbpp_rows: list[dict], tmp_path: Path, verifier: Verifier
) -> None:
    """`predict traces` on a few sft tasks, then `predict run-traces` for every open-question run: each trace replays
    through a fresh Episode of the run's protocol backed by the real sandbox to exactly its tool results, and the
    state the episode ends on (the one graded) passes."""
    sft = split_tasks(mbpp_rows, 42, {"sft": 212, "rl": 212, "test": 500})["sft"][:10]
    tasks = tmp_path / "sft.parquet"
    write_rows(sft, MBPP_SCHEMA, tasks)
    config = own_sft_config()
    config["traces"].update(n_direct=3, n_recovery=3)
    run_stage(sft, config, tmp_path, progress=False)
    by_id = {t["task_id"]: t for t in sft}
    for run, (arm, variant) in OPEN_QUESTION.items():
        out = tmp_path / f"{run}.parquet"
        argv = ["run-traces", "--config-json", json.dumps(config), "--run", run, "--tasks-file", str(tasks),
                "--arm-traces", str(tmp_path / f"{arm}.parquet"), "--out", str(out)]
        assert main(argv) == 0
        table = pq.read_table(out)
        assert table.schema == TRACE_SCHEMA and table.num_rows == 6
        protocol = ProtocolConfig.from_env(EnvSettings.model_validate(config["env"]), resolve_run(config, run).protocol,
                                           variant=variant)
        for row in table.to_pylist():
            task = by_id[row["task_id"]]
            assert row["messages"][0]["content"] == protocol.system_prompt()
            episode = Episode(protocol, lambda code, t=task: verifier.check(code, t["test_list"], t["test_setup_code"]))
            said = assistant(row["messages"])
            answers = [episode.step(r) for r in said]
            assert [a for a in answers if a is not None] == [m["content"] for m in row["messages"][2:]
                                                             if m["role"] == "user"]
            assert episode.done and answers[-1] is None and episode.calls_used == row["n_tool_calls"]
            graded = verifier.check(episode.solution, task["test_list"], task["test_setup_code"])
            assert graded.outcome is Outcome.PASS, (run, row["task_id"])
            if row["role"] == "recovery":
                first = next(s for s in episode.steps if s.action == "apply_patch")
                assert first.outcome == row["verified_class"] and first.outcome_seen is False
    again = tmp_path / "again.parquet"
    argv = ["run-traces", "--config-json", json.dumps(config), "--run", "blind_B", "--tasks-file", str(tasks),
            "--arm-traces", str(tmp_path / "B.parquet"), "--out", str(again)]
    assert main(argv) == 0 and again.read_bytes() == (tmp_path / "blind_B.parquet").read_bytes()  # byte-identical

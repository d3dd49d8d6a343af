"""`predict traces`: roles, mix, both arms from one trace, byte-identical output, and every trace replaying through
an independent `Episode` + sandbox to exactly the tool results it contains, with reward 1.0."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.cli import main
from predict.config import load_config
from predict.data import MBPP_SCHEMA, split_tasks
from predict.env.protocol import Episode, ProtocolConfig, parse_prediction, task_prompt
from predict.outputs import write_rows
from predict.sandbox import Verifier
from predict.traces.render import Trace, render, replies, solution_text
from predict.traces.stage import TRACE_SCHEMA, mix_counts, mix_table, run_stage
from predict.vocabulary import Outcome

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sft(mbpp_rows: list[dict]) -> list[dict]:
    return split_tasks(mbpp_rows, 42, {"sft": 212, "rl": 212, "test": 500})["sft"]


def study_config(**traces: Any) -> dict[str, Any]:
    config = copy.deepcopy(load_config(REPO / "config" / "local.yaml"))
    config["traces"].update(traces)
    return config


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    with Verifier(timeout_s=3.0, memory_mb=1024, workers=2) as v:
        yield v


def replay(row: dict[str, Any], task: dict[str, Any], verifier: Verifier, budget: int = 8) -> Episode:
    """Feed the trace's assistant turns to a fresh Episode backed by the sandbox; every environment answer must be
    exactly the next user message, and the episode must end on the last (FINAL) message."""
    messages = row["messages"]
    config = ProtocolConfig.resolve(row["protocol"], budget=budget)
    assert messages[0] == {"role": "system", "content": config.system_prompt()}
    assert messages[1] == {"role": "user", "content": task_prompt(task["text"], task["test_list"])}
    faulty = solution_text(row["faulty_code"]) if row["faulty_code"] is not None else None

    def run_tests(code: str) -> Any:
        verdict = verifier.check(code, task["test_list"], task["test_setup_code"])
        claimed = code == faulty and verdict.outcome.value == row["verified_class"]
        if verdict.outcome in (Outcome.TIMEOUT, Outcome.OTHER) and not claimed:  # a starved check: once more
            verdict = verifier.check(code, task["test_list"], task["test_setup_code"])
        return verdict

    episode = Episode(config, run_tests)
    i = 2
    while i < len(messages):
        assert messages[i]["role"] == "assistant"
        answer = episode.step(messages[i]["content"])
        if i + 1 < len(messages):
            assert answer == messages[i + 1]["content"] and messages[i + 1]["role"] == "user", (row["task_id"], i)
        else:
            assert answer is None
        i += 2
    assert episode.done and episode.stop_reason == "final"
    assert "<think>" not in json.dumps(messages)
    return episode


def reward(episode: Episode, task: dict[str, Any], verifier: Verifier) -> float:
    verdict = verifier.check(episode.solution, task["test_list"], task["test_setup_code"])
    return 1.0 if verdict.outcome is Outcome.PASS else 0.0


@pytest.fixture(scope="module")
def balanced(sft: list[dict], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A small balanced run (every reachable class) on 24 sft tasks."""
    out = tmp_path_factory.mktemp("balanced")
    config = study_config(n_direct=12, n_recovery=8, mix="balanced")
    summary = run_stage(sft[:24], config, out, progress=False)
    return out, summary


def test_balanced_mix_roles_and_report(balanced: tuple[Path, dict[str, Any]]) -> None:
    out, summary = balanced
    tasks = pq.read_table(out / "tasks.parquet").to_pylist()
    assert len(tasks) == 24 and Counter(t["role"] for t in tasks)["recovery"] == 8
    for arm in ("A", "B"):
        table = pq.read_table(out / f"{arm}.parquet")
        assert table.schema == TRACE_SCHEMA
        rows = table.to_pylist()
        assert Counter(r["role"] for r in rows) == {"direct": 12, "recovery": 8}
        got = Counter(r["verified_class"] for r in rows if r["role"] == "recovery")
        assert got == mix_counts("balanced", 8)
        assert summary["arms"][arm] == mix_table(rows)
        assert {e["verified_class"]: e["count"] for e in mix_table(rows) if e["role"] == "recovery"} == {
            c: got.get(c, 0) for c in ("ASSERTION_FAILURE", "RUNTIME_ERROR", "SYNTAX_ERROR", "TIMEOUT")
        }
        for r in rows:
            assert (r["operator"] is None) == (r["role"] == "direct") == (r["faulty_message"] is None)
            assert r["n_messages"] == len(r["messages"])
    recovery = {t["task_id"]: t for t in tasks if t["role"] == "recovery"}
    assert all(t["verified_class"] == t["target_class"] and t["operator"] for t in recovery.values())


@pytest.fixture(scope="module")
def replayed(
    balanced: tuple[Path, dict[str, Any]], sft: list[dict], verifier: Verifier
) -> dict[tuple[str, int], tuple[dict[str, Any], Episode]]:
    """Every trace of the balanced run replayed once: (arm, task_id) -> (row, episode)."""
    out, _ = balanced
    by_id = {t["task_id"]: t for t in sft}
    result = {}
    for arm in ("A", "B"):
        for row in pq.read_table(out / f"{arm}.parquet").to_pylist():
            result[(arm, row["task_id"])] = (row, replay(row, by_id[row["task_id"]], verifier))
    return result


def test_every_trace_replays_with_its_tool_results_and_reward_one(
    replayed: dict[tuple[str, int], tuple[dict[str, Any], Episode]], sft: list[dict], verifier: Verifier
) -> None:
    by_id = {t["task_id"]: t for t in sft}
    for row, episode in replayed.values():
        task = by_id[row["task_id"]]
        assert reward(episode, task, verifier) == 1.0
        assert episode.calls_used == row["n_tool_calls"] <= 8
        patches = [s for s in episode.steps if s.action == "apply_patch" and s.applied]
        if row["role"] == "recovery":
            assert patches[0].outcome == row["verified_class"]
            assert messages_index(row, patches[0].index) == row["faulty_message"]
        assert patches[-1].outcome == "PASS"
        if row["protocol"] == "predictive":  # revise style: every prediction is the verified class
            assert all(p.prediction == p.outcome for p in patches)
            assert [p.reverted for p in patches] == [row["role"] == "recovery"] + [False] * (len(patches) - 1)


def messages_index(row: dict[str, Any], step: int) -> int:
    return 2 + 2 * step


def test_arms_come_from_one_trace(
    balanced: tuple[Path, dict[str, Any]], replayed: dict[tuple[str, int], tuple[dict[str, Any], Episode]]
) -> None:
    out, _ = balanced
    a, b = (pq.read_table(out / f"{arm}.parquet").to_pylist() for arm in ("A", "B"))
    assert [r["task_id"] for r in a] == [r["task_id"] for r in b]
    shared = ("role", "operator", "mutation", "verified_class", "gold_code", "faulty_code")
    for ra, rb in zip(a, b, strict=True):
        assert {k: ra[k] for k in shared} == {k: rb[k] for k in shared}
        assert ra["protocol"] == "reactive" and rb["protocol"] == "predictive"
        assert ra["messages"][1] == rb["messages"][1]
        # the same code states: each arm's patches write the faulty code (recovery) and then the gold code
        states = []
        for arm, row in (("A", ra), ("B", rb)):
            episode = replayed[(arm, row["task_id"])][1]
            states.append([s.patched_code for s in episode.steps if s.action == "apply_patch" and s.applied])
        assert states[0] == states[1]
        predictions = [parse_prediction(m["content"]) for m in rb["messages"] if m["content"].startswith("<PRED")]
        assert len(predictions) == len(states[1])
        assert not any("<PREDICTION>" in m["content"] for m in ra["messages"])


def test_keep_test_style_uses_arm_a_patches(balanced: tuple[Path, dict[str, Any]]) -> None:
    out, _ = balanced
    row = next(r for r in pq.read_table(out / "A.parquet").to_pylist() if r["role"] == "recovery")
    trace = Trace(row["task_id"], "recovery", row["messages"][1]["content"], "f", row["gold_code"], row["faulty_code"],
                  row["operator"], row["mutation"], row["verified_class"])
    reactive = replies(trace, ProtocolConfig.resolve("reactive"))
    keep_test = replies(trace, ProtocolConfig.resolve("predictive"), "keep_test")
    assert [r for r in keep_test if not r.startswith("<PREDICTION>")] == reactive
    assert keep_test.count("<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>") == 2
    revise = replies(trace, ProtocolConfig.resolve("predictive"), "revise")
    assert f"<PREDICTION>{row['verified_class']}</PREDICTION> <DECISION>REVISE</DECISION>" in revise


def test_full_study_run_is_byte_identical_and_replays(sft: list[dict], tmp_path: Path, verifier: Verifier) -> None:
    """All 212 sft tasks with the paper's counts and the study mix, twice through the CLI: same bytes; and every
    trace of both arms replays with reward 1.0."""
    tasks = tmp_path / "sft.parquet"
    write_rows(sft, MBPP_SCHEMA, tasks)
    config = json.dumps(study_config())
    for name in ("one", "two"):
        assert main(["traces", "--config-json", config, "--tasks-file", str(tasks), "--out-dir", str(tmp_path / name)]) == 0
    for file in ("A.parquet", "B.parquet", "tasks.parquet"):
        assert (tmp_path / "one" / file).read_bytes() == (tmp_path / "two" / file).read_bytes(), file
    by_id = {t["task_id"]: t for t in sft}
    for arm in ("A", "B"):
        rows = pq.read_table(tmp_path / "one" / f"{arm}.parquet").to_pylist()
        assert Counter(r["role"] for r in rows) == {"direct": 142, "recovery": 70}
        mix = Counter(r["verified_class"] for r in rows if r["role"] == "recovery")
        assert mix == {"ASSERTION_FAILURE": 58, "RUNTIME_ERROR": 12}
        for row in rows:
            episode = replay(row, by_id[row["task_id"]], verifier)
            assert reward(episode, by_id[row["task_id"]], verifier) == 1.0


def test_render_refuses_a_trace_whose_class_is_wrong(sft: list[dict], verifier: Verifier) -> None:
    from predict.traces.mutations import normalize
    from predict.traces.render import TraceError

    task = sft[0]
    gold = normalize(task["code"])
    faulty = gold.replace("def ", "def _", 1)  # a NameError in the tests: RUNTIME_ERROR, not ASSERTION_FAILURE
    trace = Trace(task["task_id"], "recovery", task_prompt(task["text"], task["test_list"]), "f", gold, faulty,
                  "wrong_function_name", "test", "ASSERTION_FAILURE")

    def run_tests(code: str) -> Any:
        assert code in {solution_text(gold), solution_text(faulty)}
        return verifier.check(code, task["test_list"], task["test_setup_code"])

    with pytest.raises(TraceError, match="patch outcomes"):
        render(trace, ProtocolConfig.resolve("reactive"), run_tests)


def test_protocol_line_helpers_parse_back() -> None:
    from predict.env.protocol import call_line, final_line, parse_action, parse_args, prediction_line

    line = call_line("apply_patch", {"find": "# Write your function here.", "replace": "def f(x):\n    return 'é'"})
    action = parse_action(line)
    assert action.kind == "call" and action.tool == "apply_patch"
    assert parse_args(action.args_text or "") == {"find": "# Write your function here.", "replace": "def f(x):\n    return 'é'"}
    assert parse_action(final_line("done")).summary == "done"
    p = parse_prediction(prediction_line("TIMEOUT", "REVISE"))
    assert (p.prediction, p.decision, p.valid) == ("TIMEOUT", "REVISE", True)


def test_keep_test_style_gives_arm_b_the_arm_a_patches(sft: list[dict], tmp_path: Path, verifier: Verifier) -> None:
    config = study_config(n_direct=2, n_recovery=4, recovery_style="keep_test")
    run_stage(sft[:8], config, tmp_path, progress=False)
    a, b = (pq.read_table(tmp_path / f"{arm}.parquet").to_pylist() for arm in ("A", "B"))
    by_id = {t["task_id"]: t for t in sft}
    for ra, rb in zip(a, b, strict=True):
        assert rb["recovery_style"] == "keep_test"
        calls = [[m["content"] for m in r["messages"] if m["content"].startswith("CALL ")] for r in (ra, rb)]
        assert calls[0] == calls[1]
        episode = replay(rb, by_id[rb["task_id"]], verifier)
        assert reward(episode, by_id[rb["task_id"]], verifier) == 1.0
        patches = [s for s in episode.steps if s.action == "apply_patch" and s.applied]
        assert all(p.prediction == "PASS" and p.decision == "KEEP" and not p.reverted for p in patches)
        if rb["role"] == "recovery":
            assert patches[0].outcome == rb["verified_class"] and patches[0].outcome_seen


def test_a_starved_check_does_not_change_the_traces(sft: list[dict], verifier: Verifier) -> None:
    """A check that comes back TIMEOUT once because the machine was busy is re-checked; the traces are unchanged."""
    from predict.sandbox import Verdict
    from predict.traces.stage import synthesize

    def honest(items: list) -> list:
        return verifier.check_many(items)

    starved: set[str] = set()

    def busy(items: list) -> list:
        verdicts = verifier.check_many(items)
        for i, (solution, _, _) in enumerate(items):
            if i % 3 == 0 and solution not in starved:  # every third check starves, the first time only
                starved.add(solution)
                verdicts[i] = Verdict(Outcome.TIMEOUT, "killed at 3.0 s", None, 3.0, "", "")
        return verdicts

    kwargs = {"n_direct": 6, "n_recovery": 6, "mix": "study", "seed": 42, "timeout_s": 3.0}
    expected = synthesize(sft[:16], honest, **kwargs)
    got = synthesize(sft[:16], busy, **kwargs)
    assert starved and got.traces == expected.traces and got.tasks == expected.tasks


def test_the_traces_stage_runs_without_the_chat_template_setting(sft: list[dict], tmp_path: Path) -> None:
    """The traces are messages, not token ids: the stage never reads ``model.enable_thinking`` (the chat template
    is the SFT's, which renders them), so its slice leaves it out and the stage still runs, through the typed view
    that refuses any key outside its entry, to the same bytes as from the whole config. Old code: the entry listed
    the key, so the slice held ``model``."""
    from predict.stages import config_slice, slice_file

    config = study_config(n_direct=2, n_recovery=4)
    assert "model" not in config_slice(config, "traces")
    tasks = tmp_path / "sft.parquet"
    write_rows(sft[:8], MBPP_SCHEMA, tasks)
    path = slice_file(config, "traces", tmp_path)
    assert main(["traces", "--config-slice", path, "--tasks-file", str(tasks), "--out-dir", str(tmp_path / "sliced")]) == 0
    run_stage(sft[:8], config, tmp_path / "whole", progress=False)
    for file in ("A.parquet", "B.parquet", "tasks.parquet"):
        assert (tmp_path / "sliced" / file).read_bytes() == (tmp_path / "whole" / file).read_bytes(), file

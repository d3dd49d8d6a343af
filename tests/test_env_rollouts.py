"""Rollouts through the real verifiers v1 stack: make_agent + SubprocessConfig + LocalAgentHarness + the agent
program + the sandbox, against a scripted OpenAI-compatible endpoint.

All scenarios run once per module, concurrently (one `run_rollouts` call, hence one agent and one interception
server, per protocol setting); the tests then assert on the records and on what the endpoint received.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from predict.env.protocol import (
    ERRORS,
    RESULT_PATCH_APPLIED,
    RESULT_PATCH_KEPT,
    RESULT_PATCH_REVERTED,
    STUB,
    ProtocolConfig,
)
from predict.env.records import read_records, write_records
from predict.env.runner import RolloutSettings, default_tokenizer_dir, run_rollouts
from predict.env.seeds import request_seed
from predict.vocabulary import OUTCOMES
from tests.scripted_endpoint import HttpError, ScriptedEndpoint

MBPP_127_MARKER = "Write a function to multiply two integers"

STUB_LINE = "# Write your function here."
ADD = (
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x + y"}'
)
SUB = 'CALL apply_patch {"find": "x + y", "replace": "x - y"}'
MUL_FROM_SUB = 'CALL apply_patch {"find": "x - y", "replace": "x * y"}'
MUL_FROM_ADD = 'CALL apply_patch {"find": "x + y", "replace": "x * y"}'
MUL_FROM_STUB = (
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'
)
TEST = 'CALL python_test {"project_path": "solution.py"}'
READ = 'CALL read_file {"file_path": "solution.py"}'
PASS_KEEP = "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>"
AF_REVISE = "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>REVISE</DECISION>"
FINAL = "FINAL: multiply_int returns x * y; all tests pass."

FAILED_AF = "status: failed\ntests failed (actual: ASSERTION_FAILURE)"
PASSED = "status: success\ntests passed"
READ_STUB = "status: success\n" + STUB

# The study's published mbpp_127 rollout, verbatim.
MBPP_127_SCRIPT = [ADD, PASS_KEEP, TEST, SUB, PASS_KEEP, TEST, MUL_FROM_SUB, PASS_KEEP, TEST, FINAL]

# marker -> (group, script); the case markers come first, the verbatim MBPP text (shared by all) last.
CASES: dict[str, tuple[str, list[str | HttpError]]] = {
    "[case:revise]": ("predictive", [ADD, AF_REVISE, READ, MUL_FROM_STUB, PASS_KEEP, TEST, FINAL]),
    "[case:forced]": ("predictive", [ADD, "<PREDICTION>RUNTIME_ERROR</PREDICTION> <DECISION>KEEP</DECISION>", FINAL]),
    "[case:budget]": ("predictive", [READ] * 7 + [ADD, PASS_KEEP, "FINAL: never asked"]),
    "[case:errors]": (
        "predictive",
        [
            'CALL apply_patch {"find": "def nothing():", "replace": "x"}',
            'CALL apply_patch {"find": "# Write", "replace": ',
            'CALL run_shell {"cmd": "ls"}',
            "I think I should write the function now.",
            'CALL read_file {"file_path": "../../etc/passwd"}',
            FINAL,
        ],
    ),
    "[case:badpred]": ("predictive", [MUL_FROM_STUB, "It will pass, so I keep it.", READ, FINAL]),
    "[case:forced_keep]": (
        "forced_keep",
        [ADD, AF_REVISE, TEST, MUL_FROM_ADD, "garbage instead of a prediction", TEST, FINAL],
    ),
    "[case:budget_neutral]": ("budget_neutral", [ADD, AF_REVISE] * 9 + [MUL_FROM_STUB, PASS_KEEP, TEST, FINAL]),
    "[case:reactive]": ("reactive", [ADD, TEST, MUL_FROM_ADD, TEST, FINAL]),
    "[case:reactive_budget]": ("reactive", [READ] * 8 + ["FINAL: never asked"]),
    "[case:reactive_predline]": ("reactive", [MUL_FROM_STUB, PASS_KEEP, FINAL]),
    "[case:train]": ("train", [ADD, TEST, MUL_FROM_ADD, TEST, FINAL]),
    "[case:refused]": ("reactive", [MUL_FROM_STUB, HttpError(400, "maximum context length is 4096 tokens")]),
    "[case:wrong_model]": ("reactive", [HttpError(404, "The model `scripted-typo` does not exist.")]),
    MBPP_127_MARKER: ("predictive", MBPP_127_SCRIPT),
}

SETTINGS: dict[str, dict[str, Any]] = {
    "predictive": {"protocol": "predictive", "arm": "B"},
    # non-streaming requests from the program, to cover that path too
    "forced_keep": {"protocol": "predictive", "variant": "forced_keep", "arm": "B-forced_keep", "stream": False},
    "budget_neutral": {"protocol": "predictive", "variant": "budget_neutral", "arm": "B-budget_neutral"},
    "reactive": {"protocol": "reactive", "arm": "A"},
    "train": {"protocol": "reactive", "arm": "A", "client": "train", "checkpoint": "train-client"},
}


def case_of(text: str) -> str:
    """The case a prompt belongs to: the first marker it contains, in `CASES` order (as the endpoint picks)."""
    return next(m for m in CASES if m in text)


def mbpp_127(mbpp_path: Path) -> dict[str, Any]:
    for line in mbpp_path.read_text().splitlines():
        row = json.loads(line)
        if row["task_id"] == 127:
            return row
    raise LookupError("task 127 not in mbpp.jsonl")


class CaseRun:
    """The records of one scripted batch per settings group, keyed by case marker, and the endpoint's requests."""

    def __init__(self, cases: Mapping[str, Any], endpoint: ScriptedEndpoint, records: dict[str, dict[str, Any]]) -> None:
        self.cases, self.endpoint, self.records = cases, endpoint, records

    def case_of(self, text: str) -> str:
        return next(m for m in self.cases if m in text)

    def requests(self, marker: str) -> list[dict[str, Any]]:
        return [r for r in self.endpoint.requests if self.case_of(r["first_user"]) == marker]

    def conversation(self, marker: str) -> list[dict[str, Any]]:
        return max((r["messages"] for r in self.requests(marker)), key=len)

    def results(self, marker: str) -> list[str]:
        return [m["content"] for m in self.conversation(marker)[2:] if m["role"] == "user"]


def scripted_case_rollouts(cases: Mapping[str, tuple[str, list[str]]], settings: Mapping[str, Mapping[str, Any]],
                           mbpp_path: Path, home: Path, *, first_task_id: int,
                           tokenizer_json: Path | None = None) -> CaseRun:
    """Task 127 once per case (``cases``: marker -> (settings group, the scripted replies)), rolled out on val through
    the real verifiers stack against a scripted endpoint, one `run_rollouts` batch per group of ``settings``, all
    batches at once; verifiers' workdirs under ``home``."""
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    mp = pytest.MonkeyPatch()
    mp.setattr(vf_subprocess, "CACHE_DIR", home / ".cache" / "verifiers")
    base = mbpp_127(mbpp_path)
    rows: dict[str, list[dict[str, Any]]] = {g: [] for g in settings}
    for i, (marker, (group, _)) in enumerate(cases.items()):
        rows[group].append({**base, "task_id": first_task_id + i, "text": f"{base['text']} {marker}", "split": "val"})
    endpoint = ScriptedEndpoint({m: s for m, (_, s) in cases.items()}, tokenizer_json=tokenizer_json).start()

    async def main() -> list[list[dict[str, Any]]]:
        return await asyncio.gather(*(
            run_rollouts(rows[group], RolloutSettings.of(base_url=endpoint.base_url, model="scripted", **overrides))
            for group, overrides in settings.items()
        ))

    try:
        batches = asyncio.run(main())
    finally:
        endpoint.stop()
        mp.undo()
    run = CaseRun(cases, endpoint, {})
    for group_rows, batch in zip(rows.values(), batches, strict=True):
        for row, rec in zip(group_rows, batch, strict=True):
            run.records[run.case_of(row["text"])] = rec
    return run


class Run:
    """Everything the module's rollouts produced."""

    def __init__(self, endpoint: ScriptedEndpoint, records: dict[str, dict[str, Any]], wall_s: float, home: Path):
        self.endpoint, self.records, self.wall_s, self.home = endpoint, records, wall_s, home
        self.process_records: dict[str, dict[str, Any]] = {}  # the same cases with the program run as a process
        self.process_requests: list[dict[str, Any]] = []  # and the requests the endpoint got from them
        self.in_process_spawned: list[list[str]] = []  # the processes the rollouts' runtimes started (argv)
        self.process_spawned: list[list[str]] = []

    def conversation(self, marker: str) -> list[dict[str, Any]]:
        """The messages of the longest request of that case (= the whole conversation the model saw)."""
        return max((r["messages"] for r in self.requests(marker)), key=len)

    def results(self, marker: str) -> list[str]:
        """The user messages after the task prompt: the environment's answers, in order."""
        return [m["content"] for m in self.conversation(marker)[2:] if m["role"] == "user"]

    def requests(self, marker: str) -> list[dict[str, Any]]:
        return [r for r in self.endpoint.requests if case_of(r["first_user"]) == marker]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, mbpp_path: Path) -> Any:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    home = tmp_path_factory.mktemp("verifiers-home")
    mp = pytest.MonkeyPatch()
    # verifiers fixes $HOME/.cache/verifiers at import; keep the rollout workdirs in a tmp dir instead.
    mp.setattr(vf_subprocess, "CACHE_DIR", home / ".cache" / "verifiers")
    base = mbpp_127(mbpp_path)
    rows_by_group: dict[str, list[dict[str, Any]]] = {g: [] for g in SETTINGS}
    for i, (marker, (group, _)) in enumerate(CASES.items()):
        row = (
            dict(base)
            if marker == MBPP_127_MARKER
            else {**base, "task_id": 9000 + i, "text": f"{base['text']} {marker}"}
        )
        rows_by_group[group].append({**row, "split": "test"})
    tokenizer = Path(default_tokenizer_dir()) / "tokenizer.json"
    endpoint = ScriptedEndpoint({m: s for m, (_, s) in CASES.items()}, tokenizer_json=tokenizer).start()

    spawned: list[list[str]] = []  # every process a rollout's runtime started (argv)
    runtime_run = vf_subprocess.SubprocessRuntime.run

    async def recording_run(self: Any, argv: list[str], env: dict[str, str]) -> Any:
        spawned.append(list(argv))
        return await runtime_run(self, argv, env)

    mp.setattr(vf_subprocess.SubprocessRuntime, "run", recording_run)

    async def main(**mode: Any) -> list[list[dict[str, Any]]]:
        runs = []
        for group, overrides in SETTINGS.items():
            settings = RolloutSettings.of(base_url=endpoint.base_url, model="scripted", seed=7, concurrency=4,
                                          **overrides, **mode)
            runs.append(run_rollouts(rows_by_group[group], settings))
        return await asyncio.gather(*runs)

    t0 = time.time()
    try:
        batches = asyncio.run(main())  # the default: every episode in process
        wall = time.time() - t0
        in_process_spawned, n_requests = list(spawned), len(endpoint.requests)
        process_batches = asyncio.run(main(in_process=False))  # the same episodes, the program as a process
    finally:
        endpoint.stop()
        mp.undo()
    process_requests = endpoint.requests[n_requests:]
    del endpoint.requests[n_requests:]  # the module's tests read the default's requests
    records, process_records = {}, {}
    for group_rows, batch, process_batch in zip(rows_by_group.values(), batches, process_batches, strict=True):
        for row, rec, process_rec in zip(group_rows, batch, process_batch, strict=True):
            marker = case_of(row["text"])
            records[marker], process_records[marker] = rec, process_rec
    n = len(records)
    print(
        f"\n{n} rollouts in {wall:.2f}s wall; per rollout: " + ", ".join(f"{r['wall_s']:.2f}" for r in records.values())
    )
    run = Run(endpoint, records, wall, home)
    run.process_records, run.process_requests = process_records, process_requests
    run.in_process_spawned, run.process_spawned = in_process_spawned, spawned[len(in_process_spawned):]
    return run


def patch_steps(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rec["steps"] if s["action"] == "apply_patch" and s["applied"]]


FAILED_CALLS = ("[case:wrong_model]",)
"""Cases whose model call fails: failed rollouts (test_a_failed_model_call_fails_the_rollout...). ``[case:refused]``
ends on the server's context: ok, with the server's words in ``error``."""


def test_every_rollout_completed_ok(run: Run) -> None:
    for marker, rec in run.records.items():
        assert rec["seed"] == 7 and rec["split"] == "test"
        if marker in FAILED_CALLS:
            continue
        assert rec["ok"], (marker, rec["error"])
        assert rec["error"] is None or rec["stop_reason"] == "context", marker
    # each workdir is removed at teardown
    assert not any((run.home / ".cache" / "verifiers" / "runtimes" / "subprocess").glob("*"))


PER_RUN = ("wall_s", "model_s", "env_s", "program_s", "created_at", "trace_id")  # times and a random id


def test_episodes_run_in_process_and_record_what_the_program_run_as_a_process_records(run: Run) -> None:
    """Issue 41: by default no rollout starts a Python process (the episode runs in a thread of the verifiers host, its
    checks and its grade through the shared sandbox pool); with ``in_process`` off each rollout starts the program
    and the grading check. Every case, the failed model calls included, gives the same record both ways (all but
    its times and trace id): the same steps, outcomes, rewards, errors, seeds and token graphs."""
    assert all(argv == ["true"] for argv in run.in_process_spawned)  # only verifiers' probe after a failed program
    modules = Counter(argv[2] for argv in run.process_spawned if argv[1:2] == ["-m"])
    graded = sum(rec["final_outcome"] is not None for rec in run.process_records.values())
    assert modules == {"predict.env.program": len(CASES), "predict.env.check": graded}, modules
    for marker, rec in run.records.items():
        other = run.process_records[marker]
        differ = sorted(k for k in rec if k not in PER_RUN and rec[k] != other[k])
        assert differ == [], (marker, differ, [(rec[k], other[k]) for k in differ])

    def sent(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:  # what reached the model, in a fixed order
        return sorted(({k: v for k, v in r.items() if k != "t"} for r in requests), key=json.dumps)

    assert sent(run.endpoint.requests) == sent(run.process_requests)


def test_a_cancelled_in_process_episode_ends_before_its_next_model_call() -> None:
    """An in-process episode runs in a thread that a cancelled rollout (its timeout) cannot kill: the harness sets
    the episode's stop event, and the loop ends there, before another model call, with the rollout failed."""
    import threading

    from predict.env.program import run_episode

    stop = threading.Event()

    class Chat:
        seed_key, seeds, calls = None, [], 0

        def __call__(self, messages: list[dict[str, str]]) -> str:
            self.calls += 1
            stop.set()  # the rollout is cancelled while this call is answered
            return READ

    chat = Chat()
    code, episode, result = run_episode(ProtocolConfig("reactive"), lambda _: None, chat, prompt="task", stop=stop)
    assert chat.calls == 1 and code == 1 and len(episode.steps) == 1
    assert (episode.stop_reason, episode.error) == ("error", "the rollout was cancelled")
    assert result["summary"]["stop_reason"] == "error" and result["steps"][0]["action"] == "read_file"


def test_mbpp_127_replayed_verbatim(run: Run) -> None:
    rec = run.records[MBPP_127_MARKER]
    assert run.results(MBPP_127_MARKER) == [
        RESULT_PATCH_APPLIED,
        RESULT_PATCH_KEPT,
        FAILED_AF,
        RESULT_PATCH_APPLIED,
        RESULT_PATCH_KEPT,
        FAILED_AF,
        RESULT_PATCH_APPLIED,
        RESULT_PATCH_KEPT,
        PASSED,
    ]
    conversation = run.conversation(MBPP_127_MARKER)
    assert conversation[0] == {"role": "system", "content": ProtocolConfig("predictive").system_prompt()}
    assert conversation[1]["content"] == (
        "Write a function to multiply two integers without using the * operator in python.\n"
        "Your code should pass these tests:\n\n"
        "assert multiply_int(10,20)==200\nassert multiply_int(5,10)==50\nassert multiply_int(4,8)==32"
    )
    assert [m["content"] for m in conversation if m["role"] == "assistant"] == MBPP_127_SCRIPT[:-1]
    patches = patch_steps(rec)
    assert [p["outcome"] for p in patches] == ["ASSERTION_FAILURE", "ASSERTION_FAILURE", "PASS"]
    assert all(p["outcome_seen"] and p["prediction"] == "PASS" and p["decision"] == "KEEP" for p in patches)
    assert patches[0]["replace"] == "def multiply_int(x, y):\n    return x + y"
    assert (rec["reward"], rec["final_outcome"], rec["final_pass"], rec["stop_reason"]) == (1.0, "PASS", True, "final")
    assert (rec["task_id"], rec["arm"], rec["protocol"], rec["calls_used"], rec["n_model_calls"]) == (
        127,
        "B",
        "predictive",
        6,
        10,
    )
    assert (rec["first_patch_outcome"], rec["recovered"], rec["ever_revised"]) == ("ASSERTION_FAILURE", True, False)
    assert rec["final_solution"] == "def multiply_int(x, y):\n    return x * y\n"
    assert rec["tokens"] is None  # eval client: no token ids


def test_revise_runs_a_hidden_shadow_and_reverts(run: Run) -> None:
    marker = "[case:revise]"
    rec, results = run.records[marker], run.results(marker)
    assert results == [
        RESULT_PATCH_APPLIED,
        RESULT_PATCH_REVERTED,
        READ_STUB,
        RESULT_PATCH_APPLIED,
        RESULT_PATCH_KEPT,
        PASSED,
    ]
    assert not any(cls in results[1] for cls in OUTCOMES)  # the message after REVISE says nothing of the outcome
    assert not any("ASSERTION_FAILURE" in r for r in results)  # ... and nothing later does either
    first, second = patch_steps(rec)
    assert (first["outcome"], first["outcome_seen"], first["reverted"], first["decision"]) == (
        "ASSERTION_FAILURE",
        False,
        True,
        "REVISE",
    )
    assert (second["outcome"], second["outcome_seen"], second["reverted"]) == ("PASS", True, False)
    assert (rec["n_revised"], rec["ever_revised"], rec["calls_used"], rec["reward"]) == (1, True, 4, 1.0)


def test_non_pass_prediction_forces_revise(run: Run) -> None:
    rec = run.records["[case:forced]"]
    (patch,) = patch_steps(rec)
    assert (patch["prediction"], patch["decision_sampled"], patch["decision"], patch["forced"]) == (
        "RUNTIME_ERROR",
        "KEEP",
        "REVISE",
        True,
    )
    assert run.results("[case:forced]") == [RESULT_PATCH_APPLIED, RESULT_PATCH_REVERTED]
    assert (rec["final_solution"], rec["final_outcome"], rec["reward"], rec["n_forced"]) == (
        STUB,
        "RUNTIME_ERROR",
        0.0,
        1,
    )
    assert rec["recovered"] is False


def test_budget_exhaustion_stops_model_calls_after_the_pending_prediction(run: Run) -> None:
    marker = "[case:budget]"
    rec = run.records[marker]
    assert len(run.requests(marker)) == 9  # 8 tool calls + the last patch's prediction, no FINAL asked
    assert (rec["stop_reason"], rec["budget_exhausted"], rec["calls_used"], rec["n_model_calls"]) == (
        "budget",
        True,
        8,
        9,
    )
    (patch,) = patch_steps(rec)
    assert (patch["prediction"], patch["decision"], patch["outcome"], patch["outcome_seen"]) == (
        "PASS",
        "KEEP",
        "ASSERTION_FAILURE",
        False,
    )
    assert rec["steps"][-1]["action"] == "prediction" and not rec["steps"][-1]["result_sent"]
    assert (rec["final_outcome"], rec["reward"]) == ("ASSERTION_FAILURE", 0.0)


def test_malformed_actions_get_errors_and_never_crash(run: Run) -> None:
    marker = "[case:errors]"
    rec, results = run.records[marker], run.results(marker)
    kinds = ["find_not_found", "malformed_json", "unknown_tool", "no_action", "path_outside_workdir"]
    assert [s["error"] for s in rec["steps"][:5]] == kinds
    assert all(r.startswith("status: error\n") for r in results) and len(results) == 5
    assert "was not found" in results[0] and "malformed JSON" in results[1] and "run_shell" in results[2]
    assert "no action line" in results[3] and "outside the workdir" in results[4]
    assert (rec["calls_used"], rec["n_errors"], rec["stop_reason"], rec["reward"]) == (5, 5, "final", 0.0)


def test_malformed_prediction_is_recorded_and_reverts(run: Run) -> None:
    marker = "[case:badpred]"
    rec, results = run.records[marker], run.results(marker)
    assert results == [
        RESULT_PATCH_APPLIED,
        "status: error\n" + ERRORS["malformed_prediction"].format(fate="reverted"),
        READ_STUB,
    ]
    (patch,) = patch_steps(rec)
    assert (patch["prediction"], patch["decision"], patch["reverted"], patch["outcome"], patch["outcome_seen"]) == (
        "MALFORMED",
        "REVISE",
        True,
        "PASS",
        False,
    )
    assert rec["steps"][1]["reply"] == "It will pass, so I keep it."
    assert (rec["n_malformed_predictions"], rec["reward"]) == (1, 0.0)


def test_forced_keep_variant(run: Run) -> None:
    marker = "[case:forced_keep]"
    rec, results = run.records[marker], run.results(marker)
    assert results == [
        RESULT_PATCH_APPLIED,
        RESULT_PATCH_KEPT,
        FAILED_AF,
        RESULT_PATCH_APPLIED,
        "status: error\n" + ERRORS["malformed_prediction"].format(fate="kept"),
        PASSED,
    ]
    first, second = patch_steps(rec)
    assert (first["decision_sampled"], first["decision"], first["forced"], first["reverted"]) == (
        "REVISE",
        "KEEP",
        True,
        False,
    )
    assert (second["prediction"], second["decision"], second["reverted"]) == ("MALFORMED", "KEEP", False)
    assert (rec["variant"], rec["ever_revised"], rec["reward"]) == ("forced_keep", False, 1.0)
    system = run.conversation(marker)[0]["content"]
    assert system == ProtocolConfig("predictive", "forced_keep").system_prompt()


def test_budget_neutral_variant_revise_is_free(run: Run) -> None:
    rec = run.records["[case:budget_neutral]"]
    assert (rec["n_revised"], rec["calls_used"], rec["budget_exhausted"], rec["revise_costs_call"]) == (
        9,
        2,
        False,
        False,
    )
    assert (rec["n_model_calls"], rec["stop_reason"], rec["reward"]) == (22, "final", 1.0)
    assert all(p["outcome"] == "ASSERTION_FAILURE" and not p["outcome_seen"] for p in patch_steps(rec)[:9])


def test_reactive_protocol(run: Run) -> None:
    marker = "[case:reactive]"
    rec = run.records[marker]
    assert run.results(marker) == [RESULT_PATCH_APPLIED, FAILED_AF, RESULT_PATCH_APPLIED, PASSED]
    assert run.conversation(marker)[0]["content"] == ProtocolConfig("reactive").system_prompt()
    assert [p["outcome"] for p in patch_steps(rec)] == ["ASSERTION_FAILURE", "PASS"]
    assert all(p["prediction"] is None for p in patch_steps(rec))
    assert (rec["protocol"], rec["arm"], rec["reward"], rec["n_predictions"]) == ("reactive", "A", 1.0, 0)


def test_reactive_budget_exhaustion(run: Run) -> None:
    marker = "[case:reactive_budget]"
    rec = run.records[marker]
    assert len(run.requests(marker)) == 8
    assert (rec["stop_reason"], rec["budget_exhausted"], rec["calls_used"], rec["reward"]) == ("budget", True, 8, 0.0)


def test_reactive_prediction_line_is_not_an_action(run: Run) -> None:
    rec = run.records["[case:reactive_predline]"]
    assert rec["steps"][1]["error"] == "no_action"
    (patch,) = patch_steps(rec)
    assert (patch["outcome"], patch["outcome_seen"], rec["reward"]) == ("PASS", False, 1.0)


def test_train_client_records_token_ids_masks_and_logprobs(run: Run) -> None:
    rec = run.records["[case:train]"]
    assert run.requests("[case:train]")[0]["path"] == "/inference/v1/generate"
    assert rec["reward"] == 1.0 and rec["client"] == "train"
    nodes = rec["tokens"]
    sampled = [n for n in nodes if n["sampled"]]
    assert len(sampled) == rec["n_model_calls"] == 5
    for n in sampled:
        assert n["role"] == "assistant" and len(n["mask"]) == len(n["token_ids"]) and any(n["mask"])
        assert len(n["logprobs"]) == sum(n["mask"])
    assert not any(any(n["mask"]) for n in nodes if not n["sampled"])


def test_a_failed_model_call_fails_the_rollout_and_an_overlong_conversation_ends_graded(run: Run) -> None:
    """A call the endpoint refuses for a model name it does not serve (404) is the infrastructure's failure, not the
    policy's: verifiers records the rollout as failed with the endpoint's error, and no reward. A prompt the server
    refuses as longer than its context ends the episode on the conversation's own length (stop_reason "context"),
    graded on the solution it has (protocol.py's Context rule; before: a failed rollout, left out of every figure)."""
    refused, wrong_model = run.records["[case:refused]"], run.records["[case:wrong_model]"]
    assert (refused["stop_reason"], refused["n_model_calls"], refused["calls_used"]) == ("context", 1, 1)
    assert (refused["ok"], refused["reward"], refused["final_outcome"]) == (True, 1.0, "PASS")
    assert "maximum context length" in refused["error"]
    (patch,) = patch_steps(refused)  # the episode up to the refused call is on the record
    assert (patch["outcome"], patch["outcome_seen"]) == ("PASS", False)
    assert (wrong_model["ok"], wrong_model["reward"], wrong_model["stop_reason"]) == (False, None, "error")
    assert wrong_model["n_model_calls"] == 0 and "404" in wrong_model["error"]


def test_sampling_settings_reach_the_endpoint(run: Run) -> None:
    assert run.requests("[case:reactive]")[0]["sampling"] == {"temperature": 1.0, "max_tokens": 512}
    params = run.requests("[case:train]")[0]["sampling_params"]
    assert (params["temperature"], params["max_tokens"]) == (1.0, 512)


def test_program_streams_unless_told_not_to(run: Run) -> None:
    assert all(r["stream"] for r in run.requests("[case:reactive]"))
    assert not any(r["stream"] for r in run.requests("[case:forced_keep]"))


def test_taskset_loads_a_split_parquet(tmp_path: Path, mbpp_path: Path) -> None:
    from predict.data import MBPP_SCHEMA
    from predict.env.taskset import MbppTaskset, MbppTasksetConfig
    from predict.outputs import write_rows

    row = mbpp_127(mbpp_path)
    write_rows([{k: row[k] for k in MBPP_SCHEMA.names}], MBPP_SCHEMA, tmp_path / "rl.parquet")
    (task,) = list(MbppTaskset(MbppTasksetConfig(path=str(tmp_path / "rl.parquet"))))
    assert (task.data.task_id, task.data.split, task.data.idx, task.key) == (127, "rl", 0, "mbpp-127-0")
    assert task.data.prompt.startswith(row["text"] + "\nYour code should pass these tests:\n\nassert multiply_int")
    (from_rows,) = list(MbppTaskset.from_rows([{**row, "split": "sft", "sample": 3}]))
    assert (from_rows.data.split, from_rows.data.sample, from_rows.key) == ("sft", 3, "mbpp-127-3")


def test_records_write_and_read_back(run: Run, tmp_path: Path) -> None:
    rows = list(run.records.values())
    back = read_records(write_records(rows, tmp_path / "rollouts.parquet"))
    assert [r["rollout_key"] for r in back] == [r["rollout_key"] for r in rows]
    train = next(r for r in back if r["client"] == "train")
    assert train["tokens"] and train["tokens"][-1]["token_ids"]
    assert back[0]["steps"] == rows[0]["steps"]


def test_study_figures_are_computable_from_the_written_columns(run: Run, tmp_path: Path) -> None:
    """The writeup's numbers for Arm B, recomputed from the parquet alone (no trace, no in-memory state)."""
    arm_b = [r for r in run.records.values() if r["arm"] == "B"]
    rows = read_records(write_records(arm_b, tmp_path / "arm_b.parquet"))

    def pass_rate(group: list[dict[str, Any]]) -> float:
        return sum(r["final_pass"] for r in group) / len(group)

    # pass rate of rollouts that never revised vs. those that revised
    never = [r for r in rows if not r["ever_revised"]]
    revised = [r for r in rows if r["ever_revised"]]
    assert (len(never), pass_rate(never)) == (3, 1 / 3)  # budget, errors, mbpp_127 (solved)
    assert (len(revised), pass_rate(revised)) == (3, 1 / 3)  # revise (solved), forced, badpred

    # per patch: prediction vs. verified outcome (confusion matrix), and seen vs. shadow
    patches = [s for r in rows for s in r["steps"] if s["action"] == "apply_patch" and s["applied"]]
    confusion = Counter((s["prediction"], s["outcome"]) for s in patches)
    assert confusion == Counter({
        ("PASS", "ASSERTION_FAILURE"): 3,  # mbpp_127's first two patches, budget's only patch
        ("PASS", "PASS"): 2,  # mbpp_127's last patch, revise's second patch
        ("ASSERTION_FAILURE", "ASSERTION_FAILURE"): 1,  # revise's first patch
        ("RUNTIME_ERROR", "ASSERTION_FAILURE"): 1,  # forced
        ("MALFORMED", "PASS"): 1,  # badpred
    })
    assert sum(p == o for (p, o), n in confusion.items() for _ in range(n)) / len(patches) == 3 / 8
    assert Counter(s["outcome_seen"] for s in patches) == Counter({True: 4, False: 4})

    # recovery: first patch failed, final passed
    recoverable = [r["recovered"] for r in rows if r["recovered"] is not None]
    assert (len(recoverable), sum(recoverable)) == (4, 2)


def test_every_model_call_carries_the_seed_derived_from_its_rollout_and_call(run: Run) -> None:
    for marker in ("[case:reactive]", "[case:train]"):
        rec = run.records[marker]
        assert rec["request_seed_key"] == rec["rollout_key"]
        expected = [request_seed(rec["rollout_key"], call) for call in range(rec["n_model_calls"])]
        assert rec["request_seeds"] == expected and len(set(expected)) == len(expected)
        requests = run.requests(marker)
        sent = [r["seed"] for r in requests] if marker != "[case:train]" else [
            r["sampling_params"].get("seed") for r in requests
        ]
        assert sent == expected, marker  # the train client's generate requests too, not only relayed chat
    all_seeds = [s for rec in run.records.values() for s in rec["request_seeds"]]
    assert len(set(all_seeds)) == len(all_seeds)  # no two rollouts (or calls) share a seed

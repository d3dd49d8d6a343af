"""Arm B's prediction points on prime-rl: program steps <-> sampled tokens <-> verified labels (pure, no prime-rl)."""

from __future__ import annotations

import pytest

from predict.env.records import build_record
from predict.train.prime_rl.points import (
    PointsMismatch,
    completions,
    node_paths,
    prediction_points,
    prediction_targets,
)
from tests.prime_rl_fixtures import VERIFIED, episode_result, trace_nodes

META = {
    "arm": "B",
    "seed": 42,
    "checkpoint": "sft",
    "protocol": "predictive",
    "variant": "none",
    "model": "m",
    "client": "train",
    "budget": 8,
    "revise_costs_call": True,
}


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]  # one token per character: spans are easy to check by decoding


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def record_and_info() -> tuple[dict, dict]:
    result = episode_result()
    record = build_record(
        meta=META,
        task={"task_id": 7, "split": "rl"},
        agent_result=result,
        final_verdict={"outcome": "PASS"},
        reward=1.0,
        ok=True,
        error=None,
        wall_s=1.0,
        tokens=trace_nodes(result, encode),
    )
    # What the orchestrator reads: the trace's info carries the program's result (records keep its steps).
    return record, {"agent_result": {"steps": record["steps"]}}


def test_prediction_points_carry_the_verified_class_of_their_patch() -> None:
    record, info = record_and_info()
    points = prediction_points(info)
    assert {p.call: p.verified for p in points} == VERIFIED
    assert [p.predicted for p in points] == ["PASS", "ASSERTION_FAILURE", "PASS"]
    assert [p.seen for p in points] == [False, False, True]  # shadow, shadow (reverted), shown by python_test
    steps = record["steps"]
    assert all(steps[p.patch_step]["action"] == "apply_patch" for p in points)


def test_targets_locate_each_prediction_reply_in_the_sample() -> None:
    record, info = record_and_info()
    nodes = record["tokens"]
    paths = node_paths(nodes)
    assert paths == [list(range(len(nodes)))]  # a linear trace: one branch, one sample
    sample_ids = [t for n in nodes for t in n["token_ids"]]
    sample_mask = [m for n in nodes for m in n["mask"]]
    targets = prediction_targets(info, nodes, paths, [sample_mask])
    assert [(t.point.call, t.point.verified) for t in targets] == sorted(VERIFIED.items())
    for t in targets:
        c = t.completion
        assert c.sample == 0
        assert decode(sample_ids[c.start : c.end]) == record["steps"][t.point.call]["reply"]
        assert all(sample_mask[c.start : c.end]) and not sample_mask[c.start - 1]


def test_a_cut_off_prediction_has_no_verified_label() -> None:
    # The model-call cap ends the episode right after the prediction reply: the patch is shadow-run at the end, so
    # its outcome is still known; a prediction whose patch has no outcome yields verified=None.
    info = {
        "agent_result": {
            "steps": [
                {"index": 0, "action": "apply_patch", "outcome": None, "reply": "x"},
                {"index": 1, "action": "prediction", "patch_step": 0, "prediction": "PASS", "reply": "y"},
            ]
        }
    }
    (point,) = prediction_points(info)
    assert point.verified is None and point.call == 1


def test_calls_and_steps_that_do_not_line_up_raise() -> None:
    record, info = record_and_info()
    nodes = record["tokens"]
    short = {"agent_result": {"steps": record["steps"][:-1]}}
    mask = [m for n in nodes for m in n["mask"]]
    with pytest.raises(PointsMismatch, match="sampled model calls"):
        prediction_targets(short, nodes, node_paths(nodes), [mask])
    with pytest.raises(PointsMismatch, match="tokens"):
        completions(nodes, node_paths(nodes)[0], mask[:-1])


def test_a_forked_trace_trains_a_shared_call_only_in_its_first_branch() -> None:
    # Two branches share the prompt and the first call; prime-rl masks the shared call in the second branch.
    nodes = [
        {"parent": None, "sampled": False, "token_ids": [1, 2], "mask": [False, False]},
        {"parent": 0, "sampled": True, "token_ids": [3, 4], "mask": [False, True]},  # call 0
        {"parent": 1, "sampled": True, "token_ids": [5, 6], "mask": [False, True]},  # call 1, branch 0
        {"parent": 1, "sampled": True, "token_ids": [7, 8], "mask": [False, True]},  # call 2, branch 1
    ]
    paths = node_paths(nodes)
    assert paths == [[0, 1, 2], [0, 1, 3]]
    first = completions(nodes, paths[0], [False, False, False, True, False, True], sample=0)
    second = completions(nodes, paths[1], [False, False, False, False, False, True], sample=1)
    assert [(c.call, c.start, c.end) for c in first] == [(0, 3, 4), (1, 5, 6)]
    assert [(c.call, c.start, c.end) for c in second] == [(2, 5, 6)]

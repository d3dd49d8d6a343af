"""RL and CE samples from hand-built token graphs (real Qwen3 tokenizer, no model, no server).

The graphs follow the train client's layout: a prompt node, then per model call a sampled assistant node holding the
generation-prompt scaffold (mask False) followed by the sampled tokens (mask True), then the next user node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from predict.env.protocol import find_prediction_line, parse_prediction
from predict.train.from_rollouts import (
    SampleCounts,
    SampleSettings,
    build_samples,
    group_advantages,
    merge_calls,
    rollout_calls,
    rollout_samples,
)
from predict.train.labels import (
    ce_sample,
    decision_token_span,
    find_label,
    label_token_span,
    prediction_ce_sample,
)

SCAFFOLD = "<|im_start|>assistant\n"
PATCH = (
    'CALL apply_patch {"find": "# Write your function here.\\n", "replace": "def f(x):\\n    return x\\n"}<|im_end|>'
)
PREDICT_FAIL = "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>REVISE</DECISION><|im_end|>"
FINAL = "FINAL: done<|im_end|>"


@pytest.fixture(scope="module")
def tok() -> Any:
    from tokenizers import Tokenizer

    from predict.env.runner import default_tokenizer_dir

    return Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))


def enc(tok: Any, text: str) -> list[int]:
    return tok.encode(text).ids


def dec(tok: Any, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


class Graph:
    """Builds a `tokens` column: nodes with parent, role, sampled, token_ids, mask, logprobs."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.nodes = tok, []
        self.add(None, "user", "<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\nTask 7<|im_end|>\n")

    def add(self, parent: int | None, role: str, text: str) -> int:
        ids = enc(self.tok, text)
        self.nodes.append(
            {
                "parent": parent,
                "role": role,
                "sampled": False,
                "token_ids": ids,
                "mask": [False] * len(ids),
                "logprobs": [],
            }
        )
        return len(self.nodes) - 1

    def call(self, parent: int, completion: str, scaffold: str = SCAFFOLD) -> int:
        head, ids = enc(self.tok, scaffold), enc(self.tok, completion)
        n = len(self.nodes)
        self.nodes.append(
            {
                "parent": parent,
                "role": "assistant",
                "sampled": True,
                "token_ids": head + ids,
                "mask": [False] * len(head) + [True] * len(ids),
                "logprobs": [-0.01 * (n + 1) - 0.001 * k for k in range(len(ids))],
            }
        )
        return n


def revised_shadow_rollout(tok: Any, prediction: str = PREDICT_FAIL, reward: float = 1.0, **kw: Any) -> dict:
    """Arm B: patch -> prediction ASSERTION_FAILURE (forced REVISE, reverted) -> FINAL. The patched code actually
    PASSes, which only the hidden shadow execution saw (outcome_seen False)."""
    g = Graph(tok)
    c0 = g.call(0, PATCH)
    u1 = g.add(c0, "user", "\n<|im_start|>user\nstatus: success\npatch applied<|im_end|>\n")
    c1 = g.call(u1, prediction)
    u2 = g.add(c1, "user", "\n<|im_start|>user\nstatus: success\npatch reverted<|im_end|>\n")
    g.call(u2, FINAL)
    steps = [
        {
            "index": 0,
            "action": "apply_patch",
            "applied": True,
            "outcome": "PASS",
            "outcome_seen": False,
            "reverted": True,
            "prediction": "ASSERTION_FAILURE",
            "decision": "REVISE",
            "prediction_step": 1,
        },
        {"index": 1, "action": "prediction", "patch_step": 0, "prediction": "ASSERTION_FAILURE", "decision": "REVISE"},
        {"index": 2, "action": "final"},
    ]
    return {
        "rollout_key": "B|42|sft|7|0",
        "task_id": 7,
        "reward": reward,
        "ok": True,
        "steps": steps,
        "tokens": g.nodes,
        **kw,
    }


def sampled_positions(sample: Any) -> list[int]:
    return [t for t, w in enumerate(sample.rl_weights) if w > 0]


# -- labels ---------------------------------------------------------------------------------------------------------
def test_label_span_covers_exactly_the_class_tokens(tok: Any) -> None:
    ids = enc(tok, "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION><|im_end|>")
    start, end = label_token_span(ids, tok)
    assert dec(tok, ids[start:end]) == ">PASS"  # Qwen3 pre-tokenises ">PASS": the ">" belongs to the label
    assert find_label(ids, tok).lead == "" and dec(tok, ids[:start]) == "<PREDICTION"
    ids = enc(tok, "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>KEEP</DECISION>")
    start, end = label_token_span(ids, tok)
    assert dec(tok, ids[start:end]) == ">ASSERTION_FAILURE" and dec(tok, [ids[start]]) == ">"
    d0, d1 = decision_token_span(ids, tok)
    assert "KEEP" in dec(tok, ids[d0:d1]) and "PREDICTION" not in dec(tok, ids[d0:d1])


def test_label_inside_thinking_is_not_the_label(tok: Any) -> None:
    text = "<think><PREDICTION>PASS</PREDICTION></think>\n<prediction> timeout </prediction> <DECISION>KEEP</DECISION>"
    ids = enc(tok, text)
    start, end = label_token_span(ids, tok)
    assert dec(tok, ids[start:end]) == "> timeout"


def test_label_is_the_prediction_the_protocol_acts_on(tok: Any) -> None:
    """A lone PREDICTION pair before the prediction line is not the label (issue 16 item 6): the protocol acts on
    TIMEOUT, so the label mask and the CE sample sit on TIMEOUT, not PASS."""
    text = "Sure. <PREDICTION>PASS</PREDICTION>\n<PREDICTION>TIMEOUT</PREDICTION> <DECISION>REVISE</DECISION>"
    assert parse_prediction(text).prediction == "TIMEOUT"
    ids = enc(tok, text)
    span = find_label(ids, tok)
    assert span.value == "TIMEOUT" and dec(tok, ids[span.start : span.end]) == ">TIMEOUT"
    d0, d1 = decision_token_span(ids, tok)
    assert dec(tok, ids[d0:d1]) == ">REVISE"
    prompt = enc(tok, "<|im_start|>assistant\n")
    ce = prediction_ce_sample(prompt, ids, "PASS", 0.5, tok)
    assert dec(tok, ce.token_ids) == "<|im_start|>assistant\n" + text.split(">TIMEOUT")[0] + ">PASS</PREDICTION>"


@pytest.mark.parametrize(
    "text",
    [
        "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",
        "<think><PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION></think>x <prediction> timeout </prediction>"
        "\n<DECISION>revise</DECISION>",
        "<PREDICTION>PASS</PREDICTION><think>no</think> <DECISION>KEEP</DECISION> <PREDICTION>OTHER</PREDICTION>",
        "<PREDICTION>PASS</PREDICTION> and <PREDICTION>MAYBE</PREDICTION> <DECISION>KEEP</DECISION>",
    ],
)
def test_located_prediction_line_is_the_parsed_one(text: str) -> None:
    line = find_prediction_line(text)
    parsed = parse_prediction(text)
    a, b = line.prediction_span
    assert text[a] == ">" and text[a + 1 : b].strip() == line.prediction
    assert line.prediction.strip().upper() == parsed.prediction or parsed.prediction == "MALFORMED"
    c, d = line.decision_span
    assert text[c + 1 : d].strip().upper() == parsed.decision


def test_label_after_multibyte_text(tok: Any) -> None:
    ids = enc(tok, "é漢字 <PREDICTION>RUNTIME_ERROR</PREDICTION> <DECISION>REVISE</DECISION>")
    start, end = label_token_span(ids, tok)
    assert dec(tok, ids[start:end]) == ">RUNTIME_ERROR"


def test_ce_sample_is_prefix_then_verified_label_with_alpha_on_the_label(tok: Any) -> None:
    prefix = enc(tok, "<|im_start|>assistant\n<PREDICTION")
    s = ce_sample(prefix, "SYNTAX_ERROR", 0.5, tok, task_id=3, source="x")
    assert s.kind == "ce" and s.token_ids[: len(prefix)] == prefix
    assert dec(tok, s.token_ids[len(prefix) :]) == ">SYNTAX_ERROR</PREDICTION>"
    weighted = [t for t, w in zip(s.token_ids, s.ce_weights, strict=True) if w]
    assert dec(tok, weighted) == ">SYNTAX_ERROR"
    assert set(s.ce_weights) == {0.0, 0.5} and not any(s.rl_weights) and s.mask == [w > 0 for w in s.ce_weights]
    # the ids are the policy tokenizer's own rendering of the text
    assert s.token_ids == prefix + enc(tok, ">SYNTAX_ERROR</PREDICTION>")
    with pytest.raises(ValueError, match="alpha"):
        ce_sample(prefix, "PASS", 0.0, tok)
    with pytest.raises(ValueError, match="verified label"):
        ce_sample(prefix, "MALFORMED", 1.0, tok)


# -- RL samples from the graph ------------------------------------------------------------------------------------
def test_one_path_merges_into_one_rl_sample_with_loss_on_sampled_tokens_only(tok: Any) -> None:
    rec = revised_shadow_rollout(tok)
    calls = rollout_calls(rec["tokens"])
    assert len(calls) == 3 and len(merge_calls(calls)) == 1
    (rl,) = rollout_samples(rec, 0.75, tok, SampleSettings(predictive=False))
    full = [t for n in rec["tokens"] for t in n["token_ids"]]
    assert rl.token_ids == full and rl.kind == "rl"
    sampled = [t for c in calls for t in c.positions]
    assert sampled_positions(rl) == sampled and rl.mask == [w > 0 for w in rl.rl_weights]
    assert {rl.advantages[t] for t in sampled} == {0.75}
    assert [rl.logprobs[t] for t in sampled] == [lp for c in calls for lp in c.logprobs]
    assert dec(tok, [rl.token_ids[t] for t in sampled]) == PATCH + PREDICT_FAIL + FINAL


def test_revised_patch_with_shadow_label(tok: Any) -> None:
    """Arm B: the sampled (wrong) label gets no RL credit; the CE sample teaches the shadow-verified PASS."""
    rec = revised_shadow_rollout(tok)
    counts = SampleCounts()
    rl, ce = rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True, alpha=0.25), counts)
    calls = rollout_calls(rec["tokens"])
    start, end = label_token_span(calls[1].completion_ids, tok)
    label_pos = calls[1].positions[start:end]
    assert dec(tok, [rl.token_ids[t] for t in label_pos]) == ">ASSERTION_FAILURE"
    assert all(rl.rl_weights[t] == 0.0 and not rl.mask[t] for t in label_pos)
    others = [t for c in calls for t in c.positions if t not in label_pos]
    assert all(rl.rl_weights[t] == 1.0 for t in others)  # DECISION keeps its credit by default
    assert ce.kind == "ce" and "shadow" in ce.source
    assert ce.token_ids[: label_pos[0]] == rl.token_ids[: label_pos[0]]  # exactly the prefix the model saw
    weighted = [t for t, w in zip(ce.token_ids, ce.ce_weights, strict=True) if w]
    assert dec(tok, weighted) == ">PASS" and set(ce.ce_weights) == {0.0, 0.25}
    assert dec(tok, ce.token_ids[label_pos[0] :]) == ">PASS</PREDICTION>"
    assert (counts.prediction_points, counts.masked_labels, counts.ce_samples) == (1, 1, 1)


def test_mask_decision_switch(tok: Any) -> None:
    rec = revised_shadow_rollout(tok)
    calls = rollout_calls(rec["tokens"])
    d0, d1 = decision_token_span(calls[1].completion_ids, tok)
    dpos = calls[1].positions[d0:d1]
    (keep,) = rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True))
    (masked,) = rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True, mask_decision=True))
    assert all(keep.rl_weights[t] == 1.0 for t in dpos) and all(masked.rl_weights[t] == 0.0 for t in dpos)
    assert masked.n_rl_tokens == keep.n_rl_tokens - len(dpos)


def test_malformed_prediction_without_tags_keeps_rl_credit_and_has_no_ce(tok: Any) -> None:
    rec = revised_shadow_rollout(tok, prediction="I think it passes.<|im_end|>")
    counts = SampleCounts()
    (rl,) = rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True, alpha=1.0), counts)
    calls = rollout_calls(rec["tokens"])
    assert sampled_positions(rl) == [t for c in calls for t in c.positions]
    assert (counts.malformed_no_label, counts.ce_samples) == (1, 0)


def test_malformed_class_inside_tags_is_masked_and_gets_the_verified_label(tok: Any) -> None:
    rec = revised_shadow_rollout(tok, prediction="<PREDICTION>MAYBE</PREDICTION><|im_end|>")  # no DECISION either
    rl, ce = rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True, alpha=1.0))
    calls = rollout_calls(rec["tokens"])
    start, end = label_token_span(calls[1].completion_ids, tok)
    assert all(rl.rl_weights[t] == 0.0 for t in calls[1].positions[start:end])
    assert dec(tok, [t for t, w in zip(ce.token_ids, ce.ce_weights, strict=True) if w]) == ">PASS"


def test_empty_label_is_masked_and_gets_a_ce_sample(tok: Any) -> None:
    completion = enc(tok, "<PREDICTION></PREDICTION> <DECISION>KEEP</DECISION>")
    start, end = label_token_span(completion, tok)
    assert dec(tok, completion[start:end]) == "></"  # the token holding the ">"
    s = prediction_ce_sample([1, 2], completion, "TIMEOUT", 1.0, tok)
    assert dec(tok, s.token_ids[2:]) == "<PREDICTION>TIMEOUT</PREDICTION>"


def test_rerendered_turn_splits_calls_into_separate_samples(tok: Any) -> None:
    """The next prompt re-renders the first reply differently (a leading space dropped): no merge across it."""
    g = Graph(tok)
    c0 = g.call(0, ' CALL read_file {"file_path": "solution.py"}<|im_end|>')
    rerender = g.add(0, "assistant", SCAFFOLD + 'CALL read_file {"file_path": "solution.py"}<|im_end|>')
    u1 = g.add(rerender, "user", "\n<|im_start|>user\n# Write your function here.<|im_end|>\n")
    c1 = g.call(u1, FINAL)
    rec = {
        "rollout_key": "A|42|sft|7|1",
        "task_id": 7,
        "reward": 0.0,
        "ok": True,
        "tokens": g.nodes,
        "steps": [{"index": 0, "action": "read_file"}, {"index": 1, "action": "final"}],
    }
    samples = rollout_samples(rec, -0.5, tok, SampleSettings())
    assert len(samples) == 2
    first, second = samples
    calls = rollout_calls(g.nodes)
    assert first.token_ids == calls[0].full_ids and second.token_ids == calls[1].full_ids
    assert sampled_positions(first) == calls[0].positions and sampled_positions(second) == calls[1].positions
    assert first.source == f"calls {c0}" and second.source == f"calls {c1}"


def test_unaligned_rollout_yields_nothing(tok: Any) -> None:
    rec = revised_shadow_rollout(tok)
    rec["steps"] = rec["steps"][:2]
    counts = SampleCounts()
    assert rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True, alpha=1.0), counts) == []
    assert counts.unaligned == 1


# -- advantages and the step batch --------------------------------------------------------------------------------
def test_group_advantages() -> None:
    assert group_advantages([1.0, 0.0]) == pytest.approx([1.0, -1.0], abs=1e-5)
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = group_advantages([1.0, None, 0.0, 0.0])
    assert a[1] is None and a[0] == pytest.approx(2**0.5, abs=1e-4)
    assert sum(x for x in a if x is not None) == pytest.approx(0.0, abs=1e-9)


def test_build_samples_groups_by_task_and_skips_failures(tok: Any) -> None:
    recs = [
        revised_shadow_rollout(tok, reward=1.0),
        revised_shadow_rollout(tok, reward=0.0),
        revised_shadow_rollout(tok, reward=None, ok=False),
        revised_shadow_rollout(tok, reward=1.0, task_id=8),
    ]
    samples, counts, adv = build_samples(
        recs, tok, SampleSettings(predictive=True, alpha=1.0, skip_zero_advantage=True)
    )
    assert adv[0] == pytest.approx(1.0, abs=1e-5) and adv[1] == pytest.approx(-1.0, abs=1e-5)
    assert adv[2] is None and adv[3] == 0.0
    assert counts.no_reward == 1 and counts.zero_advantage_skipped == 1
    kinds = [s.kind for s in samples]
    assert kinds.count("rl") == 2 and kinds.count("ce") == 3  # the zero-advantage rollout keeps its CE sample

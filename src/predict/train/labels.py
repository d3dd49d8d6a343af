"""Arm B's prediction labels at the token level: where the sampled label sits, and the CE-only sample.

Pure functions over token ids and a tokenizer; no torch, no I/O, so every backend (the local RL trainer and the
prime-rl plugin) imports this one module.

`tokenizer` is anything with ``decode(ids)`` and ``encode(text)``: a ``transformers`` tokenizer (encoded with
``add_special_tokens=False``) or a ``tokenizers.Tokenizer`` (``encode(text).ids``). It must be the policy's own.

Rules:

* The label is the CLASS of the prediction line the protocol acts on: `predict.env.protocol.find_prediction_line`,
  the first ``<PREDICTION>CLASS</PREDICTION> <DECISION>..</DECISION>`` pair outside closed ``<think>`` blocks (the
  parse `parse_prediction` uses), so a lone PREDICTION pair before that line is not the label. Only when the
  completion has no such line (the protocol then reads MALFORMED) is it the first ``<PREDICTION>..</PREDICTION>``
  pair outside a closed think block.
  The *label tokens* are the sampled tokens whose text overlaps the characters from the opening tag's ``>`` to the
  end of CLASS. The ``>`` belongs to the label because Qwen3's pre-tokenizer glues it to the class (``>PASS`` is one
  piece, ``>P`` + ``ASS`` its tokens, while ``ASSERTION_FAILURE`` follows a lone ``>``): the first token after
  ``<PREDICTION`` already carries the choice. ``(start, end)`` indexes ``completion_ids`` (end exclusive).
  The DECISION value is located the same way (its ``>`` included).
* Malformed predictions (documented choice):
  - the tag pair is there but the class is unknown, garbled or empty (``<PREDICTION>MAYBE</PREDICTION>``,
    ``<PREDICTION></PREDICTION>``, a missing DECISION tag): the label tokens are found as above, so they get rl
    weight 0 and a CE sample with the verified class like any other prediction point;
  - no ``<PREDICTION>...</PREDICTION>`` pair at all: there is no label (None). The reply keeps its full RL credit
    (the format error is already paid for: the protocol forces REVISE) and no CE sample is built, because there is
    no prefix the policy produced to attach the verified label to.
* The CE-only sample is ``prefix_ids`` (the call's prompt + the completion before the first label token) followed
  by the policy tokenizer's ids of ``lead + ">" + verified_label + "</PREDICTION>"``, where ``lead`` is the text of
  the first label token before the ``>`` (usually empty). Its ce weight is alpha on exactly the tokens overlapping
  ``">" + verified_label``, 0 elsewhere (the closing tag is context, not a target); rl weights 0; mask = the ce
  tokens. The continuation is the tokenizer's own (canonical) rendering, i.e. what the policy emits for that text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from predict.env.protocol import PREDICTION_CLASSES, find_prediction_line
from predict.train.sample import TrainSample

CLOSE_TAG = "</PREDICTION>"
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
# The same tolerance as protocol._PREDICTION (case, blanks around the value), one tag pair at a time.
# Group 1: from the opening tag's ">" to the end of the value; group 2: the value.
_PREDICTION_TAG = re.compile(r"<PREDICTION(>\s*([^<\n]*?))\s*</PREDICTION>", re.IGNORECASE)
_DECISION_TAG = re.compile(r"<DECISION(>\s*([^<\n]*?))\s*</DECISION>", re.IGNORECASE)


@dataclass(frozen=True)
class PredictionPoint:
    """One prediction reply of the program (a step with ``action == "prediction"``)."""

    call: int
    """Index of the model call (= the step index)."""
    patch_step: int | None
    predicted: str | None
    """The sampled class as parsed (a class, MALFORMED, or None)."""
    verified: str | None
    """The verified outcome class of the patched code; None when the episode was cut off before it was known."""
    seen: bool | None
    """True when a python_test showed that outcome to the model, False for a hidden shadow execution."""


def prediction_points(steps: Sequence[Mapping[str, Any]]) -> list[PredictionPoint]:
    """Every prediction step of a rollout's program steps (one per model reply) with the verified class of its
    patch: the patch step's ``outcome`` (a python_test in view, or a hidden shadow execution); None when the episode
    was cut off before it was known."""
    by_index = {int(s["index"]): s for s in steps if s.get("index") is not None}
    points = []
    for call, step in enumerate(steps):
        if step.get("action") != "prediction":
            continue
        patch_index = step.get("patch_step")
        patch = by_index.get(int(patch_index)) if patch_index is not None else None
        points.append(
            PredictionPoint(
                call=int(step.get("index", call)),
                patch_step=None if patch_index is None else int(patch_index),
                predicted=step.get("prediction"),
                verified=(patch or {}).get("outcome"),
                seen=(patch or {}).get("outcome_seen"),
            )
        )
    return points


def _encode(tokenizer: Any, text: str) -> list[int]:
    try:
        out = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # tokenizers.Tokenizer takes add_special_tokens too, but be lenient with others
        out = tokenizer.encode(text)
    return list(getattr(out, "ids", out))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=False)
    except TypeError:
        return tokenizer.decode(list(ids))


def token_char_spans(ids: Sequence[int], tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of `ids` and each token's [start, end) character span in it.

    A token that ends inside a multi-byte character gets an empty span at the point where it starts; the token
    that completes the character owns it."""
    ids = list(ids)
    text = _decode(tokenizer, ids)
    pieces = [_decode(tokenizer, [i]) for i in ids]
    spans: list[tuple[int, int]] = []
    if "".join(pieces) == text:  # the common case: every token decodes on its own
        pos = 0
        for p in pieces:
            spans.append((pos, pos + len(p)))
            pos += len(p)
        return text, spans
    prev = 0
    for k in range(1, len(ids) + 1):
        head = _decode(tokenizer, ids[:k])
        end = len(head) if text.startswith(head) else prev
        end = max(end, prev)
        spans.append((prev, end))
        prev = end
    return text, spans


def _first_outside_think(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    thinks = [m.span() for m in _THINK.finditer(text)]
    for m in pattern.finditer(text):
        if not any(a <= m.start() < b for a, b in thinks):
            return m
    return None


@dataclass(frozen=True)
class LabelSpan:
    """Where a tag's value sits in a completion."""

    start: int
    """First token overlapping the opening tag's ">" (the first label token)."""
    end: int
    """One past the last token overlapping the value (start + 1 at least)."""
    value: str
    """The value as sampled (not upper-cased)."""
    lead: str
    """Text of token `start` before the ">" (usually empty)."""


def _find_tag_value(completion_ids: Sequence[int], tokenizer: Any, tag: str) -> LabelSpan | None:
    """tag: "prediction" or "decision". The protocol's prediction line first; a lone tag pair without one."""
    ids = list(completion_ids)
    if not ids:
        return None
    text, spans = token_char_spans(ids, tokenizer)
    line = find_prediction_line(text)
    if line is not None:
        value = line.prediction if tag == "prediction" else line.decision
        cs, ce = line.prediction_span if tag == "prediction" else line.decision_span
    else:
        m = _first_outside_think(_PREDICTION_TAG if tag == "prediction" else _DECISION_TAG, text)
        if m is None:
            return None
        value = m.group(2)
        cs, ce = m.span(1)  # from ">" (never empty) to the end of the value
    overlapping = [i for i, (a, b) in enumerate(spans) if a < ce and b > cs]
    start, end = overlapping[0], overlapping[-1] + 1
    return LabelSpan(start=start, end=end, value=value, lead=text[spans[start][0] : cs])


def find_label(completion_ids: Sequence[int], tokenizer: Any) -> LabelSpan | None:
    """The PREDICTION label of a completion (see the module rules), or None without a tag pair."""
    return _find_tag_value(completion_ids, tokenizer, "prediction")


def label_token_span(completion_ids: Sequence[int], tokenizer: Any) -> tuple[int, int] | None:
    """(start, end) of the sampled PREDICTION label tokens in `completion_ids`; None without a tag pair."""
    span = find_label(completion_ids, tokenizer)
    return None if span is None else (span.start, span.end)


def decision_token_span(completion_ids: Sequence[int], tokenizer: Any) -> tuple[int, int] | None:
    """(start, end) of the sampled DECISION value tokens (masked from RL only under ``rl.mask_decision``)."""
    span = _find_tag_value(completion_ids, tokenizer, "decision")
    return None if span is None else (span.start, span.end)


def tokens_out_of_rl(
    completion_ids: Sequence[int], tokenizer: Any, *, mask_decision: bool
) -> tuple[LabelSpan | None, set[int]]:
    """A prediction reply's label and the indices of its tokens that get rl weight 0, for every backend: the label
    tokens, plus the DECISION value tokens under ``mask_decision``. Without a label none (the reply keeps its full
    RL credit: the rules above)."""
    label = find_label(completion_ids, tokenizer)
    if label is None:
        return None, set()
    off = set(range(label.start, label.end))
    if mask_decision and (span := decision_token_span(completion_ids, tokenizer)) is not None:
        off.update(range(*span))
    return label, off


def ce_sample(
    prefix_ids: Sequence[int],
    verified_label: str,
    alpha: float,
    tokenizer: Any,
    *,
    lead: str = "",
    task_id: int | None = None,
    rollout_key: str | None = None,
    source: str | None = None,
) -> TrainSample:
    """The CE-only sample: `prefix_ids` (ending just before the first label token, i.e. with ``<PREDICTION`` minus
    `lead`) + the ids of ``lead + ">" + verified_label + "</PREDICTION>"``; ce weight `alpha` on exactly the tokens
    overlapping ``">" + verified_label``."""
    if verified_label not in PREDICTION_CLASSES:
        raise ValueError(f"verified label must be one of {PREDICTION_CLASSES}, got {verified_label!r} ({source})")
    if not alpha > 0:
        raise ValueError(f"a CE sample needs alpha > 0, got {alpha} ({source}); alpha = 0 means no CE samples")
    if not prefix_ids:
        raise ValueError(f"CE sample ({source}): empty prefix")
    tail = _encode(tokenizer, lead + ">" + verified_label + CLOSE_TAG)
    _, spans = token_char_spans(tail, tokenizer)
    cs, ce = len(lead), len(lead) + 1 + len(verified_label)
    on = [a < ce and b > cs for a, b in spans]
    token_ids = [int(t) for t in prefix_ids] + tail
    ce_weights = [0.0] * len(prefix_ids) + [float(alpha) if m else 0.0 for m in on]
    return TrainSample.ce_only(token_ids, ce_weights, "ce", task_id=task_id, rollout_key=rollout_key, source=source)


def prediction_ce_sample(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    verified_label: str | None,
    alpha: float,
    tokenizer: Any,
    *,
    task_id: int | None = None,
    rollout_key: str | None = None,
    source: str | None = None,
) -> TrainSample | None:
    """The CE-only sample of one prediction call (prompt + sampled completion), or None when there is none: no
    tag pair in the completion, no verified label, or alpha = 0."""
    if not alpha > 0 or verified_label is None:
        return None
    span = find_label(completion_ids, tokenizer)
    if span is None:
        return None
    prefix = list(prompt_ids) + list(completion_ids)[: span.start]
    return ce_sample(
        prefix,
        verified_label,
        alpha,
        tokenizer,
        lead=span.lead,
        task_id=task_id,
        rollout_key=rollout_key,
        source=source,
    )


__all__ = [
    "CLOSE_TAG",
    "LabelSpan",
    "ce_sample",
    "decision_token_span",
    "find_label",
    "label_token_span",
    "prediction_ce_sample",
    "token_char_spans",
    "tokens_out_of_rl",
]

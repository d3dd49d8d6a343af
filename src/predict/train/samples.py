"""`TrainSample`: the one training record, shared by SFT, the local RL trainer and the prime-rl plugin.

A sample is one token sequence with per-token streams aligned to ``token_ids``. The streams at position t describe
the prediction of ``token_ids[t]`` from ``token_ids[:t]``, so position 0 never carries a loss.

* ``mask``: the token carries some loss (a sampled token for RL, a target token for CE); prompt tokens are False.
* ``logprobs``: the sampling policy's logprob of a sampled token (0.0 where nothing was sampled).
* ``advantages``: the rollout's advantage at its sampled tokens (GRPO: one group-normalised value per rollout).
* ``rl_weights``: weight of the policy-gradient term (1.0 on sampled tokens; 0.0 on Arm B's sampled PREDICTION label).
* ``ce_weights``: weight of the cross-entropy term (SFT: 1.0 on assistant tokens; Arm B CE-only samples: alpha on
  the verified label tokens).

Kinds: ``sft`` (a rendered trace), ``rl`` (sampled tokens of a rollout), ``ce`` (Arm B: a prediction point's prefix
followed by the verified label). The parquet schema is `SAMPLE_SCHEMA`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.io import write_rows

SAMPLE_KINDS: tuple[str, ...] = ("sft", "rl", "ce")
STREAMS: tuple[str, ...] = ("mask", "logprobs", "advantages", "rl_weights", "ce_weights")


@dataclass
class TrainSample:
    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    advantages: list[float]
    rl_weights: list[float]
    ce_weights: list[float]
    kind: str
    task_id: int | None = None
    rollout_key: str | None = None
    """The rollout it came from (rl/ce samples)."""
    source: str | None = None
    """Free-form provenance, e.g. "call 3" or "prediction at step 5"."""

    def __post_init__(self) -> None:
        if self.kind not in SAMPLE_KINDS:
            raise ValueError(f"sample kind must be one of {SAMPLE_KINDS}, got {self.kind!r}")
        n = len(self.token_ids)
        for name in STREAMS:
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"{self.kind} sample ({self.source}): {name} has {len(getattr(self, name))} entries, token_ids {n}"
                )
        if n and (self.mask[0] or self.rl_weights[0] or self.ce_weights[0]):
            raise ValueError(f"{self.kind} sample ({self.source}): position 0 has no prefix and cannot carry a loss")

    @property
    def n_rl_tokens(self) -> int:
        return sum(w > 0 for w in self.rl_weights)

    @property
    def n_ce_tokens(self) -> int:
        return sum(w > 0 for w in self.ce_weights)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SAMPLE_SCHEMA = pa.schema(
    [
        ("token_ids", pa.list_(pa.int32())),
        ("mask", pa.list_(pa.bool_())),
        ("logprobs", pa.list_(pa.float32())),
        ("advantages", pa.list_(pa.float32())),
        ("rl_weights", pa.list_(pa.float32())),
        ("ce_weights", pa.list_(pa.float32())),
        ("kind", pa.string()),
        ("task_id", pa.int64()),
        ("rollout_key", pa.string()),
        ("source", pa.string()),
    ]
)
assert [f.name for f in fields(TrainSample)] == SAMPLE_SCHEMA.names, "TrainSample and SAMPLE_SCHEMA differ"


def write_samples(samples: Iterable[TrainSample], path: str | Path) -> Path:
    return write_rows((s.to_dict() for s in samples), SAMPLE_SCHEMA, path)


def sample_from_row(row: Mapping[str, Any]) -> TrainSample:
    return TrainSample(**{name: row[name] for name in SAMPLE_SCHEMA.names})


def read_samples(path: str | Path) -> list[TrainSample]:
    return [sample_from_row(r) for r in pq.read_table(path, schema=SAMPLE_SCHEMA).to_pylist()]


# ---------------------------------------------------------------------------------------------------------------
# RL and CE samples of rollouts (every backend builds them here)
# ---------------------------------------------------------------------------------------------------------------
# Rules:
# * Built from the record's token graph (`tokens`, train client), never by re-tokenising text. A sampled node is one
#   model call: its full sequence is its ancestors' token_ids + its own (generation-prompt scaffold + sampled tokens),
#   exactly what the model saw and sampled; its sampled tokens are where `mask` is true, `logprobs` aligned to them.
# * Calls merge into one sequence only where one call's full sequence is a token-identical prefix of a later one's
#   (the graph re-renders past assistant turns; when the re-rendering differs from the sampled ids, the later call
#   sits on another branch and the calls stay separate samples). Each call's sampled tokens carry loss in exactly
#   one sample (the first maximal sequence that contains it).
# * GRPO: one advantage per rollout, (reward - group mean) / (group std + 1e-6) over the rollouts of one task in the
#   step (population std). Rollouts without a reward (infrastructure failures) get no samples.
# * Arm B: a prediction call's sampled label tokens (`labels.label_token_span`) get rl weight 0 (mask False: they
#   carry no loss in the RL sample); with `mask_decision` the DECISION value tokens too. Each prediction point with
#   a verified outcome (seen or shadow) and alpha > 0 adds a CE-only sample (`labels.ce_sample`): the call's exact
#   prefix up to the first label token, then the verified label and the closing tag, ce weight alpha on the label.
# * A rollout whose sampled calls do not line up one-to-one with its recorded steps yields no samples (counted as
#   `unaligned`): its prediction points cannot be located.


@dataclass(frozen=True)
class SampleSettings:
    """How rollouts become samples: the arm's protocol and the RL config."""

    predictive: bool = False
    """Arm B (and its ablations): mask sampled labels from RL, add CE samples."""
    alpha: float = 0.0
    """CE weight of the verified-label samples; 0 = none."""
    mask_decision: bool = False
    """Also give the sampled DECISION value tokens rl weight 0 (the writeup's suspected "masking gap")."""
    skip_zero_advantage: bool = False
    """Drop RL samples of rollouts whose advantage is 0 (a group with equal rewards), as prime-rl does; CE
    samples are kept."""


@dataclass
class Call:
    """One model call of a rollout, from the token graph."""

    node: int
    full_ids: list[int]
    """Prompt + this call's own tokens (what the model saw, then sampled)."""
    positions: list[int]
    """Indices in full_ids of the sampled tokens."""
    logprobs: list[float]

    @property
    def completion_ids(self) -> list[int]:
        return [self.full_ids[p] for p in self.positions]


def rollout_calls(tokens: Sequence[Mapping[str, Any]]) -> list[Call]:
    """The model calls of a token graph, in call order."""
    calls: list[Call] = []
    full_cache: dict[int, list[int]] = {}

    def path_ids(i: int) -> list[int]:
        if i not in full_cache:
            parent = tokens[i]["parent"]
            head = path_ids(parent) if parent is not None and parent >= 0 else []
            full_cache[i] = head + [int(t) for t in tokens[i]["token_ids"]]
        return full_cache[i]

    for i, node in enumerate(tokens):
        if not node["sampled"]:
            continue
        full = path_ids(i)
        own = list(node["mask"])
        offset = len(full) - len(own)
        positions = [offset + k for k, m in enumerate(own) if m]
        logprobs = [float(x) for x in node["logprobs"] or []]
        if len(logprobs) != len(positions):
            raise ValueError(f"token node {i}: {len(logprobs)} logprobs for {len(positions)} sampled tokens")
        calls.append(Call(node=i, full_ids=full, positions=positions, logprobs=logprobs))
    return calls


def merge_calls(calls: Sequence[Call]) -> list[tuple[list[int], list[int]]]:
    """Group calls into sequences: [(full_ids of the sequence, indices of the calls whose loss it carries)]."""

    def extends(longer: list[int], shorter: list[int]) -> bool:
        return len(longer) >= len(shorter) and longer[: len(shorter)] == shorter

    maximal = [
        i
        for i, c in enumerate(calls)
        if not any(
            j != i and len(d.full_ids) > len(c.full_ids) and extends(d.full_ids, c.full_ids)
            for j, d in enumerate(calls)
        )
    ]
    taken: set[int] = set()
    groups: list[tuple[list[int], list[int]]] = []
    for m in maximal:
        members = [i for i, c in enumerate(calls) if i not in taken and extends(calls[m].full_ids, c.full_ids)]
        taken.update(members)
        groups.append((calls[m].full_ids, members))
    return groups


def group_advantages(rewards: Sequence[float | None], eps: float = 1e-6) -> list[float | None]:
    """GRPO advantages of one task's rollouts: (r - mean) / (std + eps); None where the reward is None."""
    valid = [float(r) for r in rewards if r is not None]
    if not valid:
        return [None] * len(rewards)
    mean = sum(valid) / len(valid)
    std = (sum((r - mean) ** 2 for r in valid) / len(valid)) ** 0.5
    return [None if r is None else (float(r) - mean) / (std + eps) for r in rewards]


@dataclass
class SampleCounts:
    """What sample building did with a batch of rollouts (for the step metrics)."""

    rollouts: int = 0
    unaligned: int = 0
    no_reward: int = 0
    zero_advantage_skipped: int = 0
    prediction_points: int = 0
    masked_labels: int = 0
    malformed_no_label: int = 0
    ce_samples: int = 0
    merged_calls: int = 0
    calls: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def rollout_samples(
    record: Mapping[str, Any],
    advantage: float,
    tokenizer: Any,
    settings: SampleSettings,
    counts: SampleCounts | None = None,
) -> list[TrainSample]:
    """The RL samples (+ Arm B's CE samples) of one rollout with its advantage (see the rules above)."""
    from predict.train.labels import ce_sample, decision_token_span, find_label, prediction_points

    counts = counts if counts is not None else SampleCounts()
    key, task_id = record.get("rollout_key"), record.get("task_id")
    tokens = record.get("tokens")
    if not tokens:
        raise ValueError(f"rollout {key}: no token graph (roll out with the train client)")
    calls = rollout_calls(tokens)
    steps = list(record.get("steps") or [])
    if len(calls) != len(steps):
        counts.unaligned += 1
        return []
    counts.calls += len(calls)
    zero_rl: dict[int, set[int]] = {}  # call index -> sampled-token indices with rl weight 0
    ce: list[TrainSample] = []
    if settings.predictive:
        for point in prediction_points(steps):
            i = point.call
            counts.prediction_points += 1
            completion = calls[i].completion_ids
            label = find_label(completion, tokenizer)
            if label is None:
                counts.malformed_no_label += 1
                continue
            off = set(range(label.start, label.end))
            counts.masked_labels += bool(off)
            if settings.mask_decision and (span := decision_token_span(completion, tokenizer)) is not None:
                off.update(range(*span))
            zero_rl[i] = off
            if settings.alpha > 0 and point.verified is not None:
                prefix = calls[i].full_ids[: calls[i].positions[label.start]]
                ce.append(
                    ce_sample(
                        prefix,
                        point.verified,
                        settings.alpha,
                        tokenizer,
                        lead=label.lead,
                        task_id=task_id,
                        rollout_key=key,
                        source=f"prediction at step {i} (patch step {point.patch_step}, "
                        f"{'seen' if point.seen else 'shadow'})",
                    )
                )
    counts.ce_samples += len(ce)
    if settings.skip_zero_advantage and advantage == 0.0:
        counts.zero_advantage_skipped += 1
        return ce
    rl: list[TrainSample] = []
    for full, members in merge_calls(calls):
        n = len(full)
        mask, logprobs, adv, rl_w = [False] * n, [0.0] * n, [0.0] * n, [0.0] * n
        for ci in members:
            call = calls[ci]
            for k, (pos, lp) in enumerate(zip(call.positions, call.logprobs, strict=True)):
                logprobs[pos] = lp
                if k in zero_rl.get(ci, ()):
                    continue
                mask[pos], adv[pos], rl_w[pos] = True, float(advantage), 1.0
        counts.merged_calls += len(members) - 1
        rl.append(
            TrainSample(
                token_ids=list(full),
                mask=mask,
                logprobs=logprobs,
                advantages=adv,
                rl_weights=rl_w,
                ce_weights=[0.0] * n,
                kind="rl",
                task_id=task_id,
                rollout_key=key,
                source="calls " + ",".join(str(calls[ci].node) for ci in members),
            )
        )
    return rl + ce


def build_samples(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    settings: SampleSettings,
) -> tuple[list[TrainSample], SampleCounts, list[float | None]]:
    """Samples of one step's rollouts: GRPO advantages within each task's group, then `rollout_samples`.
    Returns (samples, counts, the advantage of each record in input order)."""
    counts = SampleCounts(rollouts=len(records))
    by_task: dict[Any, list[int]] = {}
    for i, r in enumerate(records):
        by_task.setdefault(r["task_id"], []).append(i)
    advantages: list[float | None] = [None] * len(records)
    for idx in by_task.values():
        rewards = [records[i].get("reward") if records[i].get("ok", True) else None for i in idx]
        for i, a in zip(idx, group_advantages(rewards), strict=True):
            advantages[i] = a
    samples: list[TrainSample] = []
    for record, a in zip(records, advantages, strict=True):
        if a is None:
            counts.no_reward += 1
            continue
        samples.extend(rollout_samples(record, a, tokenizer, settings, counts))
    return samples, counts, advantages


def rft_samples(record: Mapping[str, Any], counts: SampleCounts | None = None) -> list[TrainSample]:
    """Rejection-sampling fine-tuning (the RFT extension, `predict.train.rft`): the CE samples of one rollout if it
    was verified with reward 1, else none. Each sample is a merged sequence of the rollout's model calls (as for RL)
    with ce weight 1.0 on the tokens the model *sampled* (never the prompt, tool results or chat scaffolding the
    environment added), rl weight 0, and the sampling logprobs kept for reference. The token ids are the sampled
    ones from the token graph: nothing is re-tokenised. Arm B's sampled PREDICTION/DECISION tokens are kept as
    sampled (RFT imitates whole successful trajectories; no verified-label CE samples are added)."""
    counts = counts if counts is not None else SampleCounts()
    counts.rollouts += 1
    key, task_id = record.get("rollout_key"), record.get("task_id")
    if not record.get("ok", True) or record.get("reward") is None:
        counts.no_reward += 1
        return []
    if float(record["reward"]) != 1.0:
        return []
    tokens = record.get("tokens")
    if not tokens:
        raise ValueError(f"rollout {key}: no token graph (roll out with the train client)")
    calls = rollout_calls(tokens)
    counts.calls += len(calls)
    out: list[TrainSample] = []
    for full, members in merge_calls(calls):
        n = len(full)
        mask, logprobs, ce_w = [False] * n, [0.0] * n, [0.0] * n
        for ci in members:
            for pos, lp in zip(calls[ci].positions, calls[ci].logprobs, strict=True):
                mask[pos], logprobs[pos], ce_w[pos] = True, lp, 1.0
        counts.merged_calls += len(members) - 1
        out.append(
            TrainSample(
                token_ids=list(full),
                mask=mask,
                logprobs=logprobs,
                advantages=[0.0] * n,
                rl_weights=[0.0] * n,
                ce_weights=ce_w,
                kind="sft",
                task_id=task_id,
                rollout_key=key,
                source="rft calls " + ",".join(str(calls[ci].node) for ci in members),
            )
        )
    return out

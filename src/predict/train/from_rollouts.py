"""RL and CE samples of rollouts: every backend (the local RL trainer, RFT, the prime-rl plugin) builds its
`TrainSample`s from rollout records here (`rollout_samples`, `build_samples`, `rft_samples`); the rules are below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from predict.config import config_default
from predict.config.models import RLSettings
from predict.train.labels import ce_sample, prediction_points, tokens_out_of_rl
from predict.train.sample import TrainSample

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
# * Arm B: a prediction call's sampled label tokens (`labels.tokens_out_of_rl`) get rl weight 0 (mask False: they
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
    mask_decision: bool = config_default(RLSettings, "mask_decision")
    """Also give the sampled DECISION value tokens rl weight 0 (the writeup's suspected "masking gap")."""
    skip_zero_advantage: bool = config_default(RLSettings, "skip_zero_advantage")
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


def _record_calls(record: Mapping[str, Any]) -> list[Call]:
    tokens = record.get("tokens")
    if not tokens:
        raise ValueError(f"rollout {record.get('rollout_key')}: no token graph (roll out with the train client)")
    return rollout_calls(tokens)


def _merged_sequences(
    calls: Sequence[Call], counts: SampleCounts, zero_rl: Mapping[int, set[int]] | None = None
) -> list[tuple[list[int], list[int], list[bool], list[float]]]:
    """(token ids, member calls, mask, sampling logprobs) of each merged sequence (`merge_calls`): the mask is True
    on the members' sampled tokens except those `zero_rl` lists (call index -> sampled-token indices); the logprobs
    are kept on every sampled token."""
    out = []
    for full, members in merge_calls(calls):
        mask, logprobs = [False] * len(full), [0.0] * len(full)
        for ci in members:
            for k, (pos, lp) in enumerate(zip(calls[ci].positions, calls[ci].logprobs, strict=True)):
                logprobs[pos] = lp
                if k not in (zero_rl or {}).get(ci, ()):
                    mask[pos] = True
        counts.merged_calls += len(members) - 1
        out.append((list(full), members, mask, logprobs))
    return out


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


def rollout_samples(
    record: Mapping[str, Any],
    advantage: float,
    tokenizer: Any,
    settings: SampleSettings,
    counts: SampleCounts | None = None,
) -> list[TrainSample]:
    """The RL samples (+ Arm B's CE samples) of one rollout with its advantage (see the rules above)."""
    counts = counts if counts is not None else SampleCounts()
    key, task_id = record.get("rollout_key"), record.get("task_id")
    calls = _record_calls(record)
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
            label, zero_rl[i] = tokens_out_of_rl(calls[i].completion_ids, tokenizer, mask_decision=settings.mask_decision)
            if label is None:
                counts.malformed_no_label += 1
                continue
            counts.masked_labels += 1
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
    rl = []
    for full, members, mask, logprobs in _merged_sequences(calls, counts, zero_rl):
        n = len(full)
        rl.append(
            TrainSample(
                token_ids=full,
                mask=mask,
                logprobs=logprobs,
                advantages=[float(advantage) if m else 0.0 for m in mask],
                rl_weights=[1.0 if m else 0.0 for m in mask],
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
    calls = _record_calls(record)
    counts.calls += len(calls)
    return [
        TrainSample.ce_only(full, [1.0 if m else 0.0 for m in mask], "sft", logprobs=logprobs, task_id=task_id,
                            rollout_key=key, source="rft calls " + ",".join(str(calls[ci].node) for ci in members))
        for full, members, mask, logprobs in _merged_sequences(calls, counts)
    ]

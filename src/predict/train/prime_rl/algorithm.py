"""The study's algorithms on prime-rl (v0.8.0): `GRPOStdAlgorithm` (Arm A) and `PredictAlgorithm` (Arm B: the same
GRPO + verified-label CE samples, from the shared label logic).

Registered as ``[orchestrator.algo] type = "grpo_std"`` / ``"predict"`` by ``workflow/prime-rl/predict-algorithm.patch``
(config union members ``GRPOStdAlgoConfig`` and ``PredictAlgoConfig``, the latter with ``alpha``, ``mask_decision``
and ``tokenizer``; two registry entries; ``algo/predict.py`` re-exporting both classes). This module only runs
inside prime-rl's orchestrator (it imports prime-rl at the top); the tests import it with prime-rl's types faked.

One ``rl:`` design on both backends: the advantage is the local trainer's, (reward - group mean) / (group std + 1e-6)
(`predict.train.from_rollouts.group_advantages`, the one formula), not prime-rl's plain reward - mean; the policy loss is
the local trainer's clipped surrogate through prime-rl's custom-loss hook (`predict.train.prime_rl.loss`).

What it does to a rollout (the rules of the study's loss, `predict.train.loss`, on prime-rl's wire fields):

* arrival (``score_rollout``): locate every prediction reply in the rollout's samples (`points.prediction_targets`:
  the program's steps in ``trace.info["agent_result"]`` <-> the trace's sampled nodes). On each, the sampled label
  tokens (`predict.train.labels.tokens_out_of_rl`) get rl weight 0 (and the DECISION value tokens too under
  ``mask_decision``); every other sampled token keeps rl weight 1. Where the patch's verified class is known and
  alpha > 0, a CE-only sample is appended to ``rollout.samples``: `predict.train.labels.prediction_ce_sample`
  (the call's prompt + the completion up to the label, then the verified label), on the wire with mask all False,
  rl weights 0 and ce weights alpha on the label tokens.
* group (``score_group``): the study's GRPO advantage (`GRPOStdAlgorithm`), broadcast over mask-True tokens, so CE
  samples get advantage 0. Then the zero-advantage override: a rollout whose advantages are all 0 (a group with
  equal rewards) carries no RL signal, and prime-rl's zero-advantage filter would drop it whole, CE samples
  included. Such a rollout keeps only its CE samples and no advantage stream (``advantages = None``), which the
  filter skips; its RL samples are dropped, as the filter would have done. A rollout without CE samples is left
  to the filter.
* metrics (``score_rollout``, both arms: `GRPOStdAlgorithm` does it): each rollout's counts, counted as the local
  trainer counts them (`predict.train.step_metrics.rollout_trace_metrics`: patches, predictions and verified outcomes by
  class, REVISE decisions, reward, final pass, budget exhaustion), recorded as trace metrics ``predict_<name>``
  (their per-step means go to prime-rl's ``metrics.jsonl``: `predict.train.step_metrics.ROLLOUT_METRIC_PREFIX`).
* identity (``score_rollout``, both arms): prime-rl dispatches every rollout of a group with the same task data, so
  all carry the task's one ``sample``; each gets its own at arrival, its index in the group
  (``trace.info["sample"]``), and a key unique in the run (``trace.info["rollout_key"]``: task key, group id,
  sample), as vf-eval's ``-r`` rollouts and our own samples have. A failed rollout never arrives (prime-rl's train
  sink drops it first) and keeps its trace id only.
* A rollout whose model calls and program steps do not line up trains nothing (its prediction points cannot be
  located, so its label tokens cannot be kept out of RL): its samples are dropped, as the local trainer drops it
  (`predict.train.from_rollouts.rollout_samples`, "unaligned"); its reward still counts in the group baseline. Counted
  in ``counts["mismatched_rollouts"]``.

Same as the local trainer (`predict.train.from_rollouts`, tested side by side): which tokens leave RL, the CE samples
(token for token), the zero-advantage rule, unaligned rollouts, the advantage (std-normalised), and with the
rendered ``trainer.loss`` (`predict.train.prime_rl.configs.loss_table`) the loss and its gradient
(tests/prime_rl_real_flow.py runs both on the same samples).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from prime_rl.orchestrator.algo.grpo import GRPOAlgorithm
from prime_rl.orchestrator.trajectories import iter_trainable_branches
from prime_rl.transport import TrainingSample

from predict.train.from_rollouts import group_advantages
from predict.train.labels import prediction_ce_sample, tokens_out_of_rl
from predict.train.prime_rl.points import PointsMismatch, PredictionTarget, prediction_targets
from predict.train.step_metrics import rollout_trace_metrics

log = logging.getLogger(__name__)


def is_ce_sample(sample: Any) -> bool:
    """A CE-only sample on the wire: nothing sampled (RL samples always have mask-True tokens)."""
    return not any(sample.mask)


def rollout_layout(rollout: Any) -> tuple[list[Any], list[list[int]], list[list[bool]]]:
    """(nodes, node-index path per sample, trainable mask per sample), in the order `trace_to_samples` built the
    rollout's samples (the same branch selection, so sample k is branch k)."""
    nodes = list(rollout.nodes)
    index_of = {id(node): i for i, node in enumerate(nodes)}
    paths, masks = [], []
    for branch, mask in iter_trainable_branches(rollout):
        paths.append([index_of[id(node)] for node in branch.nodes])
        masks.append(list(mask))
    return nodes, paths, masks


def weight_predictions(
    samples: Sequence[Any],
    targets: Sequence[PredictionTarget],
    *,
    tokenizer: Any,
    alpha: float,
    mask_decision: bool,
    task_id: int | None = None,
    rollout_key: str | None = None,
) -> tuple[list[Any], Counter]:
    """Zero the rl weight of the sampled label (and decision) tokens in `samples` (in place) and return the
    CE-only samples to append (as `TrainingSample`s), with counts for logging."""
    counts: Counter = Counter()
    ce_samples = []
    for target in targets:
        c = target.completion
        sample = samples[c.sample]
        completion_ids = list(sample.token_ids[c.start : c.end])
        counts["prediction_points"] += 1
        _, off = tokens_out_of_rl(completion_ids, tokenizer, mask_decision=mask_decision)
        if off and sample.rl_weights is None:
            sample.rl_weights = [1.0 if m else 0.0 for m in sample.mask]
        for i in off:
            sample.rl_weights[c.start + i] = 0.0
        counts["rl_masked_tokens"] += len(off)
        verified = target.point.verified
        if verified is None:
            counts["unverified_points"] += 1
            continue
        ce = prediction_ce_sample(
            list(sample.token_ids[: c.start]),
            completion_ids,
            verified,
            alpha,
            tokenizer,
            task_id=task_id,
            rollout_key=rollout_key,
            source=f"prediction at step {target.point.call}",
        )
        if ce is None:
            continue
        n = len(ce.token_ids)
        ce_samples.append(
            TrainingSample(
                token_ids=list(ce.token_ids),
                mask=[False] * n,
                logprobs=[0.0] * n,
                temperatures=[],
                env_name=sample.env_name,
                rl_weights=[0.0] * n,
                ce_weights=list(ce.ce_weights),
            )
        )
        counts["ce_samples"] += 1
        counts["ce_tokens"] += ce.n_ce_tokens
    return ce_samples, counts


def keep_ce_without_advantage(rollout: Any) -> bool:
    """The zero-advantage override (see the module doc). True when the rollout was reduced to its CE samples."""
    if rollout.advantages is None or any(a != 0.0 for a in rollout.advantages):
        return False
    ce = [s for s in rollout.samples if is_ce_sample(s)]
    if not ce:
        return False
    rollout.samples = ce
    rollout.advantages = None
    return True


def _task_id(rollout: Any) -> int | None:
    data = getattr(getattr(rollout, "task", None), "data", None)
    task_id = getattr(data, "task_id", None)
    return int(task_id) if task_id is not None else None


class GRPOStdAlgorithm(GRPOAlgorithm):
    """Arm A on prime-rl: GRPO with the local trainer's advantage, (reward - mean) / (std + 1e-6) over the group."""

    def __init__(self, config: Any, policy_pool: Any):
        super().__init__(config, policy_pool)
        if self.length_penalty is not None:
            raise ValueError("grpo_std: length_penalty is not part of the study's design (the local trainer has none)")
        self.arrivals: dict[Any, int] = {}
        """group id -> rollouts of that group scored so far (the next one's sample); dropped with the group."""

    async def score_rollout(self, rollout: Any) -> None:
        await super().score_rollout(rollout)
        self.stamp_identity(rollout)
        # the per-step metrics of both arms: this rollout's counts, as the local trainer counts them (module doc)
        rollout.record_metrics(rollout_trace_metrics(rollout.info, getattr(rollout, "reward", None)))

    def stamp_identity(self, rollout: Any) -> None:
        """The rollout's own sample (its arrival index in its group) and key, in ``trace.info`` (module doc)."""
        group = getattr(rollout, "group_id", None)
        sample = self.arrivals.get(group, 0)
        self.arrivals[group] = sample + 1
        task_key = getattr(getattr(rollout, "task", None), "key", None)
        rollout.info["sample"] = sample
        rollout.info["rollout_key"] = f"{task_key}|{group}|{sample}"

    async def score_group(self, group: list[Any]) -> None:
        for rollout, advantage in zip(group, group_advantages([r.reward for r in group]), strict=True):
            rollout.assign_advantages(float(advantage))
        if group:
            self.arrivals.pop(getattr(group[0], "group_id", None), None)


class PredictAlgorithm(GRPOStdAlgorithm):
    """GRPO with Arm B's prediction labels out of RL credit plus verified-label CE samples (module doc)."""

    def __init__(self, config: Any, policy_pool: Any, tokenizer: Any = None):
        super().__init__(config, policy_pool)
        self.alpha = config.alpha  # typed by prime-rl's PredictAlgoConfig (float, bool): no casts
        self.mask_decision = config.mask_decision
        self.tokenizer_name = config.tokenizer
        self.tokenizer = tokenizer
        self.counts: Counter = Counter()

    async def setup(self) -> None:
        await super().setup()
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_name)

    async def score_rollout(self, rollout: Any) -> None:
        await super().score_rollout(rollout)
        self.counts["rollouts"] += 1
        try:
            nodes, paths, masks = rollout_layout(rollout)
            targets = prediction_targets(rollout.info, nodes, paths, masks)
        except PointsMismatch as e:
            self.counts["mismatched_rollouts"] += 1
            log.warning("predict: rollout %s dropped from training: %s", getattr(rollout, "id", "?"), e)
            rollout.samples = []  # no tokens to train; the zero-advantage filter then drops the rollout
            return
        if self.tokenizer is None:
            raise RuntimeError("PredictAlgorithm.setup() was not awaited: no tokenizer")
        ce_samples, counts = weight_predictions(
            rollout.samples,
            targets,
            tokenizer=self.tokenizer,
            alpha=self.alpha,
            mask_decision=self.mask_decision,
            task_id=_task_id(rollout),
            rollout_key=getattr(rollout, "id", None),
        )
        rollout.samples.extend(ce_samples)
        self.counts.update(counts)

    async def score_group(self, group: list[Any]) -> None:
        await super().score_group(group)
        for rollout in group:
            if keep_ce_without_advantage(rollout):
                self.counts["ce_only_rollouts"] += 1
        log.debug("predict: %s", dict(self.counts))


__all__ = [
    "GRPOStdAlgorithm",
    "PredictAlgorithm",
    "is_ce_sample",
    "keep_ce_without_advantage",
    "rollout_layout",
    "weight_predictions",
]

"""`PredictAlgorithm` on prime-rl's hook surface, with prime-rl's types faked (small dataclasses shaped like the
pinned commit's), the real Qwen3 tokenizer and the shared label logic (`predict.train.labels`).

Faked from prime-rl v0.8.0: ``GRPOAlgorithm`` (``algo/grpo.py``: advantage = reward - group mean, which
`GRPOStdAlgorithm` replaces with the local trainer's std-normalised one), ``Rollout.assign_advantages`` (``orchestrator/types.py``: a scalar broadcast over mask-True tokens),
``iter_trainable_branches`` / ``trace_to_samples`` (``orchestrator/trajectories.py``), ``TrainingSample``
(``transport/types.py``), ``stamp_advantages`` (``algo/routing.py``) and ``ZeroAdvantageFilter``
(``orchestrator/filters.py``).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from predict.train.from_rollouts import SampleSettings, group_advantages, rollout_samples
from tests.prime_rl_fixtures import VERIFIED, episode_result, trace_nodes


# --- prime-rl v0.8.0, faked ------------------------------------------------------------------------------------
@dataclass
class TrainingSample:
    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    env_name: str
    ref_logprobs: list[float] | None = None
    mm_kwargs: Any = None
    routed_experts: Any = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None
    advantages: list[float] | None = None


@dataclass
class Node:
    parent: int | None
    sampled: bool
    token_ids: list[int]
    mask: list[bool]


@dataclass
class Branch:
    nodes: list[Node]

    @property
    def token_ids(self) -> list[int]:
        return [t for n in self.nodes for t in n.token_ids]


@dataclass
class Rollout:
    nodes: list[Node]
    info: dict[str, Any]
    reward: float
    env_name: str = "predict_mbpp"
    id: str = "trace"
    samples: list[TrainingSample] = field(default_factory=list)
    advantages: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    group_id: str = "group-0"
    task: Any = None  # vf.TraceTask: type, data, key

    def record_metrics(self, values: dict[str, float]) -> None:  # vf.Trace's
        self.metrics.update({k: float(v) for k, v in values.items()})

    @property
    def branches(self) -> list[Branch]:
        parents = {n.parent for n in self.nodes}
        out = []
        for leaf in (i for i in range(len(self.nodes)) if i not in parents):
            path, i = [], leaf
            while i is not None:
                path.append(self.nodes[i])
                i = self.nodes[i].parent
            out.append(Branch(path[::-1]))
        return out

    def assign_advantages(self, value: float) -> None:
        self.advantages = [float(value) if m else 0.0 for s in self.samples for m in s.mask]


def iter_trainable_branches(trace: Rollout):
    trained: set[int] = set()
    for branch in trace.branches:
        mask: list[bool] = []
        for node in branch.nodes:
            if node.sampled and any(node.mask) and id(node) in trained:
                mask.extend([False] * len(node.mask))
            else:
                if node.sampled and any(node.mask):
                    trained.add(id(node))
                mask.extend(node.mask)
        if any(mask):
            yield branch, mask


def trace_to_samples(trace: Rollout) -> list[TrainingSample]:
    return [
        TrainingSample(token_ids=b.token_ids, mask=m, logprobs=[0.0] * len(m), temperatures=[], env_name=trace.env_name)
        for b, m in iter_trainable_branches(trace)
    ]


class GRPOAlgorithm:
    def __init__(self, config: Any, policy_pool: Any) -> None:
        self.policy_pool = policy_pool
        self.length_penalty = getattr(config, "length_penalty", None)

    async def setup(self) -> None:
        pass

    async def score_rollout(self, rollout: Rollout) -> None:
        pass

    async def score_group(self, group: list[Rollout]) -> None:
        mean = sum(r.reward for r in group) / len(group)
        for r in group:
            r.assign_advantages(r.reward - mean)


def stamp_advantages(rollout: Rollout) -> None:
    if rollout.advantages is None:
        return
    assert len(rollout.advantages) == sum(len(s.token_ids) for s in rollout.samples)
    offset = 0
    for s in rollout.samples:
        s.advantages = rollout.advantages[offset : offset + len(s.token_ids)]
        offset += len(s.token_ids)


def zero_advantage_filter_drops(rollout: Rollout) -> bool:
    return rollout.advantages is not None and all(a == 0.0 for a in rollout.advantages)


@dataclass
class PredictAlgoConfig:  # the patch's config class: type predict, alpha, mask_decision, tokenizer
    alpha: float = 1.0
    mask_decision: bool = False
    tokenizer: str = "Qwen/Qwen3-4B-Base"
    type: str = "predict"


@pytest.fixture(scope="module")
def algorithm_module():
    fakes = {
        "prime_rl": types.ModuleType("prime_rl"),
        "prime_rl.orchestrator": types.ModuleType("prime_rl.orchestrator"),
        "prime_rl.orchestrator.algo": types.ModuleType("prime_rl.orchestrator.algo"),
        "prime_rl.orchestrator.algo.grpo": types.ModuleType("prime_rl.orchestrator.algo.grpo"),
        "prime_rl.orchestrator.trajectories": types.ModuleType("prime_rl.orchestrator.trajectories"),
        "prime_rl.transport": types.ModuleType("prime_rl.transport"),
    }
    fakes["prime_rl.orchestrator.algo.grpo"].GRPOAlgorithm = GRPOAlgorithm
    fakes["prime_rl.orchestrator.trajectories"].iter_trainable_branches = iter_trainable_branches
    fakes["prime_rl.transport"].TrainingSample = TrainingSample
    saved = {name: sys.modules.get(name) for name in [*fakes, "predict.train.prime_rl.algorithm"]}
    sys.modules.update(fakes)
    sys.modules.pop("predict.train.prime_rl.algorithm", None)
    try:
        yield importlib.import_module("predict.train.prime_rl.algorithm")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@pytest.fixture(scope="module")
def tok() -> Any:
    from tokenizers import Tokenizer

    from predict.env.runner import default_tokenizer_dir

    return Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))


def enc(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def make_rollout(tok: Any, reward: float, steps_cut: int = 0) -> tuple[Rollout, dict[str, Any]]:
    result = episode_result()
    nodes = trace_nodes(result, lambda t: enc(tok, t), scaffold=enc(tok, "<|im_start|>assistant\n"))
    steps = result["steps"][: len(result["steps"]) - steps_cut]
    rollout = Rollout(
        nodes=[Node(n["parent"], n["sampled"], n["token_ids"], n["mask"]) for n in nodes],
        info={"agent_result": {**result, "steps": steps}},
        reward=reward,
    )
    rollout.samples = trace_to_samples(rollout)
    record = {"tokens": nodes, "steps": steps, "task_id": 7, "rollout_key": "k"}
    return rollout, record


def run(algo: Any, group: list[Rollout]) -> None:
    """The train sink's order: score each rollout on arrival, then the group, then stamp."""

    async def go() -> None:
        await algo.setup()
        for r in group:
            if r.samples:
                await algo.score_rollout(r)
        await algo.score_group(group)

    asyncio.run(go())
    for r in group:
        stamp_advantages(r)


def label_positions(algorithm_module: Any, tok: Any, rollout: Rollout) -> list[int]:
    sample = rollout.samples[0]
    return [i for i, (m, w) in enumerate(zip(sample.mask, sample.rl_weights, strict=True)) if m and w == 0.0]


def test_label_tokens_leave_rl_and_verified_labels_become_ce_samples(algorithm_module: Any, tok: Any) -> None:
    algo = algorithm_module.PredictAlgorithm(PredictAlgoConfig(alpha=0.5), None, tokenizer=tok)
    win, record = make_rollout(tok, 1.0)
    lose, _ = make_rollout(tok, 0.0)
    run(algo, [win, lose])
    rl, *ce = win.samples
    assert len(ce) == len(VERIFIED) == 3  # one CE sample per prediction point with a verified label
    # rl weight 0 exactly on the sampled label tokens of the three prediction replies
    masked = label_positions(algorithm_module, tok, win)
    # (Qwen3 makes ">PASS" one piece: a token straddling the tag and the class is a label token, see labels.py)
    assert tok.decode([rl.token_ids[i] for i in masked]).replace(" ", "") == ">PASS>ASSERTION_FAILURE>PASS"
    assert sum(rl.rl_weights) == sum(rl.mask) - len(masked)
    # the local trainer's GRPO ((reward - mean) / (std + 1e-6), not the fake's reward - mean) on the RL tokens, 0 on
    # the CE samples; the stream aligns with every sample
    win_adv, lose_adv = group_advantages([1.0, 0.0])
    assert set(a for a, m in zip(rl.advantages, rl.mask, strict=True) if m) == {win_adv}
    assert win_adv == pytest.approx(1.0, abs=1e-5)
    assert all(not any(s.advantages) for s in ce)
    assert set(lose.samples[0].advantages) == {0.0, lose_adv}
    # the CE samples on the wire: nothing sampled, no rl, alpha on the verified label only
    labels = []
    for s in ce:
        assert not any(s.mask) and not any(s.rl_weights) and s.env_name == "predict_mbpp"
        on = [i for i, w in enumerate(s.ce_weights) if w]
        assert set(s.ce_weights[i] for i in on) == {0.5}
        labels.append(tok.decode([s.token_ids[i] for i in on]).strip(" >"))
        assert s.token_ids[: on[0]] == rl.token_ids[: on[0]]  # the prefix is the sampled sequence's own
    assert labels == [VERIFIED[k] for k in sorted(VERIFIED)]
    assert algo.counts["ce_samples"] == 6 and algo.counts["prediction_points"] == 6


def test_same_ce_samples_and_label_mask_as_the_local_trainer(algorithm_module: Any, tok: Any) -> None:
    """One Arm B logic: the plugin's CE samples and masked label tokens equal `samples.rollout_samples`'."""
    algo = algorithm_module.PredictAlgorithm(PredictAlgoConfig(alpha=1.0), None, tokenizer=tok)
    rollout, record = make_rollout(tok, 1.0)
    other, _ = make_rollout(tok, 0.0)
    run(algo, [rollout, other])
    local = rollout_samples(record, 1.0, tok, SampleSettings(predictive=True, alpha=1.0))
    local_ce = [s for s in local if s.kind == "ce"]
    plugin_ce = rollout.samples[1:]
    assert [s.token_ids for s in plugin_ce] == [s.token_ids for s in local_ce]
    assert [s.ce_weights for s in plugin_ce] == [s.ce_weights for s in local_ce]
    (local_rl,) = [s for s in local if s.kind == "rl"]
    plugin_rl = rollout.samples[0]
    assert plugin_rl.token_ids == local_rl.token_ids
    on = [bool(m and w) for m, w in zip(plugin_rl.mask, plugin_rl.rl_weights, strict=True)]
    assert on == [w > 0 for w in local_rl.rl_weights]


def test_equal_rewards_keep_the_ce_samples_past_the_zero_advantage_filter(algorithm_module: Any, tok: Any) -> None:
    algo = algorithm_module.PredictAlgorithm(PredictAlgoConfig(alpha=1.0), None, tokenizer=tok)
    group = [make_rollout(tok, 1.0)[0], make_rollout(tok, 1.0)[0]]
    run(algo, group)
    for r in group:
        assert r.advantages is None and not zero_advantage_filter_drops(r)
        assert len(r.samples) == 3 and all(algorithm_module.is_ce_sample(s) for s in r.samples)
        assert all(s.advantages is None for s in r.samples)  # no rl members: the trainer accepts it
    assert algo.counts["ce_only_rollouts"] == 2


def test_alpha0_masks_labels_but_adds_no_ce_and_the_filter_drops_equal_groups(algorithm_module: Any, tok: Any) -> None:
    algo = algorithm_module.PredictAlgorithm(PredictAlgoConfig(alpha=0.0), None, tokenizer=tok)
    group = [make_rollout(tok, 0.0)[0], make_rollout(tok, 0.0)[0]]
    run(algo, group)
    for r in group:
        assert len(r.samples) == 1 and len(label_positions(algorithm_module, tok, r)) > 0
        assert zero_advantage_filter_drops(r)  # no CE samples to keep: prime-rl's filter does its usual job


def test_mask_decision_also_takes_the_decision_out_of_rl(algorithm_module: Any, tok: Any) -> None:
    plain = algorithm_module.PredictAlgorithm(PredictAlgoConfig(), None, tokenizer=tok)
    masked = algorithm_module.PredictAlgorithm(PredictAlgoConfig(mask_decision=True), None, tokenizer=tok)
    a, b = make_rollout(tok, 1.0)[0], make_rollout(tok, 1.0)[0]
    run(plain, [a, make_rollout(tok, 0.0)[0]])
    run(masked, [b, make_rollout(tok, 0.0)[0]])
    extra = sorted(set(label_positions(algorithm_module, tok, b)) - set(label_positions(algorithm_module, tok, a)))
    assert tok.decode([b.samples[0].token_ids[i] for i in extra]).replace(" ", "") == ">KEEP>REVISE>KEEP"
    assert [s.token_ids for s in a.samples[1:]] == [s.token_ids for s in b.samples[1:]]


def test_a_reply_without_a_prediction_pair_keeps_its_decision_in_rl_like_the_local_trainer(
    algorithm_module: Any, tok: Any
) -> None:
    """labels.py: no PREDICTION pair means no label, and the reply keeps its full RL credit, even under
    mask_decision with a DECISION tag in it (the local trainer's `rollout_samples` masks nothing there)."""
    from predict.train.labels import PredictionPoint
    from predict.train.prime_rl.points import Completion, PredictionTarget

    prompt, reply = enc(tok, "<|im_start|>assistant\n"), enc(tok, "PASS <DECISION>KEEP</DECISION>")
    sample = TrainingSample(token_ids=prompt + reply, mask=[False] * len(prompt) + [True] * len(reply),
                            logprobs=[0.0] * (len(prompt) + len(reply)), temperatures=[], env_name="predict_mbpp")
    point = PredictionPoint(call=1, patch_step=0, predicted="MALFORMED", verified="PASS", seen=False)
    target = PredictionTarget(point, Completion(sample=0, call=1, start=len(prompt), end=len(sample.token_ids)))
    ce, counts = algorithm_module.weight_predictions([sample], [target], tokenizer=tok, alpha=1.0, mask_decision=True)
    assert ce == [] and counts["rl_masked_tokens"] == 0
    assert sample.rl_weights is None or all(sample.rl_weights[len(prompt) :])


def test_unaligned_rollout_trains_nothing_like_the_local_trainer(algorithm_module: Any, tok: Any) -> None:
    algo = algorithm_module.PredictAlgorithm(PredictAlgoConfig(), None, tokenizer=tok)
    cut, record = make_rollout(tok, 1.0, steps_cut=1)
    other = make_rollout(tok, 0.0)[0]
    run(algo, [cut, other])
    assert cut.samples == [] and zero_advantage_filter_drops(cut)
    # its reward still counts in the baseline
    assert set(other.samples[0].advantages) == {0.0, group_advantages([1.0, 0.0])[1]}
    assert algo.counts["mismatched_rollouts"] == 1
    assert rollout_samples(record, 1.0, tok, SampleSettings(predictive=True, alpha=1.0)) == []


def test_each_rollout_carries_its_class_counts_as_trace_metrics(algorithm_module: Any, tok: Any) -> None:
    """What prime-rl's orchestrator logs per step (the mean of each trace metric), counted as the local trainer
    counts (`predict.train.step_metrics.rollout_metrics`), for the converter to turn into the per-step schema."""
    from predict.train.step_metrics import rollout_metrics

    algo = algorithm_module.PredictAlgorithm(PredictAlgoConfig(alpha=1.0), None, tokenizer=tok)
    win, record = make_rollout(tok, 1.0)
    lose, _ = make_rollout(tok, 0.0)
    run(algo, [win, lose])
    local = rollout_metrics([{**record, "ok": True, "reward": 1.0, "final_pass": True}])
    counts = {k: v for k, v in local.items() if k.startswith(("pred_", "verified_")) or k in ("n_patches", "n_revise")}
    assert counts["n_patches"] == len(VERIFIED) and counts["verified_PASS"] == 2
    assert {k: win.metrics[f"predict_{k}"] for k in counts} == counts
    assert (win.metrics["predict_reward"], lose.metrics["predict_reward"]) == (1.0, 0.0)


def test_arm_a_rollouts_carry_their_counts_too(algorithm_module: Any, tok: Any) -> None:
    """Arm A (grpo_std) logs the same per-rollout counts: patches and verified outcomes, no predictions."""
    algo = algorithm_module.GRPOStdAlgorithm(PredictAlgoConfig(alpha=0.0), None)
    win, _ = make_rollout(tok, 1.0)
    lose, _ = make_rollout(tok, 0.0)
    run(algo, [win, lose])
    assert win.metrics["predict_n_patches"] == len(VERIFIED) and win.metrics["predict_reward"] == 1.0


def test_each_rollout_of_a_group_gets_its_own_sample_and_key(algorithm_module: Any, tok: Any) -> None:
    """prime-rl sends every rollout of a group with the same task data (one sample for all): at arrival each gets
    its index in its group and a key unique in the run; a second group of the same task starts again at 0."""
    algo = algorithm_module.GRPOStdAlgorithm(PredictAlgoConfig(alpha=0.0), None)
    task = types.SimpleNamespace(key="mbpp-7-0", data=types.SimpleNamespace(task_id=7, sample=0))
    groups = []
    for group_id in ("g1", "g2"):
        group = [make_rollout(tok, reward)[0] for reward in (1.0, 0.0, 1.0)]
        for r in group:
            r.group_id, r.task = group_id, task
        run(algo, group)
        groups.append(group)
    assert [[r.info["sample"] for r in g] for g in groups] == [[0, 1, 2], [0, 1, 2]]
    keys = [r.info["rollout_key"] for g in groups for r in g]
    assert len(set(keys)) == 6 and keys[0] == "mbpp-7-0|g1|0"
    assert algo.arrivals == {}  # each group's count is dropped with the group

"""Arm B's prediction points in a rollout: which sampled tokens are a prediction reply, and its verified label.

Pure functions over plain data (no prime-rl, no verifiers, no tokenizer), so they are tested on records built with
`predict.env.records.build_record` and used unchanged by `PredictAlgorithm` on prime-rl's rollouts.

How a prediction point is found:

* ``info["agent_result"]["steps"]`` is the program's list of steps, one per model reply, in order (see
  `predict.env.protocol.Step`). A prediction step has ``action == "prediction"`` and ``patch_step`` = the index of
  the apply_patch step it judges; that patch step's ``outcome`` is the verified class of the patched code (from a
  python_test in view, ``outcome_seen``, or a hidden shadow execution). No outcome (a cut-off episode) = no label.
* The trace is a message graph: ``nodes`` in creation order, each with ``parent``, ``sampled``, ``token_ids`` and
  ``mask`` (True on the sampled completion tokens). The k-th sampled node is the k-th model call, i.e. step k.
* A training sample is one root-to-leaf path of nodes (its ``token_ids`` are the nodes' concatenated), with its own
  trainable mask (prime-rl trains a node shared by several branches only in the first). A call's completion in a
  sample is the span of that node's tokens where the sample's mask is True.

If the number of sampled nodes differs from the number of steps the mapping is ambiguous: `prediction_targets`
raises `PointsMismatch` and the caller trains nothing on that rollout (and counts it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from predict.train.labels import PredictionPoint
from predict.train.labels import prediction_points as step_prediction_points


class PointsMismatch(ValueError):
    """The rollout's model calls and the program's steps do not line up one to one."""


@dataclass(frozen=True)
class Completion:
    """The sampled tokens of one model call inside one training sample: ``token_ids[start:end]``."""

    sample: int
    call: int
    start: int
    end: int


@dataclass(frozen=True)
class PredictionTarget:
    """A prediction reply located in a training sample."""

    point: PredictionPoint
    completion: Completion


def _get(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, Mapping) else getattr(obj, name)


def agent_steps(info: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The program's steps from a trace's ``info`` (empty when the program left no result)."""
    result = (info or {}).get("agent_result") or {}
    return list(result.get("steps") or [])


def prediction_points(info: Mapping[str, Any] | None) -> list[PredictionPoint]:
    """Every prediction step of a rollout with the verified class of its patch (`labels.prediction_points`)."""
    return step_prediction_points(agent_steps(info))


def sampled_calls(nodes: Sequence[Any]) -> dict[int, int]:
    """node index -> model call index, for the sampled nodes in creation order."""
    calls: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if _get(node, "sampled"):
            calls[i] = len(calls)
    return calls


def node_paths(nodes: Sequence[Any]) -> list[list[int]]:
    """Root-to-leaf paths of node indexes (one per leaf, leaves in node order): the branches of a trace."""
    parents = [_get(n, "parent") for n in nodes]
    has_child = {p for p in parents if p is not None}
    paths = []
    for leaf in range(len(nodes)):
        if leaf in has_child:
            continue
        path: list[int] = []
        node: int | None = leaf
        while node is not None:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1])
    return paths


def completions(
    nodes: Sequence[Any], path: Sequence[int], sample_mask: Sequence[bool], sample: int = 0
) -> list[Completion]:
    """The model calls trained in one sample: for each sampled node on the path, the span of its tokens that the
    sample's mask marks trainable (a node trained in an earlier branch has none here and is skipped)."""
    calls = sampled_calls(nodes)
    total = sum(len(_get(nodes[index], "token_ids")) for index in path)
    if total != len(sample_mask):
        raise PointsMismatch(f"sample {sample}: the path's nodes hold {total} tokens, the sample {len(sample_mask)}")
    out = []
    offset = 0
    for index in path:
        n = len(_get(nodes[index], "token_ids"))
        if index in calls:
            on = [offset + i for i in range(n) if sample_mask[offset + i]]
            if on:
                if on[-1] - on[0] + 1 != len(on):
                    raise PointsMismatch(f"call {calls[index]}: its sampled tokens are not one contiguous span")
                out.append(Completion(sample=sample, call=calls[index], start=on[0], end=on[-1] + 1))
        offset += n
    return out


def prediction_targets(
    info: Mapping[str, Any] | None,
    nodes: Sequence[Any],
    paths: Sequence[Sequence[int]],
    masks: Sequence[Sequence[bool]],
) -> list[PredictionTarget]:
    """Every prediction reply of a rollout, located in its training samples (``paths[k]``/``masks[k]`` describe
    sample k), with its verified label. Raises `PointsMismatch` when calls and steps do not line up."""
    steps = agent_steps(info)
    n_calls = len(sampled_calls(nodes))
    if n_calls != len(steps):
        raise PointsMismatch(f"{n_calls} sampled model calls but {len(steps)} program steps")
    points = {p.call: p for p in step_prediction_points(steps)}
    targets = []
    for k, (path, mask) in enumerate(zip(paths, masks, strict=True)):
        for completion in completions(nodes, path, mask, sample=k):
            if completion.call in points:
                targets.append(PredictionTarget(points[completion.call], completion))
    return targets


__all__ = [
    "Completion",
    "PointsMismatch",
    "PredictionPoint",
    "PredictionTarget",
    "agent_steps",
    "completions",
    "node_paths",
    "prediction_points",
    "prediction_targets",
    "sampled_calls",
]

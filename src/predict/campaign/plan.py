"""The campaign plan: every (run, checkpoint, seed) the test evaluates.

Rules:

* Per run and seed the checkpoint selection chose on val (`predict.campaign.selection`), then any of
  ``evaluation.test_checkpoints`` it was evaluated at on val; for an arm also its reference (``evaluation.reference``,
  the SFT checkpoint), evaluated ONCE, under the first seed: the same weights serve every seed's RL-vs-SFT comparison
  (`evaluation_seed` says which file holds a seed's reference).
* In study order (`predict.runs.study_runs`); the workflow builds the campaign's jobs from `planned_selection` (mode
  ``fixed``, known before val) or `campaign_from_stats` (the val statistics' metrics and selection).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from predict.campaign.selection import select, selection_settings
from predict.campaign.view import campaign_config
from predict.config.models import Section

CampaignEntry = tuple[str, str, int]  # (run, checkpoint, seed)


def evaluation_seed(config: Mapping[str, Any] | Section, run: str, checkpoint: str, seed: int) -> int:
    """The seed whose test file holds run/checkpoint for `seed`: an arm's reference is evaluated once, under the first
    seed (one SFT checkpoint per arm); everything else under its own seed."""
    campaign = campaign_config(config)
    if run in campaign.arms and checkpoint == campaign.evaluation.reference:
        return campaign.seeds[0]
    return int(seed)


def campaign_checkpoints(config: Mapping[str, Any] | Section, run: str, seed: int, val_checkpoints: Sequence[str],
                         selected: str) -> list[str]:
    """A run/seed's test evaluations (see the module docstring): for an arm its reference under the first seed only,
    the checkpoint selection chose on val, and any of ``evaluation.test_checkpoints`` it was evaluated at on val.
    The selected checkpoint is dropped where it is the reference, evaluated under the first seed."""
    campaign = campaign_config(config)
    reference = campaign.evaluation.reference
    wanted = [reference] if run in campaign.arms and reference else []
    wanted += [selected, *campaign.evaluation.test_checkpoints]
    return [c for c in dict.fromkeys(wanted)
            if (c == selected or c in val_checkpoints) and evaluation_seed(campaign, run, c, seed) == seed]


def study_order(config: Mapping[str, Any] | Section) -> dict[str, int]:
    from predict.runs import study_runs

    return {run: i for i, run in enumerate(study_runs(config))}


def campaign_plan(config: Mapping[str, Any] | Section, val_checkpoints: Mapping[tuple[str, int], Sequence[str]],
                  selected: Mapping[tuple[str, int], str]) -> list[CampaignEntry]:
    """Every (run, checkpoint, seed) the campaign evaluates, in study order (`predict.runs.study_runs`)."""
    order = study_order(config)
    campaign = campaign_config(config)
    keys = sorted(selected, key=lambda rs: (order.get(rs[0], len(order)), rs[0], rs[1]))
    return [(run, c, seed) for run, seed in keys
            for c in campaign_checkpoints(campaign, run, seed, val_checkpoints.get((run, seed), ()),
                                          selected[(run, seed)])]


def planned_selection(config: Mapping[str, Any] | Section, val_checkpoints: Mapping[tuple[str, int], Sequence[str]]) -> dict:
    """The checkpoint ``evaluation.selection.mode: fixed`` chooses, known before any evaluation (the workflow builds
    the campaign's jobs from it): `select` itself, given the val checkpoints."""
    if (mode := selection_settings(config).mode) != "fixed":
        raise ValueError(f"evaluation.selection.mode {mode!r}: the choice is known only after val")
    metrics = [{"run": run, "seed": seed, "checkpoint": c, "split": "val", "pass_at_1": math.nan}
               for (run, seed), checkpoints in val_checkpoints.items() for c in checkpoints]
    return {(r["run"], r["seed"]): r["checkpoint"] for r in select(config, metrics)}


def read_selection(selection_path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(selection_path).to_pylist()


def campaign_from_stats(config: Mapping[str, Any] | Section, val_metrics: Path, selection_path: Path) -> list[CampaignEntry]:
    """The campaign plan from the val statistics: the checkpoints each run/seed was evaluated at (metrics.parquet)
    and the one selection chose (selection.parquet)."""
    import pyarrow.parquet as pq

    val_checkpoints: dict[tuple[str, int], list[str]] = {}
    for row in pq.read_table(val_metrics, columns=["run", "checkpoint", "split", "seed"]).to_pylist():
        if row["split"] == "val":
            val_checkpoints.setdefault((row["run"], int(row["seed"])), []).append(row["checkpoint"])
    selected = {(r["run"], int(r["seed"])): r["checkpoint"] for r in read_selection(selection_path)}
    return campaign_plan(config, val_checkpoints, selected)

"""Checkpoint selection: which checkpoint of each run and seed the test evaluates, chosen on val.

Rules:

* Selection reads val only (`select_checkpoints`), under ``evaluation.selection`` (its default: fixed step 100,
  `predict.config.models.SelectionSettings`; `selection_settings`). ``fixed`` takes ``step{N}``; ``best_val`` the step
  checkpoint with the highest val pass@1 (ties: the earlier step). A run with no step checkpoint falls back to its last
  evaluated checkpoint by name (``sft`` over ``base``, whatever order the evaluations come in; ``fallback=True``).
* `select` is the one entry: `predict stats`, the ablation and the extension tables and the campaign's plan
  (`predict.campaign.plan`) all call it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from predict.campaign.errors import StatsInputError
from predict.campaign.view import campaign_config
from predict.config.models import Section, SelectionSettings

STEP = re.compile(r"^step(\d+)$")


def selection_settings(config: Mapping[str, Any] | Section) -> SelectionSettings:
    """``evaluation.selection`` as its model types it; a config left without one selects the model's default."""
    return campaign_config(config).evaluation.selection


def step_of(checkpoint: str) -> int | None:
    m = STEP.match(checkpoint)
    return int(m.group(1)) if m else None


def select_checkpoints(metrics: Sequence[Mapping[str, Any]], mode: str, step: int | None) -> list[dict[str, Any]]:
    """Per run and seed, the checkpoint selection reads on val only (see the module docstring). `metrics`: rows with
    run, seed, checkpoint, split, pass_at_1 (and n_pass, n_scored)."""
    val = [m for m in metrics if m["split"] == "val"]
    out = []
    for run, seed in sorted({(m["run"], m["seed"]) for m in val}):
        # by name, so the fallback below is the same whatever order the caller read the evaluations in
        mine = sorted((m for m in val if (m["run"], m["seed"]) == (run, seed)), key=lambda m: m["checkpoint"])
        steps = sorted((s, m) for m in mine if (s := step_of(m["checkpoint"])) is not None)
        chosen, fallback = None, False
        if mode == "fixed":
            chosen = next((m for s, m in steps if s == step), None)
        elif mode == "best_val":
            chosen = max(steps, key=lambda sm: (sm[1]["pass_at_1"], -sm[0]), default=(None, None))[1]
        else:
            raise ValueError(f"evaluation.selection.mode: {mode!r} is neither fixed nor best_val")
        if chosen is None:
            if steps:
                raise StatsInputError(f"run {run} seed {seed}: selection step{step} was not evaluated on val "
                                      f"(have {', '.join(m['checkpoint'] for _, m in steps)})")
            chosen, fallback = mine[-1], True
        out.append({"run": run, "seed": seed, "mode": mode, "step": step, "checkpoint": chosen["checkpoint"],
                    "val_pass_at_1": chosen["pass_at_1"], "val_n_pass": chosen.get("n_pass"),
                    "val_n_scored": chosen.get("n_scored"), "fallback": fallback})
    return out


def select(config: Mapping[str, Any] | Section, metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`select_checkpoints` under the config's ``evaluation.selection``: what `predict stats`, the ablation and the
    extension tables and the campaign's planning all call."""
    settings = selection_settings(config)
    return select_checkpoints(metrics, settings.mode, settings.step)

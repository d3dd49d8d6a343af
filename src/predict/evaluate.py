"""Greedy evaluation of one checkpoint of one study run: the `predict evaluate` stage.

Rules:

* Evaluation is pass@1 with its own sampling settings, the config's ``evaluation`` section (the paper: temperature
  0, one sample per task), never the training rollouts' ``env.temperature``. Everything else (protocol, budget,
  verifier) is the rollout stage's (`predict.rollouts`), and the rows keep the per-trajectory record schema.
* A run is an arm (``arms``: A, B) or an ablation (``ablations``: each its base arm, Arm B, with one factor
  changed: ``variant`` is a protocol change applied here, ``alpha`` a training change that only its checkpoints
  carry). Records carry the base arm in ``arm``; the run is the first folder of the output path
  (``results/eval/{run}/{checkpoint}/{split}/seed{seed}.parquet``).
* Checkpoint selection (`predict.stats.select_checkpoints`) reads only val evaluations.
* The test split is evaluated once, through the rollout stage's ledger: this stage refuses it unless it is given
  the ledger and the selection table, refuses a checkpoint the selection did not choose, and records the config
  hash and the selection in the ledger entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from predict.rollouts import RolloutJob, SplitGuardError, run_job
from predict.runs import resolve_run

EVALUATION_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "max_tokens": 512, "samples": 1, "tasks": None}


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the config as canonical JSON: what the test ledger records."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def evaluation_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    return {**EVALUATION_DEFAULTS, **dict(config.get("evaluation") or {})}


def run_identity(config: Mapping[str, Any], run: str) -> tuple[str, str]:
    """(arm, variant) of a study run (see `predict.runs`)."""
    spec = resolve_run(config, run)
    return spec.arm, spec.variant


def selected_checkpoint(selection_path: Path, run: str, seed: int) -> dict[str, Any]:
    """The selection row of run/seed from `predict stats`' selection.parquet."""
    rows = [r for r in pq.read_table(selection_path).to_pylist() if (r["run"], r["seed"]) == (run, seed)]
    if not rows:
        raise SplitGuardError(f"{selection_path}: no checkpoint selection for run {run} seed {seed}")
    return rows[0]


def evaluation_job(
    config: Mapping[str, Any],
    *,
    run: str,
    checkpoint: str,
    split: str,
    seed: int,
    tasks_path: Path,
    model: str,
    out: Path,
    base_url: str | None = None,
    test_ledger: Path | None = None,
    selection_path: Path | None = None,
) -> RolloutJob:
    """The rollout job of one greedy evaluation (see the module docstring)."""
    arm, variant = run_identity(config, run)
    ev = evaluation_settings(config)
    ledger_extra = None
    if split == "test":
        if test_ledger is None or selection_path is None:
            raise SplitGuardError("the test split is evaluated once, through the evaluate_test target, which passes "
                                  "the ledger and the checkpoint selection")
        chosen = selected_checkpoint(selection_path, run, seed)
        if chosen["checkpoint"] != checkpoint:
            raise SplitGuardError(
                f"{selection_path}: run {run} seed {seed} selected checkpoint {chosen['checkpoint']} "
                f"({chosen['mode']} on val), not {checkpoint}"
            )
        ledger_extra = {"config_hash": config_hash(config), "selection": chosen, "evaluation": ev}
    return RolloutJob(
        tasks_path=tasks_path,
        split=split,
        out=out,
        model=model,
        checkpoint=checkpoint,
        arm=arm,
        seed=seed,
        n_tasks=ev["tasks"],
        samples=int(ev["samples"]),
        variant=variant,
        client="eval",
        base_url=base_url,
        test_ledger=test_ledger,
        sampling={"temperature": ev["temperature"], "max_tokens": ev["max_tokens"]},
        run=run,
        ledger_extra=ledger_extra,
    )


def evaluate(config: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    """Run (or resume) one evaluation; returns the rollout stage's summary."""
    return run_job(evaluation_job(config, **kw), config)

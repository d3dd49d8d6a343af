"""Evaluation files and what is read from them per run: scored rollouts, per-task outcomes, the mechanism metrics,
the confusion matrix and the per-class metrics (`predict.stats` has the rules).
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from predict.campaign import StatsInputError
from predict.env.records import patch_steps as record_patch_steps
from predict.vocabulary import OUTCOMES

PASS = "PASS"
MALFORMED = "MALFORMED"
METRICS: tuple[str, ...] = ("final_pass", "first_patch_pass")  # what a paired comparison compares per task
# The tables `predict stats` writes (one parquet each, `{name}.parquet`): the rules take their outputs from these.
STATS_TABLES: tuple[str, ...] = ("metrics", "pairs", "recovery", "confusion", "classes", "prediction_shares",
                                 "selection")
TEST_STATS_TABLES: tuple[str, ...] = (*STATS_TABLES, "ablations", "extensions", "campaigns")
EVAL_PATH = re.compile(r"(?P<run>[^/]+)/(?P<checkpoint>[^/]+)/(?P<split>[^/]+)/seed(?P<seed>-?\d+)\.parquet$")
log = logging.getLogger("predict.stats")

# ---------------------------------------------------------------------------------------------------------------
# Evaluation files
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluation:
    """One evaluation file: a run's checkpoint on a split for one seed."""

    run: str
    checkpoint: str
    split: str
    seed: int
    rows: tuple[dict[str, Any], ...]

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.run, self.checkpoint, self.split, self.seed)

    @property
    def label(self) -> str:
        return f"{self.run}/{self.checkpoint}/{self.split}/seed{self.seed}"

    def scored(self, metric: str = "final_pass") -> dict[tuple[int, int], bool]:
        """(task_id, sample) -> the metric (`METRICS`), for the scored rollouts (`scored_rows`)."""
        return {(r["task_id"], r["sample"]): per_task(r, metric) for r in scored_rows(self.rows)}


def read_evaluation(path: str | Path) -> Evaluation:
    """An evaluation file; run/checkpoint/split/seed come from its path and must agree with its rows."""
    path = Path(path)
    m = EVAL_PATH.search(path.as_posix())
    if not m:
        raise StatsInputError(f"{path}: expected .../{{run}}/{{checkpoint}}/{{split}}/seed{{seed}}.parquet")
    if not path.exists():
        raise StatsInputError(f"{path}: evaluation file not found")
    rows = tuple(pq.read_table(path).to_pylist())
    ev = Evaluation(m["run"], m["checkpoint"], m["split"], int(m["seed"]), rows)
    for i, r in enumerate(rows):
        if (r.get("checkpoint"), r.get("split"), r.get("seed")) != (ev.checkpoint, ev.split, ev.seed):
            raise StatsInputError(
                f"{path}: row {i} (task {r.get('task_id')}) has checkpoint/split/seed "
                f"{r.get('checkpoint')}/{r.get('split')}/{r.get('seed')}, the path says "
                f"{ev.checkpoint}/{ev.split}/{ev.seed}"
            )
    return ev


def scored_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rollouts with a verdict; the others are infrastructure failures, left out of every figure."""
    return [r for r in rows if bool(r.get("ok", True)) and r.get("final_pass") is not None]


def per_task(row: Mapping[str, Any], metric: str) -> bool:
    """One scored rollout's value of a paired metric: pass@1, or first patch PASS (no applied patch: a failure)."""
    if metric == "final_pass":
        return bool(row["final_pass"])
    if metric == "first_patch_pass":
        return row.get("first_patch_outcome") == PASS
    raise ValueError(f"metric {metric!r} is not one of {', '.join(METRICS)}")


def patch_steps(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every applied patch (one per patch, not per prediction step; edit-on-REVISE replacements included)."""
    return [s for r in rows for s in record_patch_steps(r.get("steps") or [])]


def rate_or_nan(num: int, den: int) -> float:
    return num / den if den else math.nan


def mechanism_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mechanism columns of one evaluation (see the module docstring)."""
    scored = scored_rows(rows)
    first_pass = sum(per_task(r, "first_patch_pass") for r in scored)
    recovered = [bool(r["recovered"]) for r in scored if r.get("recovered") is not None]
    never = [r for r in scored if not r.get("ever_revised")]
    ever = [r for r in scored if r.get("ever_revised")]
    never_p = [r for r in never if r.get("protocol") == "predictive"]  # KEEP-only rollouts of the predictive arm
    n_pass, never_pass, ever_pass = (sum(bool(r["final_pass"]) for r in group) for group in (scored, never, ever))
    exhausted, exhausted_ever, exhausted_keep = (sum(bool(r.get("budget_exhausted")) for r in group)
                                                 for group in (scored, ever, never_p))
    patches = [s for s in patch_steps(scored) if s.get("outcome") is not None]
    decided = [s for s in patches if s.get("decision") is not None]
    pass_p = [s for s in decided if s["outcome"] == PASS]
    fail_p = [s for s in decided if s["outcome"] != PASS]
    revised, revised_pass, revised_fail = (sum(s["decision"] == "REVISE" for s in group)
                                           for group in (decided, pass_p, fail_p))
    malformed = sum(s.get("prediction") == MALFORMED for s in decided)
    return {
        "n": len(rows),
        "n_scored": len(scored),
        "n_infra": len(rows) - len(scored),
        "n_pass": n_pass,
        "pass_at_1": rate_or_nan(n_pass, len(scored)),
        "first_patch_pass": rate_or_nan(first_pass, len(scored)),  # no applied patch = a failure; of every task
        "n_first_patch_pass": first_pass,
        "n_with_patch": sum(r.get("first_patch_outcome") is not None for r in scored),
        "recovery_rate": rate_or_nan(sum(recovered), len(recovered)),
        "n_recovered": sum(recovered),
        "n_recovery": len(recovered),
        "never_revised_n": len(never),
        "ever_revised_n": len(ever),
        "never_revised_n_pass": never_pass,
        "ever_revised_n_pass": ever_pass,
        "never_revised_pass": rate_or_nan(never_pass, len(never)),
        "ever_revised_pass": rate_or_nan(ever_pass, len(ever)),
        "n_patches": len(patches),
        "n_decided_patches": len(decided),
        "n_revised_patches": revised,
        "n_pass_patches": len(pass_p),
        "n_fail_patches": len(fail_p),
        "n_revised_pass_patches": revised_pass,
        "n_revised_fail_patches": revised_fail,
        "revise_rate": rate_or_nan(revised, len(decided)),
        "revise_rate_pass_patches": rate_or_nan(revised_pass, len(pass_p)),
        "revise_rate_fail_patches": rate_or_nan(revised_fail, len(fail_p)),
        "n_budget_exhausted": exhausted,
        "budget_exhausted": rate_or_nan(exhausted, len(scored)),
        "n_budget_exhausted_revise": exhausted_ever,
        "budget_exhausted_revise": rate_or_nan(exhausted_ever, len(ever)),
        "n_keep_only": len(never_p),
        "n_budget_exhausted_keep": exhausted_keep,
        "budget_exhausted_keep": rate_or_nan(exhausted_keep, len(never_p)),
        "n_malformed_predictions": malformed,
        "malformed_prediction_rate": rate_or_nan(malformed, len(decided)),
    }


def confusion(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(verified, predicted) -> patches, over applied patches with both a prediction and a verified outcome, of the
    scored rollouts only (the same rows as every mechanism metric)."""
    return dict(Counter((s["outcome"], s["prediction"]) for s in patch_steps(scored_rows(rows))
                        if s.get("prediction") is not None and s.get("outcome") is not None))


def class_metrics(counts: Mapping[tuple[str, str], int]) -> list[dict[str, Any]]:
    """Per class: precision, recall, and how often it is predicted vs verified (shares of the patches)."""
    total = sum(counts.values())
    out = []
    for cls in (*OUTCOMES, MALFORMED):
        tp = counts.get((cls, cls), 0)
        predicted = sum(v for (_, p), v in counts.items() if p == cls)
        verified = sum(v for (t, _), v in counts.items() if t == cls)
        if cls == MALFORMED and not predicted:
            continue
        out.append({
            "cls": cls,
            "n_predicted": predicted,
            "n_verified": verified,
            "precision": rate_or_nan(tp, predicted),
            "recall": rate_or_nan(tp, verified),
            "predicted_freq": rate_or_nan(predicted, total),
            "verified_freq": rate_or_nan(verified, total),
        })
    return out



"""`predict ablations`: each ablation vs its base arm at their own selected checkpoints.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from predict.campaign import StatsInputError
from predict.stats.metrics import Evaluation, class_metrics, confusion, mechanism_metrics
from predict.stats.pairs import compare, load_evaluations, rows_table

if TYPE_CHECKING:
    from predict.stages import StageSettings

# ---------------------------------------------------------------------------------------------------------------
# Ablations
# ---------------------------------------------------------------------------------------------------------------
ABLATION_FOCUS: dict[str, tuple[str, str]] = {
    # ablation -> (the metric it exists for, where it comes from)
    "alpha0": ("runtime_error_recall", "classes: recall of RUNTIME_ERROR (does the distinction survive alpha=0?)"),
    "forced_keep": ("pass_at_1", "metrics: pass@1 (does it recover when every decision is KEEP?)"),
    "budget_neutral": ("deficit_vs_A", "pass@1 of A minus the run's (does the deficit survive a free REVISE?)"),
}

ABLATION_SCHEMA = pa.schema([
    ("ablation", pa.string()), ("split", pa.string()), ("seed", pa.int64()), ("checkpoint", pa.string()),
    ("base_arm", pa.string()), ("base_checkpoint", pa.string()), ("A_checkpoint", pa.string()), ("n", pa.int64()),
    ("n_only_ablation", pa.int64()), ("n_only_base", pa.int64()), ("pass_ablation", pa.float64()),
    ("pass_base", pa.float64()), ("pass_A", pa.float64()), ("diff", pa.float64()), ("n10", pa.int64()),
    ("n01", pa.int64()), ("mcnemar_p", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()),
    ("focus_metric", pa.string()), ("focus_ablation", pa.float64()), ("focus_base", pa.float64()),
    ("runtime_error_recall_ablation", pa.float64()), ("runtime_error_recall_base", pa.float64()),
    ("revise_rate_ablation", pa.float64()), ("revise_rate_base", pa.float64()),
    ("budget_exhausted_ablation", pa.float64()), ("budget_exhausted_base", pa.float64()),
    ("deficit_vs_A_ablation", pa.float64()), ("deficit_vs_A_base", pa.float64()),
    ("selection_fallback", pa.bool_()),
])


def ablation_table(
    ablation: str,
    paths: Sequence[str | Path | Evaluation],
    selection: Sequence[Mapping[str, Any]],
    *,
    base_arm: str,
    split: str = "val",
    resamples: int,
    seed: int,
    ci: float,
) -> pa.Table:
    """A row per seed: the ablation's and the base arm's pass@1 at their selected checkpoints, the paired tests,
    and the metric the ablation exists for (`ABLATION_FOCUS`); Arm A's pass@1 at Arm A's own selected checkpoint."""
    evals = load_evaluations(paths)
    chosen = {(s["run"], s["seed"]): s for s in selection}

    def rte(ev: Evaluation) -> float:
        return next((c["recall"] for c in class_metrics(confusion(ev.rows)) if c["cls"] == "RUNTIME_ERROR"), math.nan)

    rows = []
    for seed_ in sorted({k[3] for k in evals if k[0] == ablation}):
        sel, sel_base = chosen.get((ablation, seed_)), chosen.get((base_arm, seed_))
        if sel is None or sel_base is None:
            raise StatsInputError(f"ablation {ablation} seed {seed_}: no checkpoint selection for "
                                  f"{ablation if sel is None else base_arm}")
        abl = evals.get((ablation, sel["checkpoint"], split, seed_))
        base = evals.get((base_arm, sel_base["checkpoint"], split, seed_))
        if abl is None or base is None:
            raise StatsInputError(f"ablation {ablation} seed {seed_}: the selected {split} evaluation is not among the "
                                  f"inputs ({ablation}/{sel['checkpoint']}, {base_arm}/{sel_base['checkpoint']})")
        sel_a = chosen.get(("A", seed_))  # Arm A at ITS selected checkpoint (it may differ from B's)
        arm_a = evals.get(("A", sel_a["checkpoint"], split, seed_)) if sel_a else None
        pair = compare(abl, base, "ablation_vs_base", resamples, seed, ci)
        m_abl, m_base = mechanism_metrics(abl.rows), mechanism_metrics(base.rows)
        pass_a = mechanism_metrics(arm_a.rows)["pass_at_1"] if arm_a else math.nan
        row = {
            "ablation": ablation, "split": split, "seed": seed_, "checkpoint": abl.checkpoint, "base_arm": base_arm,
            "base_checkpoint": base.checkpoint, "A_checkpoint": arm_a.checkpoint if arm_a else None, "n": pair["n"],
            "n_only_ablation": pair["n_only_a"], "n_only_base": pair["n_only_b"], "pass_ablation": m_abl["pass_at_1"],
            "pass_base": m_base["pass_at_1"], "pass_A": pass_a, "diff": pair["diff"], "n10": pair["n10"],
            "n01": pair["n01"], "mcnemar_p": pair["mcnemar_p"], "ci_low": pair["ci_low"], "ci_high": pair["ci_high"],
            "runtime_error_recall_ablation": rte(abl), "runtime_error_recall_base": rte(base),
            "revise_rate_ablation": m_abl["revise_rate"], "revise_rate_base": m_base["revise_rate"],
            "budget_exhausted_ablation": m_abl["budget_exhausted"], "budget_exhausted_base": m_base["budget_exhausted"],
            "deficit_vs_A_ablation": pass_a - m_abl["pass_at_1"], "deficit_vs_A_base": pass_a - m_base["pass_at_1"],
            "selection_fallback": bool(sel["fallback"] or sel_base["fallback"]),
        }
        focus = ABLATION_FOCUS.get(ablation, ("pass_at_1", ""))[0]
        col = "pass" if focus == "pass_at_1" else focus  # the focus columns: {col}_ablation, {col}_base
        row.update({"focus_metric": focus, "focus_ablation": row[f"{col}_ablation"], "focus_base": row[f"{col}_base"]})
        rows.append(row)
    return rows_table(rows, ABLATION_SCHEMA)


# `predict ablations`: one ablation's table.
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ablation", required=True)
    p.add_argument("--eval", nargs="+", required=True, help="val evaluations of the ablation, its base arm and A")
    p.add_argument("--out", required=True)


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console, write_table
    from predict.stats.settings import bootstrap_settings, run_evaluations, val_selection

    name = args.ablation
    evals = run_evaluations(config.ablations, "ablations", name, args.eval)
    table = ablation_table(name, evals, val_selection(config, evals),
                           base_arm=config.ablations[name].base_arm, **bootstrap_settings(config))
    write_table(table, args.out)
    console.print(f"{name}: {table.num_rows} seed row(s) -> {args.out}")
    return 0

"""`predict extensions`: each extension run vs Arm A and Arm B, plus its mechanism metric (`EXTENSION_FOCUS`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from predict.campaign import StatsInputError
from predict.stats.metrics import (
    PASS,
    Evaluation,
    class_metrics,
    confusion,
    mechanism_metrics,
    rate_or_nan,
    scored_rows,
)
from predict.stats.pairs import compare, load_evaluations, rows_table

if TYPE_CHECKING:
    from predict.runs import RunSpec
    from predict.stages import StageSettings

# ---------------------------------------------------------------------------------------------------------------
# Extensions (issue #11)
# ---------------------------------------------------------------------------------------------------------------
EXTENSION_FOCUS: dict[str, tuple[str, str, str]] = {
    # mechanism -> (the metric it exists for (the module docstring says what each is), the run's column, the column
    # it is compared with)
    "test_cost": ("calls_saved_per_solved", "calls_per_solved", "calls_per_solved_other"),
    "edit_on_revise": ("edited_revise_pass", "edited_revise_pass", "never_revised_pass"),
    "mask_decision": ("pred_freq_pass", "pred_freq_pass", "verified_freq_pass"),  # does masking DECISION shift it?
    "rft": ("rft_minus_rl", "pass_ext", "pass_rl"),  # does RL's gain need RL?
}

EXTENSION_SCHEMA = pa.schema([
    ("extension", pa.string()), ("split", pa.string()), ("seed", pa.int64()), ("checkpoint", pa.string()),
    ("base_arm", pa.string()), ("mechanism", pa.string()), ("test_cost", pa.int64()), ("pass_ext", pa.float64()),
    ("n_ext", pa.int64()),
    *[(f"{k}_vs_{arm}", t) for arm in ("A", "B") for k, t in (
        ("checkpoint", pa.string()), ("n", pa.int64()), ("pass", pa.float64()), ("diff", pa.float64()),
        ("n10", pa.int64()), ("n01", pa.int64()), ("mcnemar_p", pa.float64()), ("ci_low", pa.float64()),
        ("ci_high", pa.float64()))],
    ("counterpart", pa.string()), ("calls_per_solved", pa.float64()), ("calls_per_solved_other", pa.float64()),
    ("calls_saved_per_solved", pa.float64()), ("revise_precision", pa.float64()), ("n_revised_patches", pa.int64()),
    ("edited_revise_pass", pa.float64()), ("n_edited", pa.int64()), ("never_revised_pass", pa.float64()),
    ("n_never_revised", pa.int64()),
    ("pred_freq_pass", pa.float64()), ("verified_freq_pass", pa.float64()), ("n_predicted_patches", pa.int64()),
    ("pred_freq_pass_B", pa.float64()), ("verified_freq_pass_B", pa.float64()), ("n_predicted_patches_B", pa.int64()),
    ("pass_rl", pa.float64()), ("n_rl", pa.int64()), ("rft_minus_rl", pa.float64()),
    ("focus_metric", pa.string()), ("focus_ext", pa.float64()), ("focus_other", pa.float64()),
    ("selection_fallback", pa.bool_()),
])


@dataclass(frozen=True)
class ExtensionRun:
    """An extension run as its table reads it: the run as `predict.runs.resolve_run` resolved it (its ``arm`` is the
    base arm it is compared with, the config's default applied there) and `counterpart`, the run whose calls per
    solved task the expensive-tests metric subtracts from (None: the other base arm)."""

    spec: RunSpec
    counterpart: str | None = None


def extension_inputs(config: StageSettings, name: str) -> ExtensionRun:
    """An extension run as the statistics read it: its resolved run spec (its arm the base arm) and its counterpart."""
    from predict.runs import extension_counterpart, resolve_run

    return ExtensionRun(resolve_run(config, name), extension_counterpart(config, name))


def extension_mechanism(spec: RunSpec, default_test_cost: int) -> str:
    """Which mechanism an extension run exists for: rft, test_cost, edit_on_revise or mask_decision."""
    if spec.trainer == "rft":
        return "rft"
    if spec.test_cost != default_test_cost:
        return "test_cost"
    if spec.variant == "edit_on_revise":
        return "edit_on_revise"
    if spec.mask_decision:
        return "mask_decision"
    return "none"


def calls_per_solved(rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean ``calls_used`` over the rollouts that passed."""
    solved = [int(r.get("calls_used") or 0) for r in scored_rows(rows) if r["final_pass"]]
    return rate_or_nan(sum(solved), len(solved))


def pass_frequencies(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, int]:
    """(share of predicted patches predicted PASS, share of them verified PASS, number of those patches)."""
    counts = confusion(rows)
    row = next((c for c in class_metrics(counts) if c["cls"] == PASS), None)
    return (row["predicted_freq"], row["verified_freq"], sum(counts.values())) if row else (math.nan, math.nan, 0)


def extension_table(
    extension: str,
    paths: Sequence[str | Path | Evaluation],
    selection: Sequence[Mapping[str, Any]],
    *,
    spec: RunSpec,
    counterpart: str | None = None,
    default_test_cost: int,
    split: str = "val",
    resamples: int,
    seed: int,
    ci: float,
) -> pa.Table:
    """A row per seed: the extension run at its selected checkpoint against Arm A and Arm B at theirs (McNemar,
    bootstrap), and its mechanism metric (`EXTENSION_FOCUS`). `spec`: the run as `predict.runs.resolve_run` resolved
    it (its arm, test_cost, variant, mask_decision, trainer); `counterpart`: the run whose calls per solved task the
    expensive-tests metric subtracts from (the other arm at the same test cost; default the other base arm)."""
    evals = load_evaluations(paths)
    chosen = {(s["run"], s["seed"]): s for s in selection}
    # the run's arm as predict.runs resolved it (its model's default base_arm applied there, not again here)
    base_arm = spec.arm
    if not base_arm:
        raise ValueError(f"extension {extension}: its spec names no arm (the base_arm predict.runs.resolve_run gives "
                         "it from the config)")
    mechanism = extension_mechanism(spec, default_test_cost)
    other = counterpart or ("A" if base_arm == "B" else "B")

    def selected(run: str, seed_: int) -> Evaluation | None:
        s = chosen.get((run, seed_))
        return evals.get((run, s["checkpoint"], split, seed_)) if s else None

    rows = []
    for seed_ in sorted({k[3] for k in evals if k[0] == extension}):
        sel = chosen.get((extension, seed_))
        if sel is None:
            raise StatsInputError(f"extension {extension} seed {seed_}: no checkpoint selection")
        ext = evals.get((extension, sel["checkpoint"], split, seed_))
        if ext is None:
            raise StatsInputError(f"extension {extension} seed {seed_}: the selected {split} evaluation "
                                  f"{extension}/{sel['checkpoint']} is not among the inputs")
        m_ext = mechanism_metrics(ext.rows)
        row: dict[str, Any] = {"extension": extension, "split": split, "seed": seed_, "checkpoint": ext.checkpoint,
                               "base_arm": base_arm, "mechanism": mechanism,
                               "test_cost": spec.test_cost,
                               "pass_ext": m_ext["pass_at_1"], "n_ext": m_ext["n_scored"], "counterpart": other}
        fallback = bool(sel["fallback"])
        for arm in ("A", "B"):
            ev = selected(arm, seed_)
            if ev is None:
                continue
            fallback |= bool(chosen[arm, seed_]["fallback"])
            pair = compare(ext, ev, f"extension_vs_{arm}", resamples, seed, ci)
            row |= {f"checkpoint_vs_{arm}": ev.checkpoint, f"n_vs_{arm}": pair["n"], f"pass_vs_{arm}": pair["pass_b"],
                    **{f"{k}_vs_{arm}": pair[k] for k in ("diff", "n10", "n01", "mcnemar_p", "ci_low", "ci_high")}}
        counter = selected(other, seed_)
        row["calls_per_solved"] = calls_per_solved(ext.rows)
        row["calls_per_solved_other"] = calls_per_solved(counter.rows) if counter else math.nan
        row["calls_saved_per_solved"] = row["calls_per_solved_other"] - row["calls_per_solved"]
        row["revise_precision"] = rate_or_nan(m_ext["n_revised_fail_patches"], m_ext["n_revised_patches"])
        row["n_revised_patches"] = m_ext["n_revised_patches"]
        edited = [bool(r["final_pass"]) for r in scored_rows(ext.rows) if r.get("ever_edited")]
        row |= {"edited_revise_pass": rate_or_nan(sum(edited), len(edited)), "n_edited": len(edited),
                "never_revised_pass": m_ext["never_revised_pass"], "n_never_revised": m_ext["never_revised_n"]}
        row["pred_freq_pass"], row["verified_freq_pass"], row["n_predicted_patches"] = pass_frequencies(ext.rows)
        arm_b = selected("B", seed_)
        row["pred_freq_pass_B"], row["verified_freq_pass_B"], row["n_predicted_patches_B"] = (
            pass_frequencies(arm_b.rows) if arm_b else (math.nan, math.nan, 0))
        rl = selected(base_arm, seed_)
        m_rl = mechanism_metrics(rl.rows) if rl else {"pass_at_1": math.nan, "n_scored": 0}
        row["pass_rl"], row["n_rl"] = m_rl["pass_at_1"], m_rl["n_scored"]
        row["rft_minus_rl"] = row["pass_ext"] - row["pass_rl"]
        focus, mine, theirs = EXTENSION_FOCUS.get(mechanism, ("pass_at_1", "pass_ext", f"pass_vs_{base_arm}"))
        row |= {"focus_metric": focus, "focus_ext": row.get(mine, math.nan), "focus_other": row.get(theirs, math.nan),
                "selection_fallback": fallback}
        rows.append(row)
    return rows_table(rows, EXTENSION_SCHEMA)


# `predict extensions`: one extension's table.
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--extension", required=True)
    p.add_argument("--eval", nargs="+", required=True, help="val evaluations of the extension, A, B, counterpart")
    p.add_argument("--out", required=True)


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console, write_table
    from predict.stats.settings import bootstrap_settings, run_evaluations, val_selection

    name = args.extension
    evals = run_evaluations(config.extensions, "extensions", name, args.eval)
    run = extension_inputs(config, name)
    table = extension_table(name, evals, val_selection(config, evals), spec=run.spec, counterpart=run.counterpart,
                            default_test_cost=config.env.test_cost, **bootstrap_settings(config))
    write_table(table, args.out)
    console.print(f"{name}: {table.num_rows} seed row(s) -> {args.out}")
    return 0

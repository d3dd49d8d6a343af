"""Pairs: which evaluations are compared (the pair plan), one paired comparison (McNemar + bootstrap on the tasks
both sides scored), Holm within a family, recovery (Fisher), prediction shares and the schemas of those tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from predict.campaign import StatsInputError
from predict.config.models import AblationSettings
from predict.stats.exact import fisher_exact, holm, mcnemar_exact, paired_bootstrap
from predict.stats.metrics import (
    Evaluation,
    class_metrics,
    confusion,
    log,
    mechanism_metrics,
    rate_or_nan,
    read_evaluation,
)


# ---------------------------------------------------------------------------------------------------------------
# Pairs, selection, tables
# ---------------------------------------------------------------------------------------------------------------
def compare(first: Evaluation, second: Evaluation, kind: str, resamples: int, seed: int, ci: float,
            metric: str = "final_pass") -> dict[str, Any]:
    """One paired comparison row: first vs second on the tasks both scored (the module docstring's pairs)."""
    a, b = first.scored(metric), second.scored(metric)
    keys = sorted(set(a) & set(b))
    only_a, only_b = len(set(a) - set(b)), len(set(b) - set(a))
    if only_a or only_b:
        log.warning("%s (%s): %s vs %s: %d task(s) scored only in the first, %d only in the second; compared on "
                    "the %d both scored", kind, metric, first.label, second.label, only_a, only_b, len(keys))
    va = np.array([a[k] for k in keys], dtype=bool)
    vb = np.array([b[k] for k in keys], dtype=bool)
    row: dict[str, Any] = {"kind": kind, "metric": metric, "split": first.split}
    for side, ev in (("a", first), ("b", second)):
        row.update({f"run_{side}": ev.run, f"checkpoint_{side}": ev.checkpoint, f"seed_{side}": ev.seed})
    row.update(mcnemar_exact(va, vb))
    row["n_only_a"], row["n_only_b"] = only_a, only_b
    row["n_pass_a"], row["n_pass_b"] = int(va.sum()), int(vb.sum())
    row["pass_a"], row["pass_b"] = rate_or_nan(row["n_pass_a"], row["n"]), rate_or_nan(row["n_pass_b"], row["n"])
    row.update(paired_bootstrap(va, vb, resamples=resamples, seed=seed, ci=ci))
    row["discordance"] = rate_or_nan(row["n10"] + row["n01"], row["n"])
    return row


Key = tuple[str, str, str, int]  # (run, checkpoint, split, seed)


def pair_plan(
    evals: Mapping[Key, Evaluation],
    arms: Sequence[str],
    ablations: Mapping[str, AblationSettings],
    reference: str | None,
    selected: Mapping[tuple[str, int], str] | None = None,
) -> list[tuple[str, Evaluation, Evaluation]]:
    """Which evaluations are compared (see the module docstring), in a stable order. `selected` ((run, seed) ->
    checkpoint, the val selection) is given for the test: A vs B and the ablations then compare the selected
    checkpoints; without it (val) they compare every common checkpoint."""
    plan: list[tuple[str, Evaluation, Evaluation]] = []
    keys = sorted(evals)
    for run, ckpt, split, seed in keys:
        if run in arms and reference and ckpt != reference and (run, reference, split, seed) in evals:
            plan.append(("vs_reference", evals[run, ckpt, split, seed], evals[run, reference, split, seed]))

    def chosen(run: str, split: str, seed: int) -> Evaluation | None:
        ckpt = (selected or {}).get((run, seed))
        return evals.get((run, ckpt, split, seed)) if ckpt else None

    both_arms = "A" in arms and "B" in arms
    for run, ckpt, split, seed in [k for k in keys if both_arms and k[0] == "A"]:
        first = evals[run, ckpt, split, seed]
        if selected is None:
            plan += [("A_vs_B", first, evals[k]) for k in keys if k[0] == "B" and k[1:3] == (ckpt, split)]
        elif ckpt == selected.get((run, seed)):
            for seed_b in sorted({k[3] for k in keys if k[0] == "B" and k[2] == split}):
                if (b := chosen("B", split, seed_b)) is not None:
                    plan.append(("A_vs_B", first, b))
    for run, ckpt, split, seed in keys:
        if run in ablations:
            base = ablations[run].base_arm
            if selected is None:
                if (base, ckpt, split, seed) in evals:
                    plan.append(("ablation_vs_base", evals[run, ckpt, split, seed], evals[base, ckpt, split, seed]))
            elif ckpt == selected.get((run, seed)) and (b := chosen(base, split, seed)) is not None:
                plan.append(("ablation_vs_base", evals[run, ckpt, split, seed], b))
    return plan


PAIR_SCHEMA = pa.schema([
    ("kind", pa.string()), ("metric", pa.string()), ("split", pa.string()), ("family", pa.string()),
    ("run_a", pa.string()), ("checkpoint_a", pa.string()), ("seed_a", pa.int64()),
    ("run_b", pa.string()), ("checkpoint_b", pa.string()), ("seed_b", pa.int64()),
    ("n", pa.int64()), ("n_only_a", pa.int64()), ("n_only_b", pa.int64()),
    ("n11", pa.int64()), ("n10", pa.int64()), ("n01", pa.int64()), ("n00", pa.int64()),
    ("mcnemar_p", pa.float64()), ("mcnemar_p_holm", pa.float64()),
    ("n_pass_a", pa.int64()), ("n_pass_b", pa.int64()), ("pass_a", pa.float64()), ("pass_b", pa.float64()),
    ("diff", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("discordance", pa.float64()),
])
RECOVERY_SCHEMA = pa.schema([
    ("run", pa.string()), ("split", pa.string()), ("seed", pa.int64()),
    ("checkpoint_a", pa.string()), ("n_recovered_a", pa.int64()), ("n_recovery_a", pa.int64()),
    ("recovery_a", pa.float64()),
    ("checkpoint_b", pa.string()), ("n_recovered_b", pa.int64()), ("n_recovery_b", pa.int64()),
    ("recovery_b", pa.float64()),
    ("diff", pa.float64()), ("fisher_p", pa.float64()),
])
SHARES_SCHEMA = pa.schema([
    ("run", pa.string()), ("split", pa.string()), ("seed", pa.int64()), ("cls", pa.string()),
    ("checkpoint_reference", pa.string()), ("n_predicted_reference", pa.int64()), ("n_patches_reference", pa.int64()),
    ("share_reference", pa.float64()),
    ("checkpoint_selected", pa.string()), ("n_predicted_selected", pa.int64()), ("n_patches_selected", pa.int64()),
    ("share_selected", pa.float64()), ("n_verified_selected", pa.int64()), ("verified_share_selected", pa.float64()),
])
ID_FIELDS = [("run", pa.string()), ("checkpoint", pa.string()), ("split", pa.string()), ("seed", pa.int64())]
SELECTION_SCHEMA = pa.schema([
    ("run", pa.string()), ("seed", pa.int64()), ("mode", pa.string()), ("step", pa.int64()),
    ("checkpoint", pa.string()), ("val_pass_at_1", pa.float64()), ("val_n_pass", pa.int64()),
    ("val_n_scored", pa.int64()), ("fallback", pa.bool_()),
])
CONFUSION_SCHEMA = pa.schema([*ID_FIELDS, ("verified", pa.string()), ("predicted", pa.string()), ("count", pa.int64())])
CLASS_SCHEMA = pa.schema([*ID_FIELDS, ("cls", pa.string()), ("n_predicted", pa.int64()), ("n_verified", pa.int64()),
                          ("precision", pa.float64()), ("recall", pa.float64()), ("predicted_freq", pa.float64()),
                          ("verified_freq", pa.float64())])


def rows_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema | None = None) -> pa.Table:
    return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)  # no schema: inferred from the rows


def load_evaluations(sources: Iterable[str | Path | Evaluation]) -> dict[Key, Evaluation]:
    """Evaluation files (or already read evaluations) by key; a second file for one key is an error."""
    evals: dict[Key, Evaluation] = {}
    for source in sources:
        ev = source if isinstance(source, Evaluation) else read_evaluation(source)
        if ev.key in evals:
            where = source.label if isinstance(source, Evaluation) else source  # a label, never the rows
            raise StatsInputError(f"{where}: a second file for run/checkpoint/split/seed {ev.key}")
        evals[ev.key] = ev
    return evals


def add_holm(pairs: list[dict[str, Any]], selected: Mapping[tuple[str, int], str]) -> None:
    """``family`` (kind/metric/split/checkpoint role of the first side: "selected" for the val selection's
    checkpoint, else the checkpoint) and ``mcnemar_p_holm``, Holm within each family."""
    for p in pairs:
        role = "selected" if selected.get((p["run_a"], p["seed_a"])) == p["checkpoint_a"] else p["checkpoint_a"]
        p["family"] = f"{p['kind']}/{p['metric']}/{p['split']}/{role}"
    for family in dict.fromkeys(p["family"] for p in pairs):
        mine = [p for p in pairs if p["family"] == family]
        for p, adjusted in zip(mine, holm([p["mcnemar_p"] for p in mine]), strict=True):
            p["mcnemar_p_holm"] = adjusted


def recovery_row(first: Evaluation, second: Evaluation) -> dict[str, Any]:
    """Recovery of first vs second (RL vs its SFT), unpaired: Fisher's exact, with both counts."""
    ma, mb = mechanism_metrics(first.rows), mechanism_metrics(second.rows)
    return {"run": first.run, "split": first.split, "seed": first.seed,
            "checkpoint_a": first.checkpoint, "n_recovered_a": ma["n_recovered"], "n_recovery_a": ma["n_recovery"],
            "recovery_a": ma["recovery_rate"],
            "checkpoint_b": second.checkpoint, "n_recovered_b": mb["n_recovered"], "n_recovery_b": mb["n_recovery"],
            "recovery_b": mb["recovery_rate"], "diff": ma["recovery_rate"] - mb["recovery_rate"],
            "fisher_p": fisher_exact(ma["n_recovered"], ma["n_recovery"], mb["n_recovered"], mb["n_recovery"])}


def prediction_shares(reference: Evaluation, selected: Evaluation) -> list[dict[str, Any]]:
    """Per class: the share of patches predicted as it at the reference (SFT) checkpoint vs at the selected one
    ("SFT predicted PASS for everything"), and the selected checkpoint's verified share."""
    ref, sel = class_metrics(confusion(reference.rows)), class_metrics(confusion(selected.rows))
    n_ref = sum(c["n_predicted"] for c in ref)
    n_sel = sum(c["n_predicted"] for c in sel)
    by_ref, by_sel = {c["cls"]: c for c in ref}, {c["cls"]: c for c in sel}
    rows = []
    for cls in dict.fromkeys([*by_ref, *by_sel]):
        r, s = by_ref.get(cls) or {}, by_sel.get(cls) or {}
        rows.append({"run": selected.run, "split": selected.split, "seed": selected.seed, "cls": cls,
                     "checkpoint_reference": reference.checkpoint, "n_predicted_reference": r.get("n_predicted", 0),
                     "n_patches_reference": n_ref, "share_reference": rate_or_nan(r.get("n_predicted", 0), n_ref),
                     "checkpoint_selected": selected.checkpoint, "n_predicted_selected": s.get("n_predicted", 0),
                     "n_patches_selected": n_sel, "share_selected": rate_or_nan(s.get("n_predicted", 0), n_sel),
                     "n_verified_selected": s.get("n_verified", 0),
                     "verified_share_selected": rate_or_nan(s.get("n_verified", 0), n_sel)})
    return rows


def check_selection(evals: Mapping[Key, Evaluation], selection: Sequence[Mapping[str, Any]], where: str) -> None:
    """Every run and seed of these (test) evaluations has a val selection, and its selected checkpoint is among them."""
    chosen = {(s["run"], s["seed"]): s["checkpoint"] for s in selection}
    for run, seed in sorted({(k[0], k[3]) for k in evals}):
        if (run, seed) not in chosen:
            raise StatsInputError(f"{where}: no val checkpoint selection for run {run} seed {seed}")
        split = next(k[2] for k in evals if (k[0], k[3]) == (run, seed))
        if (run, chosen[run, seed], split, seed) not in evals:
            have = sorted(k[1] for k in evals if (k[0], k[3]) == (run, seed))
            raise StatsInputError(f"{where}: run {run} seed {seed}: the selected checkpoint {chosen[run, seed]} has "
                                  f"no {split} evaluation among the inputs (have {', '.join(have)})")



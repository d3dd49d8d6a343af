"""Statistics of the study: pass@1, paired tests, mechanism metrics, checkpoint selection, ablations, power.

This is the `predict stats`, `predict ablations`, `predict extensions` and `predict power` stages. Input: greedy
evaluation records (`results/eval/{run}/{checkpoint}/{split}/seed{seed}.parquet`, the per-trajectory schema of
`env/records.py`); output: parquet under `results/stats/` (val: `STATS_TABLES`), `results/test/stats/` (the frozen
test: `TEST_STATS_TABLES`), `results/ablations/` and `results/extensions/`. Rules:

* One code path for both splits (`study_stats`): the split is a column of every table. Val evaluations make the
  checkpoint selection; test evaluations are read against the VAL selection (``selection=``, never re-selected on
  test): per run and seed the selected checkpoint, and for the arms the reference (SFT) and any extra checkpoint.
* A rollout is scored (`scored_rows`) when ``ok`` and ``final_pass`` is not null; the others are infrastructure
  failures, counted in ``n_infra`` and left out of EVERY figure: pass@1, the mechanism metrics, the confusion matrix.
* pass@1 = mean ``final_pass`` over scored rollouts (one greedy sample per task). First-patch correctness: the
  first applied patch verified PASS; a rollout with no applied patch counts as a failure; denominator: all scored
  rollouts. Recovery: ``recovered`` over the rollouts whose first patch failed (its own denominator).
* Paired comparisons join two evaluations on (task_id, sample) and keep the tasks both scored; a task scored on one
  side only is counted (``n_only_a``/``n_only_b``) and logged. Exact McNemar (statsmodels, ``exact=True``) on the
  discordant counts ``n10`` (first passes, second fails) and ``n01``; p is NaN when no task is shared (no test ran),
  1.0 when no shared task is discordant. A seeded paired bootstrap of the difference (first - second): one
  [resamples, n] index matrix into the per-task difference vector, percentile CI. ``metric`` is ``final_pass``
  (pass@1) or ``first_patch_pass``. Holm-adjusted p-values (``mcnemar_p_holm``) within each ``family``: one kind,
  metric and split (and on val, one checkpoint).
* Pairs (``kind``): each arm's checkpoints vs its own reference checkpoint (SFT) per seed, on pass@1 and on
  first-patch correctness (``vs_reference``); A vs B for every seed pairing (val: at every common checkpoint; test:
  the selected checkpoints; ``A_vs_B``); each ablation vs its base arm (B) per seed (val: common checkpoints; test:
  selected ones; ``ablation_vs_base``). Recovery, whose denominators differ between the two sides, is compared
  unpaired: Fisher's exact test on (recovered, not recovered) x (first, second), both counts shown (``recovery`` table).
* Extensions (`extension_table`, one file per extension run): the run at its selected checkpoint vs Arm A and vs
  Arm B at theirs, per seed (McNemar + bootstrap, as for ablations), plus its mechanism metric (`EXTENSION_FOCUS`):
  expensive tests: ``calls_saved_per_solved`` (mean ``calls_used`` of solved rollouts, the counterpart's - the
  run's; the counterpart is the other arm at the same test cost) and ``revise_precision`` (REVISEd patches whose
  verified outcome was not PASS); edit on REVISE: ``edited_revise_pass`` (rollouts with ``ever_edited``) vs
  ``never_revised_pass``; decision masking: ``pred_freq_pass`` vs ``verified_freq_pass`` (and Arm B's); RFT:
  ``rft_minus_rl`` (pass@1 minus the same arm's RL run at its selected checkpoint).
* Ablations (`ablation_table`): the ablation and its base arm at their own selected checkpoints; Arm A's pass@1
  (the deficit) at Arm A's OWN selected checkpoint.
* Checkpoint selection reads only val (`predict.campaign.select_checkpoints`, whose docstring has its rules): the
  campaign module owns it, its settings' one default and the test campaign; the stats tables only use it.
* On test an arm's reference (SFT) is evaluated once, under the first seed (`predict.campaign.evaluation_seed`), and
  serves every seed's comparison with it.
* Power (`power_table`) matches the test that is run: ONE seed pairing (no test pools seeds) on n paired tasks,
  exact McNemar, two-sided, at level ``power.significance``. At discordance rate d (share of tasks where the two
  disagree) and pass@1 difference delta, the discordant count D ~ Binomial(n, d) and the first arm's wins among
  them W ~ Binomial(D, (1 + delta/d) / 2); power = sum over D of P(D) * P(McNemar rejects | D), computed exactly
  (per D the rejection region is two binomial tails; no simulation). Tasks are independent.

How each figure of the study comes out of the tables (`results/stats/*.parquet`, `results/test/stats/*.parquet`):

* headline (arm x seed x step, with p-values): ``metrics`` (``pass_at_1`` with ``n_pass`` of ``n_scored`` by
  run/checkpoint/split/seed; ``selected`` marks the val selection) and ``pairs`` (``mcnemar_p``, Holm,
  ``ci_low``/``ci_high`` by ``kind`` and ``metric``).
* first-patch correctness ``first_patch_pass`` (``n_first_patch_pass`` of ``n_scored``); recovery
  ``recovery_rate`` (``n_recovered`` of ``n_recovery``); RL vs SFT: ``pairs`` (metric ``first_patch_pass``) and
  ``recovery`` (Fisher).
* REVISE split: ``never_revised_n``/``ever_revised_n`` and ``never_revised_pass``/``ever_revised_pass`` (with
  ``never_revised_n_pass``/``ever_revised_n_pass``).
* REVISE on patches that would pass vs fail (verified, seen or shadow): ``revise_rate_pass_patches``,
  ``revise_rate_fail_patches`` with ``n_pass_patches``/``n_fail_patches`` and the REVISEd counts.
* budget: ``budget_exhausted_revise`` (of ``ever_revised_n``) vs ``budget_exhausted_keep`` (of the predictive
  arm's never-revised rollouts, ``n_keep_only``), with the exhausted counts.
* confusion matrix: ``confusion`` (``verified`` x ``predicted`` -> ``count``, patches of the predictive arm);
  precision/recall and frequencies: ``classes`` (``precision``, ``recall``, ``predicted_freq`` vs
  ``verified_freq`` per class); the SFT checkpoint's prediction shares vs the selected checkpoint's:
  ``prediction_shares``. Training-time shares come from the RL metrics (the report reads them).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from predict.campaign import DEFAULT_SELECTION, StatsInputError, select_checkpoints
from predict.env.records import patch_steps as record_patch_steps
from predict.outcomes import OUTCOMES

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
# Paired tests
# ---------------------------------------------------------------------------------------------------------------
def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> dict[str, Any]:
    """Exact McNemar on paired pass/fail vectors (statsmodels), with the discordant counts."""
    from statsmodels.stats.contingency_tables import mcnemar

    a, b = np.asarray(first, dtype=bool), np.asarray(second, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired vectors differ in length: {a.shape} vs {b.shape}")
    n11, n10 = int(np.sum(a & b)), int(np.sum(a & ~b))
    n01, n00 = int(np.sum(~a & b)), int(np.sum(~a & ~b))
    if a.size == 0:
        p = math.nan  # no shared task: no test was run, so there is no p-value (not "no difference")
    elif n10 + n01 == 0:
        p = 1.0  # shared tasks, none discordant: the exact test's p is 1
    else:
        p = float(mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue)
    return {"n": int(a.size), "n11": n11, "n10": n10, "n01": n01, "n00": n00, "mcnemar_p": p}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (statsmodels); NaN stays NaN and is not counted in the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return [float(x) for x in out]


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher's exact p of k_a/n_a vs k_b/n_b (scipy); NaN when a side is empty."""
    from scipy.stats import fisher_exact as scipy_fisher

    if not n_a or not n_b:
        return math.nan
    return float(scipy_fisher([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue)


def paired_bootstrap(
    first: Sequence[bool] | np.ndarray,
    second: Sequence[bool] | np.ndarray,
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, float]:
    """Percentile CI of mean(first) - mean(second), resampling tasks with replacement (the module docstring's
    bootstrap: one [resamples, n] index matrix from a seeded Generator)."""
    d = np.asarray(first, dtype=np.int8) - np.asarray(second, dtype=np.int8)
    n = d.size
    if n == 0:
        return {"diff": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n, size=(resamples, n), dtype=np.int32 if n < 2**31 else np.int64)
    means = d[index].sum(axis=1, dtype=np.int64) / n
    lo, hi = np.quantile(means, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return {"diff": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi)}


def paired_bootstrap_loop(first: Sequence[bool], second: Sequence[bool], resamples: int = 10_000, seed: int = 0,
                          ci: float = 0.95) -> dict[str, float]:
    """The same bootstrap as a Python loop (one resample at a time): the benchmark's baseline."""
    d = np.asarray(first, dtype=np.int8) - np.asarray(second, dtype=np.int8)
    rng = np.random.default_rng(seed)
    means = [float(d[rng.integers(0, d.size, size=d.size)].mean()) for _ in range(resamples)]
    lo, hi = np.quantile(means, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return {"diff": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi)}


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


def _rate(num: int, den: int) -> float:
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
        "pass_at_1": _rate(n_pass, len(scored)),
        "first_patch_pass": _rate(first_pass, len(scored)),  # no applied patch = a failure; of every task
        "n_first_patch_pass": first_pass,
        "n_with_patch": sum(r.get("first_patch_outcome") is not None for r in scored),
        "recovery_rate": _rate(sum(recovered), len(recovered)),
        "n_recovered": sum(recovered),
        "n_recovery": len(recovered),
        "never_revised_n": len(never),
        "ever_revised_n": len(ever),
        "never_revised_n_pass": never_pass,
        "ever_revised_n_pass": ever_pass,
        "never_revised_pass": _rate(never_pass, len(never)),
        "ever_revised_pass": _rate(ever_pass, len(ever)),
        "n_patches": len(patches),
        "n_decided_patches": len(decided),
        "n_revised_patches": revised,
        "n_pass_patches": len(pass_p),
        "n_fail_patches": len(fail_p),
        "n_revised_pass_patches": revised_pass,
        "n_revised_fail_patches": revised_fail,
        "revise_rate": _rate(revised, len(decided)),
        "revise_rate_pass_patches": _rate(revised_pass, len(pass_p)),
        "revise_rate_fail_patches": _rate(revised_fail, len(fail_p)),
        "n_budget_exhausted": exhausted,
        "budget_exhausted": _rate(exhausted, len(scored)),
        "n_budget_exhausted_revise": exhausted_ever,
        "budget_exhausted_revise": _rate(exhausted_ever, len(ever)),
        "n_keep_only": len(never_p),
        "n_budget_exhausted_keep": exhausted_keep,
        "budget_exhausted_keep": _rate(exhausted_keep, len(never_p)),
        "n_malformed_predictions": malformed,
        "malformed_prediction_rate": _rate(malformed, len(decided)),
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
            "precision": _rate(tp, predicted),
            "recall": _rate(tp, verified),
            "predicted_freq": _rate(predicted, total),
            "verified_freq": _rate(verified, total),
        })
    return out


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
    row["pass_a"], row["pass_b"] = _rate(row["n_pass_a"], row["n"]), _rate(row["n_pass_b"], row["n"])
    row.update(paired_bootstrap(va, vb, resamples=resamples, seed=seed, ci=ci))
    row["discordance"] = _rate(row["n10"] + row["n01"], row["n"])
    return row


Key = tuple[str, str, str, int]  # (run, checkpoint, split, seed)


def pair_plan(
    evals: Mapping[Key, Evaluation],
    arms: Sequence[str],
    ablations: Mapping[str, Mapping[str, Any]],
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
            base = str(ablations[run].get("base_arm", "B"))
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


def _table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema | None = None) -> pa.Table:
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
                     "n_patches_reference": n_ref, "share_reference": _rate(r.get("n_predicted", 0), n_ref),
                     "checkpoint_selected": selected.checkpoint, "n_predicted_selected": s.get("n_predicted", 0),
                     "n_patches_selected": n_sel, "share_selected": _rate(s.get("n_predicted", 0), n_sel),
                     "n_verified_selected": s.get("n_verified", 0),
                     "verified_share_selected": _rate(s.get("n_verified", 0), n_sel)})
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


CAMPAIGN_SCHEMA = pa.schema([
    ("campaign", pa.string()), ("config_hash", pa.string()), ("time", pa.string()), ("base_model", pa.string()),
    ("reason", pa.string()), ("results_dir", pa.string()), ("run_name", pa.string()), ("vllm_version", pa.string()),
    ("device", pa.string()), ("serving", pa.string()), ("n_planned", pa.int64()), ("n_done", pa.int64()),
    ("this", pa.bool_()),
])


def share_references(evals: dict[Key, Evaluation], arms: Sequence[str], reference: str | None) -> dict[Key, Evaluation]:
    """Test: an arm's reference is evaluated once, under the first seed; it serves every seed of the arm (the same
    Evaluation under each seed's key, so its rows and its seed stay those of its one file)."""
    out = dict(evals)
    for run in arms:
        refs = sorted(k for k in evals if k[0] == run and k[1] == reference)
        for _, _, split, seed in sorted({k for k in evals if k[0] == run}):
            if refs and (run, reference, split, seed) not in out:
                out[run, reference, split, seed] = evals[refs[0]]
    return out


def study_stats(
    paths: Sequence[str | Path | Evaluation],
    *,
    arms: Sequence[str],
    ablations: Mapping[str, Mapping[str, Any]] | None = None,
    extensions: Mapping[str, Mapping[str, Any]] | None = None,
    reference: str | None = "sft",
    selection_mode: str = DEFAULT_SELECTION["mode"],
    selection_step: int | None = DEFAULT_SELECTION["step"],
    selection: Sequence[Mapping[str, Any]] | None = None,
    campaigns: Sequence[Mapping[str, Any]] = (),
    default_test_cost: int = 1,
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, pa.Table]:
    """Every statistics table from a set of evaluation files of ONE split, keyed and ordered as `STATS_TABLES`
    (val: the selection is made here) or `TEST_STATS_TABLES` (test: `selection` is the val selection, required;
    the ablation and extension tables are made here too, and `campaigns`, the ledger's campaigns on this split from
    `predict.campaign.check_test_inputs`, becomes the campaigns table). `extensions`: name -> {"spec": ...,
    "counterpart": ...} (see `extension_table`)."""
    evals = load_evaluations(paths)
    splits = sorted({k[2] for k in evals})
    if len(splits) > 1:
        raise StatsInputError(f"evaluations of more than one split ({', '.join(splits)}): statistics are made per "
                              "split (val: results/stats/, test: results/test/stats/)")
    split = splits[0] if splits else "val"
    test = split == "test"
    if test and selection is None:
        raise StatsInputError("test evaluations are read against the val checkpoint selection: pass --selection "
                              "results/stats/selection.parquet")
    metrics, conf, classes = [], [], []
    for key, ev in sorted(evals.items()):
        ident = dict(zip(("run", "checkpoint", "split", "seed"), key, strict=True))
        protocols = ",".join(sorted(filter(None, {r.get("protocol") for r in ev.rows})))
        metrics.append({**ident, "protocol": protocols, **mechanism_metrics(ev.rows)})
        counts = confusion(ev.rows)
        conf += [{**ident, "verified": t, "predicted": p, "count": c} for (t, p), c in sorted(counts.items())]
        if counts:
            classes += [{**ident, **c} for c in class_metrics(counts)]
    files = list(evals.values())  # one per file: the per-run tables read these (a shared reference is no second file)
    if test:
        evals = share_references(evals, arms, reference)
    if selection is None:
        selection = select_checkpoints(metrics, selection_mode, selection_step)
    else:
        selection = [dict(s) for s in selection]
        check_selection(evals, selection, f"{split} statistics")
    selected = {(s["run"], s["seed"]): s["checkpoint"] for s in selection}
    for m in metrics:
        m["selected"] = selected.get((m["run"], m["seed"])) == m["checkpoint"]
    plan = pair_plan(evals, arms, ablations or {}, reference, selected if test else None)
    pairs = [compare(a, b, kind, resamples, seed, ci, metric)
             for kind, a, b in plan for metric in (METRICS if kind == "vs_reference" else ("final_pass",))]
    add_holm(pairs, selected)
    recovery = [recovery_row(a, b) for kind, a, b in plan if kind == "vs_reference"]
    shares = []
    for (run, seed_), ckpt in sorted(selected.items()):
        sel, ref = evals.get((run, ckpt, split, seed_)), evals.get((run, reference or "", split, seed_))
        if sel is not None and ref is not None and ref is not sel and confusion(sel.rows):
            shares += prediction_shares(ref, sel)
    tables = {
        "metrics": _table(metrics),
        "pairs": _table(pairs, PAIR_SCHEMA),
        "recovery": _table(recovery, RECOVERY_SCHEMA),
        "confusion": _table(conf, CONFUSION_SCHEMA),
        "classes": _table(classes, CLASS_SCHEMA),
        "prediction_shares": _table(shares, SHARES_SCHEMA),
        "selection": _table(selection, SELECTION_SCHEMA),
    }
    if test:
        runs = {k[0] for k in evals}
        tables["ablations"] = pa.concat_tables([ABLATION_SCHEMA.empty_table()] + [
            ablation_table(name, files, selection, base_arm=str(spec.get("base_arm", "B")),
                           split=split, resamples=resamples, seed=seed, ci=ci)
            for name, spec in (ablations or {}).items() if name in runs])
        tables["extensions"] = pa.concat_tables([EXTENSION_SCHEMA.empty_table()] + [
            extension_table(name, files, selection, spec=ext["spec"], counterpart=ext.get("counterpart"),
                            default_test_cost=default_test_cost, split=split, resamples=resamples, seed=seed, ci=ci)
            for name, ext in (extensions or {}).items() if name in runs])
        tables["campaigns"] = _table(campaigns, CAMPAIGN_SCHEMA)
    names = TEST_STATS_TABLES if test else STATS_TABLES
    assert tuple(tables) == names, (tuple(tables), names)  # the constants the rules read stay true
    return tables


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
    base_arm: str = "B",
    split: str = "val",
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
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
    return _table(rows, ABLATION_SCHEMA)


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


def extension_mechanism(spec: Mapping[str, Any], default_test_cost: int = 1) -> str:
    """Which mechanism an extension run exists for: rft, test_cost, edit_on_revise or mask_decision."""
    if spec.get("trainer") == "rft":
        return "rft"
    if int(spec.get("test_cost", default_test_cost)) != default_test_cost:
        return "test_cost"
    if spec.get("variant") == "edit_on_revise":
        return "edit_on_revise"
    if spec.get("mask_decision"):
        return "mask_decision"
    return "none"


def calls_per_solved(rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean ``calls_used`` over the rollouts that passed."""
    solved = [int(r.get("calls_used") or 0) for r in scored_rows(rows) if r["final_pass"]]
    return _rate(sum(solved), len(solved))


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
    spec: Mapping[str, Any],
    counterpart: str | None = None,
    default_test_cost: int = 1,
    split: str = "val",
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> pa.Table:
    """A row per seed: the extension run at its selected checkpoint against Arm A and Arm B at theirs (McNemar,
    bootstrap), and its mechanism metric (`EXTENSION_FOCUS`). `spec`: the run's base_arm, test_cost, variant,
    mask_decision, trainer (`predict.runs.RunSpec` fields); `counterpart`: the run whose calls per solved task the
    expensive-tests metric subtracts from (the other arm at the same test cost; default the other base arm)."""
    evals = load_evaluations(paths)
    chosen = {(s["run"], s["seed"]): s for s in selection}
    base_arm = str(spec.get("base_arm") or spec.get("arm") or "B")
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
                               "test_cost": int(spec.get("test_cost", default_test_cost)),
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
        row["revise_precision"] = _rate(m_ext["n_revised_fail_patches"], m_ext["n_revised_patches"])
        row["n_revised_patches"] = m_ext["n_revised_patches"]
        edited = [bool(r["final_pass"]) for r in scored_rows(ext.rows) if r.get("ever_edited")]
        row |= {"edited_revise_pass": _rate(sum(edited), len(edited)), "n_edited": len(edited),
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
    return _table(rows, EXTENSION_SCHEMA)


# ---------------------------------------------------------------------------------------------------------------
# Power
# ---------------------------------------------------------------------------------------------------------------
def mcnemar_exact_p(wins: np.ndarray, discordant: np.ndarray) -> np.ndarray:
    """Vectorised exact McNemar p-value: two-sided binomial test of `wins` of `discordant` at 1/2
    (the statsmodels statistic, min(n10, n01), doubled and capped at 1)."""
    from scipy.stats import binom

    wins, discordant = np.asarray(wins), np.asarray(discordant)
    k = np.minimum(wins, discordant - wins)
    p = np.minimum(1.0, 2.0 * binom.cdf(k, discordant, 0.5))
    return np.where(discordant > 0, p, 1.0)


def rejection_bound(discordant: np.ndarray, significance: float) -> np.ndarray:
    """Per discordant count D, the largest k such that exact McNemar rejects (p < significance) when the smaller
    discordant count is k; -1 when no outcome of D rejects. Found from the binomial quantile, then checked against
    the p-value itself on both sides so no rounding of the quantile can move it."""
    from scipy.stats import binom

    d = np.asarray(discordant, dtype=np.int64)
    k = np.asarray(binom.ppf(significance / 2, d, 0.5), dtype=np.int64) - 1
    k = np.clip(k, -1, d // 2)
    for _ in range(2):  # at most one step either way
        down = (k >= 0) & (mcnemar_exact_p(np.maximum(k, 0), d) >= significance)
        k = np.where(down, k - 1, k)
        up = (k + 1 <= d // 2) & (mcnemar_exact_p(np.minimum(k + 1, d // 2), d) < significance)
        k = np.where(up, k + 1, k)
    return k


def exact_power(delta: float, discordance: float, n_tasks: int, significance: float) -> float:
    """The module docstring's power on one pairing of `n_tasks` tasks: sum_D P(D) * P(W <= k_D or W >= D - k_D)
    with k_D = `rejection_bound`."""
    from scipy.stats import binom

    if delta > discordance:
        return math.nan  # a difference larger than the disagreement is impossible
    d = np.arange(n_tasks + 1)
    k = rejection_bound(d, significance)
    q = (1 + delta / discordance) / 2
    reject = np.where(k >= 0, binom.cdf(k, d, q) + binom.sf(d - k - 1, d, q), 0.0)
    return float(np.clip(np.sum(binom.pmf(d, n_tasks, discordance) * reject), 0.0, 1.0))


POWER_SCHEMA = pa.schema([
    ("delta", pa.float64()), ("discordance", pa.float64()), ("discordance_source", pa.string()),
    ("n_tasks", pa.int64()), ("design", pa.string()), ("significance", pa.float64()), ("power", pa.float64()),
    ("powered", pa.bool_()), ("study_design", pa.bool_()), ("family_size", pa.int64()),
    ("holm_significance", pa.float64()), ("power_holm", pa.float64()), ("powered_holm", pa.bool_()),
])


def power_table(
    *,
    deltas: Sequence[float],
    discordances: Mapping[str, Sequence[float]],
    tasks: Sequence[int],
    significance: float = 0.05,
    target: float = 0.8,
    study_tasks: int | None = None,
    val_tasks: int | None = None,
    family_size: int = 1,
) -> pa.Table:
    """`exact_power` per delta x discordance x number of tasks; ``design`` names the study's own sizes (``test``:
    `study_tasks`, ``study_design`` true; ``val``: `val_tasks`), so "was the study powered?" is one filter. Beside
    the single test's power, ``power_holm`` is the power of one test of the family the report Holm-adjusts
    (`family_size` tests: the A-vs-B family has one per seed pairing) at the family's first Holm level,
    significance / family_size: the most lenient level any test of the family is held to."""
    sizes = {n: "grid" for n in tasks}
    if val_tasks:
        sizes[val_tasks] = "val"
    if study_tasks:
        sizes[study_tasks] = "test"
    rows = []
    for source, rates in discordances.items():
        for d, delta, n in itertools.product(rates, deltas, sorted(sizes)):
            power = exact_power(delta, d, n, significance)
            holm_level = significance / family_size
            power_holm = power if family_size == 1 else exact_power(delta, d, n, holm_level)
            rows.append({
                "delta": float(delta), "discordance": float(d), "discordance_source": source,
                "n_tasks": n, "design": sizes[n], "significance": float(significance), "power": power,
                "powered": power >= target,  # NaN (an impossible delta): not powered
                "study_design": sizes[n] == "test", "family_size": int(family_size),
                "holm_significance": float(holm_level), "power_holm": power_holm, "powered_holm": power_holm >= target,
            })
    return _table(rows, POWER_SCHEMA)


def observed_discordance(pairs: pa.Table, kind: str = "A_vs_B") -> list[float]:
    """The discordance rates of the study's own pairs of one kind (rounded to 0.01, distinct, non-zero)."""
    rates = [r["discordance"] for r in pairs.to_pylist() if r["kind"] == kind and r["n"]]
    return sorted({round(x, 2) for x in rates if x and not math.isnan(x)})

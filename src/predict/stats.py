"""Statistics of the study: pass@1, paired tests, mechanism metrics, checkpoint selection, ablations, power.

This is the `predict stats`, `predict ablations` and `predict power` stages. Input: greedy evaluation records
(`results/eval/{run}/{checkpoint}/{split}/seed{seed}.parquet`, the per-trajectory schema of `env/records.py`);
output: parquet under `results/stats/` and `results/ablations/`. Rules:

* pass@1 = mean ``final_pass`` over the rollouts with a verdict (one greedy sample per task); rows with
  ``ok == False`` or a null ``final_pass`` are infrastructure failures: counted in ``n_infra``, left out.
* Paired comparisons join two evaluations on (task_id, sample) and keep the tasks both scored. Exact McNemar
  (statsmodels, ``exact=True``) on the discordant counts ``n10`` (first passes, second fails) and ``n01``; a
  seeded paired bootstrap of the pass@1 difference (first - second): one [resamples, n] index matrix into the
  per-task difference vector, percentile CI. Pairs (`PAIR_KINDS`): each arm's checkpoints vs its own reference
  checkpoint (SFT) per seed; A vs B at every common checkpoint for every seed pairing; each ablation vs its base
  arm (B) per seed at every common checkpoint.
* Checkpoint selection reads only val: ``fixed`` takes ``step{N}``; ``best_val`` the step checkpoint with the
  highest val pass@1 (ties: the earlier step). A run with no step checkpoint falls back to its last evaluated
  checkpoint (``fallback=True`` in the table): the base stand-in of a branch without trained checkpoints.
* Power (`power_table`): the probability that exact McNemar at level alpha detects a pass@1 difference delta
  at discordance rate d (share of tasks where the two arms disagree), by simulation: per pair the discordant
  count D ~ Binomial(n_tasks * n_seeds, d) and the first arm's wins ~ Binomial(D, (1 + delta/d) / 2). Seeds are
  pooled as independent replicates of the task set (an optimistic approximation: tasks repeat across seeds).

How each figure of the study comes out of the tables (`results/stats/*.parquet`):

* headline (arm x seed x step, with p-values): ``metrics`` (``pass_at_1`` by run/checkpoint/split/seed) and
  ``pairs`` (``mcnemar_p``, ``ci_low``/``ci_high`` by ``kind``).
* first-patch correctness ``first_patch_pass`` (share of rollouts with a patch whose first applied patch
  verified PASS); recovery ``recovery_rate`` (mean non-null ``recovered``).
* REVISE split: ``never_revised_n``/``ever_revised_n`` and ``never_revised_pass``/``ever_revised_pass``.
* REVISE on patches that would pass vs fail (verified, seen or shadow): ``revise_rate_pass_patches``,
  ``revise_rate_fail_patches`` with ``n_pass_patches``/``n_fail_patches``.
* budget: ``budget_exhausted_revise`` (ever-revised rollouts) vs ``budget_exhausted_keep`` (never-revised).
* confusion matrix: ``confusion`` (``verified`` x ``predicted`` -> ``count``, patches of the predictive arm);
  precision/recall and frequencies: ``classes`` (``precision``, ``recall``, ``predicted_freq`` vs
  ``verified_freq`` per class). Training-time frequencies come from the RL metrics (the report reads them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from predict.env.records import patch_steps as record_patch_steps
from predict.outcomes import OUTCOMES

PASS = "PASS"
MALFORMED = "MALFORMED"
PAIR_KINDS: tuple[str, ...] = ("vs_reference", "A_vs_B", "ablation_vs_base")
EVAL_PATH = re.compile(r"(?P<run>[^/]+)/(?P<checkpoint>[^/]+)/(?P<split>[^/]+)/seed(?P<seed>-?\d+)\.parquet$")
STEP = re.compile(r"^step(\d+)$")


class StatsInputError(ValueError):
    """An evaluation file is missing, misnamed or disagrees with its path."""


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
    p = float(mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue) if n10 + n01 else 1.0
    return {"n": int(a.size), "n11": n11, "n10": n10, "n01": n01, "n00": n00, "mcnemar_p": p}


def paired_bootstrap(
    first: Sequence[bool] | np.ndarray,
    second: Sequence[bool] | np.ndarray,
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, float]:
    """Percentile CI of mean(first) - mean(second), resampling tasks with replacement, vectorised: one
    [resamples, n] index matrix from a seeded Generator into the per-task difference vector."""
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

    def scored(self) -> dict[tuple[int, int], bool]:
        """(task_id, sample) -> final_pass, for rollouts with a verdict."""
        return {
            (r["task_id"], r["sample"]): bool(r["final_pass"])
            for r in self.rows
            if r.get("ok", True) and r.get("final_pass") is not None
        }


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


def patch_steps(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every applied patch (one per patch, not per prediction step; edit-on-REVISE replacements included), with
    its rollout's protocol."""
    return [{**s, "protocol": r.get("protocol")} for r in rows for s in record_patch_steps(r.get("steps") or [])]


def _rate(num: int, den: int) -> float:
    return num / den if den else math.nan


def mechanism_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mechanism columns of one evaluation (see the module docstring)."""
    scored = [r for r in rows if r.get("ok", True) and r.get("final_pass") is not None]
    passed = [bool(r["final_pass"]) for r in scored]
    with_patch = [r for r in scored if r.get("first_patch_outcome") is not None]
    recovered = [bool(r["recovered"]) for r in scored if r.get("recovered") is not None]
    never = [r for r in scored if not r.get("ever_revised")]
    ever = [r for r in scored if r.get("ever_revised")]
    patches = [s for s in patch_steps(scored) if s.get("outcome") is not None]
    decided = [s for s in patches if s.get("decision") is not None]
    pass_p = [s for s in decided if s["outcome"] == PASS]
    fail_p = [s for s in decided if s["outcome"] != PASS]
    never_p = [r for r in never if r.get("protocol") == "predictive"]  # KEEP-only rollouts of the predictive arm
    return {
        "n": len(rows),
        "n_scored": len(scored),
        "n_infra": len(rows) - len(scored),
        "n_pass": sum(passed),
        "pass_at_1": _rate(sum(passed), len(scored)),
        "first_patch_pass": _rate(sum(r["first_patch_outcome"] == PASS for r in with_patch), len(with_patch)),
        "n_with_patch": len(with_patch),
        "recovery_rate": _rate(sum(recovered), len(recovered)),
        "n_recovery": len(recovered),
        "never_revised_n": len(never),
        "ever_revised_n": len(ever),
        "never_revised_pass": _rate(sum(bool(r["final_pass"]) for r in never), len(never)),
        "ever_revised_pass": _rate(sum(bool(r["final_pass"]) for r in ever), len(ever)),
        "n_patches": len(patches),
        "n_pass_patches": len(pass_p),
        "n_fail_patches": len(fail_p),
        "revise_rate": _rate(sum(s["decision"] == "REVISE" for s in decided), len(decided)),
        "revise_rate_pass_patches": _rate(sum(s["decision"] == "REVISE" for s in pass_p), len(pass_p)),
        "revise_rate_fail_patches": _rate(sum(s["decision"] == "REVISE" for s in fail_p), len(fail_p)),
        "budget_exhausted": _rate(sum(bool(r.get("budget_exhausted")) for r in scored), len(scored)),
        "budget_exhausted_revise": _rate(sum(bool(r.get("budget_exhausted")) for r in ever), len(ever)),
        "budget_exhausted_keep": _rate(sum(bool(r.get("budget_exhausted")) for r in never_p), len(never_p)),
        "malformed_prediction_rate": _rate(sum(s.get("prediction") == MALFORMED for s in decided), len(decided)),
    }


def confusion(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(verified, predicted) -> patches, over applied patches with both a prediction and a verified outcome."""
    counts: dict[tuple[str, str], int] = {}
    for s in patch_steps(rows):
        if s.get("prediction") is not None and s.get("outcome") is not None:
            key = (s["outcome"], s["prediction"])
            counts[key] = counts.get(key, 0) + 1
    return counts


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
def compare(first: Evaluation, second: Evaluation, kind: str, resamples: int, seed: int, ci: float) -> dict[str, Any]:
    """One paired comparison row: first vs second on the tasks both scored."""
    a, b = first.scored(), second.scored()
    keys = sorted(set(a) & set(b))
    va = np.array([a[k] for k in keys], dtype=bool)
    vb = np.array([b[k] for k in keys], dtype=bool)
    row: dict[str, Any] = {"kind": kind, "split": first.split}
    for side, ev in (("a", first), ("b", second)):
        row.update({f"run_{side}": ev.run, f"checkpoint_{side}": ev.checkpoint, f"seed_{side}": ev.seed})
    row.update(mcnemar_exact(va, vb))
    row["pass_a"] = float(va.mean()) if keys else math.nan
    row["pass_b"] = float(vb.mean()) if keys else math.nan
    row.update(paired_bootstrap(va, vb, resamples=resamples, seed=seed, ci=ci))
    row["discordance"] = _rate(row["n10"] + row["n01"], row["n"])
    return row


def pair_plan(
    evals: Mapping[tuple[str, str, str, int], Evaluation],
    arms: Sequence[str],
    ablations: Mapping[str, Mapping[str, Any]],
    reference: str | None,
) -> list[tuple[str, Evaluation, Evaluation]]:
    """Which evaluations are compared (see the module docstring), in a stable order."""
    plan: list[tuple[str, Evaluation, Evaluation]] = []
    keys = sorted(evals)
    for run, ckpt, split, seed in keys:
        if run in arms and reference and ckpt != reference and (run, reference, split, seed) in evals:
            plan.append(("vs_reference", evals[run, ckpt, split, seed], evals[run, reference, split, seed]))
    if "A" in arms and "B" in arms:
        for run, ckpt, split, seed in keys:
            if run != "A":
                continue
            for _, ckpt_b, split_b, seed_b in [k for k in keys if k[0] == "B" and k[1:3] == (ckpt, split)]:
                plan.append(("A_vs_B", evals[run, ckpt, split, seed], evals["B", ckpt_b, split_b, seed_b]))
    for run, ckpt, split, seed in keys:
        if run in ablations:
            base = str(ablations[run].get("base_arm", "B"))
            if (base, ckpt, split, seed) in evals:
                plan.append(("ablation_vs_base", evals[run, ckpt, split, seed], evals[base, ckpt, split, seed]))
    return plan


def step_of(checkpoint: str) -> int | None:
    m = STEP.match(checkpoint)
    return int(m.group(1)) if m else None


def select_checkpoints(metrics: Sequence[Mapping[str, Any]], mode: str, step: int | None) -> list[dict[str, Any]]:
    """Per run and seed, the checkpoint selection reads on val only (see the module docstring)."""
    val = [m for m in metrics if m["split"] == "val"]
    out = []
    for run, seed in sorted({(m["run"], m["seed"]) for m in val}):
        mine = [m for m in val if (m["run"], m["seed"]) == (run, seed)]
        steps = sorted((step_of(m["checkpoint"]), m) for m in mine if step_of(m["checkpoint"]) is not None)
        chosen, fallback = None, False
        if mode == "fixed":
            chosen = next((m for s, m in steps if s == step), None)
        elif mode == "best_val":
            if steps:
                chosen = max((m for _, m in steps), key=lambda m: (m["pass_at_1"], -step_of(m["checkpoint"])))
        else:
            raise ValueError(f"evaluation.selection.mode: {mode!r} is neither fixed nor best_val")
        if chosen is None:
            if steps:
                raise StatsInputError(f"run {run} seed {seed}: selection step{step} was not evaluated on val "
                                      f"(have {', '.join(m['checkpoint'] for _, m in steps)})")
            chosen, fallback = mine[-1], True
        out.append({"run": run, "seed": seed, "mode": mode, "step": step, "checkpoint": chosen["checkpoint"],
                    "val_pass_at_1": chosen["pass_at_1"], "fallback": fallback})
    return out


PAIR_SCHEMA = pa.schema([
    ("kind", pa.string()), ("split", pa.string()),
    ("run_a", pa.string()), ("checkpoint_a", pa.string()), ("seed_a", pa.int64()),
    ("run_b", pa.string()), ("checkpoint_b", pa.string()), ("seed_b", pa.int64()),
    ("n", pa.int64()), ("n11", pa.int64()), ("n10", pa.int64()), ("n01", pa.int64()), ("n00", pa.int64()),
    ("mcnemar_p", pa.float64()), ("pass_a", pa.float64()), ("pass_b", pa.float64()),
    ("diff", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("discordance", pa.float64()),
])
ID_FIELDS = [("run", pa.string()), ("checkpoint", pa.string()), ("split", pa.string()), ("seed", pa.int64())]
SELECTION_SCHEMA = pa.schema([
    ("run", pa.string()), ("seed", pa.int64()), ("mode", pa.string()), ("step", pa.int64()),
    ("checkpoint", pa.string()), ("val_pass_at_1", pa.float64()), ("fallback", pa.bool_()),
])


def _table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema | None = None) -> pa.Table:
    if schema is not None:
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    return pa.Table.from_pylist([dict(r) for r in rows])


def study_stats(
    paths: Sequence[str | Path],
    *,
    arms: Sequence[str],
    ablations: Mapping[str, Mapping[str, Any]] | None = None,
    reference: str | None = "sft",
    selection_mode: str = "fixed",
    selection_step: int | None = 100,
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, pa.Table]:
    """Every statistics table from a set of evaluation files: metrics, pairs, confusion, classes, selection."""
    evals: dict[tuple[str, str, str, int], Evaluation] = {}
    for path in paths:
        ev = read_evaluation(path)
        if ev.key in evals:
            raise StatsInputError(f"{path}: a second file for run/checkpoint/split/seed {ev.key}")
        evals[ev.key] = ev
    metrics, conf, classes = [], [], []
    for key, ev in sorted(evals.items()):
        ident = dict(zip(("run", "checkpoint", "split", "seed"), key, strict=True))
        protocols = {r.get("protocol") for r in ev.rows}
        metrics.append({**ident, "protocol": ",".join(sorted(p for p in protocols if p)),
                        **mechanism_metrics(ev.rows)})
        counts = confusion(ev.rows)
        conf += [{**ident, "verified": t, "predicted": p, "count": c} for (t, p), c in sorted(counts.items())]
        if counts:
            classes += [{**ident, **c} for c in class_metrics(counts)]
    plan = pair_plan(evals, arms, ablations or {}, reference)
    pairs = [compare(a, b, kind, resamples, seed, ci) for kind, a, b in plan]
    selection = select_checkpoints(metrics, selection_mode, selection_step)
    conf_schema = pa.schema([*ID_FIELDS, ("verified", pa.string()), ("predicted", pa.string()), ("count", pa.int64())])
    class_schema = pa.schema([*ID_FIELDS, ("cls", pa.string()), ("n_predicted", pa.int64()), ("n_verified", pa.int64()),
                              ("precision", pa.float64()), ("recall", pa.float64()), ("predicted_freq", pa.float64()),
                              ("verified_freq", pa.float64())])
    return {
        "metrics": _table(metrics),
        "pairs": _table(pairs, PAIR_SCHEMA),
        "confusion": _table(conf, conf_schema),
        "classes": _table(classes, class_schema),
        "selection": _table(selection, SELECTION_SCHEMA),
    }


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
    ("ablation", pa.string()), ("seed", pa.int64()), ("checkpoint", pa.string()), ("base_arm", pa.string()),
    ("base_checkpoint", pa.string()), ("n", pa.int64()), ("pass_ablation", pa.float64()), ("pass_base", pa.float64()),
    ("pass_A", pa.float64()), ("diff", pa.float64()), ("n10", pa.int64()), ("n01", pa.int64()),
    ("mcnemar_p", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()),
    ("focus_metric", pa.string()), ("focus_ablation", pa.float64()), ("focus_base", pa.float64()),
    ("runtime_error_recall_ablation", pa.float64()), ("runtime_error_recall_base", pa.float64()),
    ("revise_rate_ablation", pa.float64()), ("revise_rate_base", pa.float64()),
    ("budget_exhausted_ablation", pa.float64()), ("budget_exhausted_base", pa.float64()),
    ("deficit_vs_A_ablation", pa.float64()), ("deficit_vs_A_base", pa.float64()),
    ("selection_fallback", pa.bool_()),
])


def ablation_table(
    ablation: str,
    paths: Sequence[str | Path],
    selection: Sequence[Mapping[str, Any]],
    *,
    base_arm: str = "B",
    resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> pa.Table:
    """A row per seed: the ablation's and the base arm's pass@1 at their selected checkpoints, the paired tests,
    and the metric the ablation exists for (`ABLATION_FOCUS`)."""
    evals = {ev.key: ev for ev in map(read_evaluation, paths)}
    chosen = {(s["run"], s["seed"]): s for s in selection}
    rows = []
    for seed_ in sorted({k[3] for k in evals if k[0] == ablation}):
        sel, sel_base = chosen.get((ablation, seed_)), chosen.get((base_arm, seed_))
        if sel is None or sel_base is None:
            raise StatsInputError(f"ablation {ablation} seed {seed_}: no checkpoint selection for "
                                  f"{ablation if sel is None else base_arm}")
        abl = evals.get((ablation, sel["checkpoint"], "val", seed_))
        base = evals.get((base_arm, sel_base["checkpoint"], "val", seed_))
        if abl is None or base is None:
            raise StatsInputError(f"ablation {ablation} seed {seed_}: the selected val evaluation is not among the "
                                  f"inputs ({ablation}/{sel['checkpoint']}, {base_arm}/{sel_base['checkpoint']})")
        arm_a = evals.get(("A", sel_base["checkpoint"], "val", seed_))
        pair = compare(abl, base, "ablation_vs_base", resamples, seed, ci)
        m_abl, m_base = mechanism_metrics(abl.rows), mechanism_metrics(base.rows)
        pass_a = mechanism_metrics(arm_a.rows)["pass_at_1"] if arm_a else math.nan

        def rte(ev: Evaluation) -> float:
            return next((c["recall"] for c in class_metrics(confusion(ev.rows)) if c["cls"] == "RUNTIME_ERROR"),
                        math.nan)

        row = {
            "ablation": ablation, "seed": seed_, "checkpoint": abl.checkpoint, "base_arm": base_arm,
            "base_checkpoint": base.checkpoint, "n": pair["n"], "pass_ablation": m_abl["pass_at_1"],
            "pass_base": m_base["pass_at_1"], "pass_A": pass_a, "diff": pair["diff"], "n10": pair["n10"],
            "n01": pair["n01"], "mcnemar_p": pair["mcnemar_p"], "ci_low": pair["ci_low"], "ci_high": pair["ci_high"],
            "runtime_error_recall_ablation": rte(abl), "runtime_error_recall_base": rte(base),
            "revise_rate_ablation": m_abl["revise_rate"], "revise_rate_base": m_base["revise_rate"],
            "budget_exhausted_ablation": m_abl["budget_exhausted"], "budget_exhausted_base": m_base["budget_exhausted"],
            "deficit_vs_A_ablation": pass_a - m_abl["pass_at_1"], "deficit_vs_A_base": pass_a - m_base["pass_at_1"],
            "selection_fallback": bool(sel["fallback"] or sel_base["fallback"]),
        }
        focus = ABLATION_FOCUS.get(ablation, ("pass_at_1", ""))[0]
        pick = {"runtime_error_recall": ("runtime_error_recall_ablation", "runtime_error_recall_base"),
                "pass_at_1": ("pass_ablation", "pass_base"),
                "deficit_vs_A": ("deficit_vs_A_ablation", "deficit_vs_A_base")}[focus]
        row.update({"focus_metric": focus, "focus_ablation": row[pick[0]], "focus_base": row[pick[1]]})
        rows.append(row)
    return _table(rows, ABLATION_SCHEMA)


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


def simulate_power(delta: float, discordance: float, n_pairs: int, simulations: int, alpha: float,
                   rng: np.random.Generator) -> float:
    """Share of simulated studies (n_pairs paired tasks) whose exact McNemar rejects at alpha."""
    if delta > discordance:
        return math.nan  # a difference larger than the disagreement is impossible
    d = rng.binomial(n_pairs, discordance, size=simulations)
    wins = rng.binomial(d, (1 + delta / discordance) / 2)
    return float(np.mean(mcnemar_exact_p(wins, d) < alpha))


POWER_SCHEMA = pa.schema([
    ("delta", pa.float64()), ("discordance", pa.float64()), ("discordance_source", pa.string()),
    ("n_tasks", pa.int64()), ("n_seeds", pa.int64()), ("n_pairs", pa.int64()), ("power", pa.float64()),
    ("powered", pa.bool_()), ("study_design", pa.bool_()),
])


def power_table(
    *,
    deltas: Sequence[float],
    discordances: Mapping[str, Sequence[float]],
    tasks: Sequence[int],
    seeds: Sequence[int],
    simulations: int = 2000,
    alpha: float = 0.05,
    target: float = 0.8,
    study_tasks: int | None = None,
    study_seeds: int | None = None,
    seed: int = 0,
) -> pa.Table:
    """Power of exact McNemar per delta x discordance x tasks x seeds; `study_design` marks the study's own size
    (its test tasks and seeds), so "was the study powered?" is one filter."""
    rng = np.random.default_rng(seed)
    task_grid = sorted({*tasks, *([study_tasks] if study_tasks else [])})
    seed_grid = sorted({*seeds, *([study_seeds] if study_seeds else [])})
    rows = []
    for source, rates in discordances.items():
        for d in rates:
            for delta in deltas:
                for n in task_grid:
                    for s in seed_grid:
                        power = simulate_power(delta, d, n * s, simulations, alpha, rng)
                        rows.append({
                            "delta": float(delta), "discordance": float(d), "discordance_source": source,
                            "n_tasks": n, "n_seeds": s, "n_pairs": n * s, "power": power,
                            "powered": bool(power >= target) if not math.isnan(power) else False,
                            "study_design": n == study_tasks and s == study_seeds,
                        })
    return _table(rows, POWER_SCHEMA)


def observed_discordance(pairs: pa.Table, kind: str = "A_vs_B") -> list[float]:
    """The discordance rates of the study's own pairs of one kind (rounded to 0.01, distinct, non-zero)."""
    rates = [r["discordance"] for r in pairs.to_pylist() if r["kind"] == kind and r["n"]]
    return sorted({round(x, 2) for x in rates if x and not math.isnan(x)})

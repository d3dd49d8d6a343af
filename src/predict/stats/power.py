"""`predict power`: the exact power of the test that is run (one seed pairing, exact McNemar), at its Holm level in
the A-vs-B family and in the open question's family (predict.stats.open_question.family_size)."""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from predict.stats.pairs import rows_table

if TYPE_CHECKING:
    from predict.stages import StageSettings


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
    significance: float,
    target: float,
    study_tasks: int | None = None,
    val_tasks: int | None = None,
    family_size: int = 1,
) -> pa.Table:
    """`exact_power` per delta x discordance x number of tasks; ``design`` names the study's own sizes (``test``:
    `study_tasks`, ``study_design`` true; ``val``: `val_tasks`), so "was the study powered?" is one filter. Beside
    the single test's power, ``power_holm`` is the power of one test of the family the report Holm-adjusts
    (`family_size` tests: the A-vs-B family has one per seed pairing) at the family's first Holm level,
    significance / family_size: the strictest level any test of the family is held to (Holm's step-down holds the
    others to significance / (family_size - k) for the k-th smallest p-value, up to significance). A test that
    rejects there is rejected by Holm whatever the others do, so ``power_holm`` is a lower bound of that test's
    power under Holm, which lies between it and ``power`` (the report says "at least")."""
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
    return rows_table(rows, POWER_SCHEMA)


def observed_discordance(pairs: pa.Table, kind: str = "A_vs_B") -> list[float]:
    """The discordance rates of the study's own pairs of one kind (rounded to 0.01, distinct, non-zero)."""
    rates = [r["discordance"] for r in pairs.to_pylist() if r["kind"] == kind and r["n"]]
    return sorted({round(x, 2) for x in rates if x and not math.isnan(x)})


OPEN_QUESTION_POWER_FIELDS = [
    ("family_size_open_question", pa.int64()), ("holm_significance_open_question", pa.float64()),
    ("power_open_question", pa.float64()), ("powered_open_question", pa.bool_()),
]


def with_open_question_power(table: pa.Table, family: int, **power_args: Any) -> pa.Table:
    """The power table (`predict.stats.power_table` of `power_args`) with the power of one test of the open
    question's family of `family` tests: that table's ``power_holm`` at family_size `family`, row for row."""
    if family < 1:  # no environment: no test, no power
        values = {name: [None] * table.num_rows for name, _ in OPEN_QUESTION_POWER_FIELDS}
    else:
        ours = power_table(**power_args, family_size=family)
        ident = ["delta", "discordance", "discordance_source", "n_tasks"]
        if ours.select(ident).to_pylist() != table.select(ident).to_pylist():
            raise ValueError("with_open_question_power: the power table was not made from these power_args")
        # power_table's family columns, under this family's names
        values = {f"{ours_name}_open_question": ours.column(theirs).to_pylist() for ours_name, theirs in (
            ("family_size", "family_size"), ("holm_significance", "holm_significance"), ("power", "power_holm"),
            ("powered", "powered_holm"))}
    for name, kind in OPEN_QUESTION_POWER_FIELDS:
        table = table.append_column(pa.field(name, kind), pa.array(values[name], kind))
    return table


# `predict power`
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", default=None, help="pairs.parquet: adds the observed A vs B discordance rates")
    p.add_argument("--open-question-family", type=int, default=0,
                   help="tests in the open question's Holm family (predict.stats.open_question.family_size); 0: none")
    p.add_argument("--out", required=True)


def main(args: argparse.Namespace, config: StageSettings) -> int:
    import pyarrow.parquet as pq

    from predict.outputs import console, write_table

    p, sizes = config.power, config.data.sizes
    discordances = {"config": p.discordance}
    val_tasks = None  # data.sizes has no val (val takes the remainder): the evaluations' n tells it
    if args.pairs:
        pairs = pq.read_table(args.pairs)
        if observed := observed_discordance(pairs):
            discordances["observed A vs B"] = observed
        val_tasks = val_tasks or max((int(n) for n in pairs.column("n").to_pylist()), default=None)  # val's n
    # The report Holm-adjusts A vs B over every seed pairing: that family's size.
    grid = {"deltas": p.deltas, "discordances": discordances, "tasks": p.tasks, "significance": p.significance,
            "target": p.target, "study_tasks": sizes.test, "val_tasks": val_tasks}
    table = power_table(**grid, family_size=len(config.seeds) ** 2)
    # and of one test of the open question's family (its size: the rule's flag, from the run matrix)
    table = with_open_question_power(table, args.open_question_family, **grid)
    write_table(table, args.out)
    console.print(f"power: {table.num_rows} rows -> {args.out}")
    return 0

"""The exact paired tests and intervals every statistics table uses: exact McNemar (statsmodels), Holm, Fisher's
exact test (scipy) and the seeded, vectorised paired bootstrap (numpy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


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
    *,
    resamples: int,
    seed: int,
    ci: float,
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


def paired_bootstrap_loop(first: Sequence[bool], second: Sequence[bool], *, resamples: int, seed: int,
                          ci: float) -> dict[str, float]:
    """The same bootstrap as a Python loop (one resample at a time): the benchmark's baseline."""
    d = np.asarray(first, dtype=np.int8) - np.asarray(second, dtype=np.int8)
    rng = np.random.default_rng(seed)
    means = [float(d[rng.integers(0, d.size, size=d.size)].mean()) for _ in range(resamples)]
    lo, hi = np.quantile(means, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return {"diff": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi)}



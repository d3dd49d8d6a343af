"""Statistics: the writeup's figures come back from synthetic records; McNemar and the bootstrap agree with scipy;
pairs, selection, ablation rows and the power table behave."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap

from predict.stats import (
    ablation_table,
    class_metrics,
    confusion,
    mcnemar_exact,
    mcnemar_exact_p,
    mechanism_metrics,
    paired_bootstrap,
    paired_bootstrap_loop,
    power_table,
    select_checkpoints,
    study_stats,
)

from .synthetic import (
    FAIL_KEEP,
    FAIL_REVISE,
    PASS_KEEP,
    WRITEUP_B_STEP100_SEED42,
    rollout,
    scripted_records,
    write_eval,
)


@pytest.fixture(scope="module")
def writeup_rows() -> list[dict]:
    return scripted_records(WRITEUP_B_STEP100_SEED42)


def test_the_writeups_step100_seed42_arm_b_figures_come_back(writeup_rows: list[dict]) -> None:
    m = mechanism_metrics(writeup_rows)
    assert (m["n"], m["n_scored"], m["n_infra"]) == (500, 500, 0)
    assert (m["never_revised_n"], m["ever_revised_n"]) == (409, 91)
    assert round(100 * m["never_revised_pass"], 1) == 63.3
    assert round(100 * m["ever_revised_pass"]) == 1
    assert round(100 * m["revise_rate_fail_patches"], 1) == 22.2
    assert round(100 * m["revise_rate_pass_patches"], 1) == 8.5
    assert (m["n_fail_patches"], m["n_pass_patches"]) == (315, 284)
    assert m["pass_at_1"] == 260 / 500
    # first patch PASS: 259 never-revised + 24 whose passing first patch was revised
    assert m["first_patch_pass"] == 283 / 500
    # recovery: first patch failed, then passed: only the one ever-revised pass
    assert (m["n_recovery"], m["recovery_rate"]) == (217, 1 / 217)
    assert m["budget_exhausted_revise"] == m["budget_exhausted_keep"] == 0.0


def test_confusion_matrix_and_per_class_precision_recall(writeup_rows: list[dict]) -> None:
    counts = confusion(writeup_rows)
    # KEEP decisions predicted PASS; REVISE decisions predicted ASSERTION_FAILURE
    assert counts == {("PASS", "PASS"): 260, ("PASS", "ASSERTION_FAILURE"): 24,
                      ("ASSERTION_FAILURE", "PASS"): 245, ("ASSERTION_FAILURE", "ASSERTION_FAILURE"): 70}
    by_cls = {c["cls"]: c for c in class_metrics(counts)}
    assert by_cls["PASS"]["precision"] == 260 / 505 and by_cls["PASS"]["recall"] == 260 / 284
    assert by_cls["ASSERTION_FAILURE"]["precision"] == 70 / 94 and by_cls["ASSERTION_FAILURE"]["recall"] == 70 / 315
    assert by_cls["PASS"]["predicted_freq"] == 505 / 599 and by_cls["PASS"]["verified_freq"] == 284 / 599
    assert math.isnan(by_cls["RUNTIME_ERROR"]["precision"]) and by_cls["RUNTIME_ERROR"]["n_verified"] == 0


def test_budget_exhaustion_split_by_revise() -> None:
    rows = [rollout(0, [FAIL_REVISE] * 8, final=False), rollout(1, [FAIL_KEEP] * 8, final=False),
            rollout(2, [PASS_KEEP])]
    assert [r["budget_exhausted"] for r in rows] == [True, True, False]
    m = mechanism_metrics(rows)
    assert m["budget_exhausted_revise"] == 1.0 and m["budget_exhausted_keep"] == 0.5


def test_mcnemar_matches_scipy_exact_binomial() -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        a, b = rng.random(200) < 0.55, rng.random(200) < 0.45
        got = mcnemar_exact(a, b)
        n10, n01 = int(np.sum(a & ~b)), int(np.sum(~a & b))
        assert (got["n10"], got["n01"]) == (n10, n01)
        assert got["mcnemar_p"] == pytest.approx(binomtest(n10, n10 + n01, 0.5).pvalue, rel=1e-9)
        assert mcnemar_exact_p(np.array([n10]), np.array([n10 + n01]))[0] == pytest.approx(got["mcnemar_p"])


def test_bootstrap_is_seeded_and_matches_scipy_percentile() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.random(500) < 0.6, rng.random(500) < 0.5
    one, two = paired_bootstrap(a, b, seed=7), paired_bootstrap(a, b, seed=7)
    assert one == two and one["diff"] == pytest.approx(a.mean() - b.mean())
    d = a.astype(float) - b.astype(float)
    ref = bootstrap((d,), np.mean, n_resamples=10_000, method="percentile", random_state=3).confidence_interval
    assert one["ci_low"] == pytest.approx(ref.low, abs=0.01) and one["ci_high"] == pytest.approx(ref.high, abs=0.01)
    loop = paired_bootstrap_loop(a, b, resamples=2000, seed=7)
    assert loop["ci_low"] == pytest.approx(one["ci_low"], abs=0.015)


def test_study_stats_pairs_selection_and_ablation(tmp_path: Path) -> None:
    root = tmp_path / "eval"
    paths = []
    for seed in (42, 43):
        for run, patches in (("A", [PASS_KEEP] * 6 + [FAIL_KEEP] * 4), ("B", [PASS_KEEP] * 4 + [FAIL_REVISE] * 6),
                             ("forced_keep", [PASS_KEEP] * 5 + [FAIL_KEEP] * 5)):
            for ckpt in ("sft", "step50", "step100"):
                arm = "A" if run == "A" else "B"
                rows = [rollout(t, [p], arm=arm, seed=seed, checkpoint=ckpt, variant="none") for t, p in
                        enumerate(patches)]
                paths.append(write_eval(root, run, ckpt, seed, rows))
    tables = study_stats(paths, arms=["A", "B"], ablations={"forced_keep": {"variant": "forced_keep"}},
                         reference="sft", selection_mode="fixed", selection_step=100, resamples=500)
    pairs = tables["pairs"].to_pylist()
    kinds = [p["kind"] for p in pairs]
    assert kinds.count("vs_reference") == 2 * 2 * 2  # two arms x two seeds x two steps
    assert kinds.count("A_vs_B") == 3 * 4  # three checkpoints x every seed pairing
    assert kinds.count("ablation_vs_base") == 3 * 2
    ab = next(p for p in pairs if p["kind"] == "A_vs_B")
    assert (ab["pass_a"], ab["pass_b"], ab["n10"], ab["n01"]) == (0.6, 0.4, 2, 0)
    sel = tables["selection"].to_pylist()
    assert {s["checkpoint"] for s in sel} == {"step100"} and not any(s["fallback"] for s in sel)
    table = ablation_table("forced_keep", paths, sel, resamples=500).to_pylist()
    assert [r["seed"] for r in table] == [42, 43]
    assert table[0]["focus_metric"] == "pass_at_1"
    assert (table[0]["pass_ablation"], table[0]["pass_base"], table[0]["pass_A"]) == (0.5, 0.4, 0.6)
    assert table[0]["deficit_vs_A_base"] == pytest.approx(0.2)


def test_selection_best_val_and_base_fallback() -> None:
    metrics = [{"run": "B", "seed": 1, "split": "val", "checkpoint": c, "pass_at_1": p}
               for c, p in (("sft", 0.9), ("step50", 0.4), ("step100", 0.5), ("step150", 0.5))]
    best = select_checkpoints(metrics, "best_val", None)
    assert best[0]["checkpoint"] == "step100"  # sft is not an RL step; ties go to the earlier step
    base = select_checkpoints([{"run": "A", "seed": 1, "split": "val", "checkpoint": "base", "pass_at_1": 0.1}],
                              "fixed", 100)
    assert (base[0]["checkpoint"], base[0]["fallback"]) == ("base", True)
    with pytest.raises(ValueError, match="step200 was not evaluated"):
        select_checkpoints(metrics, "fixed", 200)


def test_power_grows_with_tasks_and_marks_the_study_design() -> None:
    t = power_table(deltas=[0.03], discordances={"config": [0.2]}, tasks=[100, 2000], seeds=[1],
                    simulations=400, study_tasks=500, study_seeds=2).to_pylist()
    power = {(r["n_tasks"], r["n_seeds"]): r["power"] for r in t}
    assert power[100, 1] < power[2000, 1]
    assert sum(r["study_design"] for r in t) == 1
    assert power[2000, 2] > 0.8


def test_an_evaluation_file_that_disagrees_with_its_path_is_named(tmp_path: Path) -> None:
    from predict.stats import StatsInputError, read_evaluation

    path = write_eval(tmp_path, "B", "step100", 42, [rollout(0, [PASS_KEEP], checkpoint="step50")])
    with pytest.raises(StatsInputError, match=r"seed42\.parquet: row 0 \(task 0\) has checkpoint/split/seed step50"):
        read_evaluation(path)
    with pytest.raises(StatsInputError, match="expected"):
        read_evaluation(tmp_path / "loose.parquet")

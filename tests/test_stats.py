"""Statistics: the writeup's figures come back from synthetic records; McNemar and the bootstrap agree with scipy;
pairs, selection, ablation rows and the power table behave."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap

from predict.campaign import StatsInputError, select_checkpoints
from predict.config.models import AblationSettings
from predict.stats import (
    TEST_STATS_TABLES,
    Evaluation,
    ablation_table,
    class_metrics,
    compare,
    confusion,
    fisher_exact,
    holm,
    mcnemar_exact,
    mcnemar_exact_p,
    mechanism_metrics,
    paired_bootstrap,
    paired_bootstrap_loop,
    power_table,
    read_evaluation,
    study_stats,
)

from .synthetic import (
    FAIL_KEEP,
    FAIL_REVISE,
    PASS_KEEP,
    WRITEUP_B_STEP100_SEED42,
    rollout,
    scripted_records,
    small_test_campaign,
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
    one = paired_bootstrap(a, b, resamples=10_000, seed=7, ci=0.95)
    two = paired_bootstrap(a, b, resamples=10_000, seed=7, ci=0.95)
    assert one == two and one["diff"] == pytest.approx(a.mean() - b.mean())
    d = a.astype(float) - b.astype(float)
    ref = bootstrap((d,), np.mean, n_resamples=10_000, method="percentile", random_state=3).confidence_interval
    assert one["ci_low"] == pytest.approx(ref.low, abs=0.01) and one["ci_high"] == pytest.approx(ref.high, abs=0.01)
    loop = paired_bootstrap_loop(a, b, resamples=2000, seed=7, ci=0.95)
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
    tables = study_stats(paths, arms=["A", "B"], ablations={"forced_keep": AblationSettings(variant="forced_keep")},
                         reference="sft", selection_mode="fixed", selection_step=100, resamples=500,
                         default_test_cost=1, seed=0, ci=0.95)
    pairs = tables["pairs"].to_pylist()
    kinds = [p["kind"] for p in pairs if p["metric"] == "final_pass"]
    assert kinds.count("vs_reference") == 2 * 2 * 2  # two arms x two seeds x two steps
    # RL vs SFT is also tested on first-patch correctness; the other kinds on pass@1 only
    assert [p["kind"] for p in pairs if p["metric"] == "first_patch_pass"] == ["vs_reference"] * 8
    assert kinds.count("A_vs_B") == 3 * 4  # three checkpoints x every seed pairing
    assert kinds.count("ablation_vs_base") == 3 * 2
    ab = next(p for p in pairs if p["kind"] == "A_vs_B")
    assert (ab["pass_a"], ab["pass_b"], ab["n10"], ab["n01"]) == (0.6, 0.4, 2, 0)
    sel = tables["selection"].to_pylist()
    assert {s["checkpoint"] for s in sel} == {"step100"} and not any(s["fallback"] for s in sel)
    table = ablation_table("forced_keep", paths, sel, base_arm="B", resamples=500, seed=0, ci=0.95).to_pylist()
    assert [r["seed"] for r in table] == [42, 43]
    assert table[0]["focus_metric"] == "pass_at_1"
    assert (table[0]["pass_ablation"], table[0]["pass_base"], table[0]["pass_A"]) == (0.5, 0.4, 0.6)
    assert table[0]["deficit_vs_A_base"] == pytest.approx(0.2)


def test_the_fallback_checkpoint_does_not_depend_on_the_order_evaluations_are_read_in() -> None:
    """`predict stats` hands the selection sorted evaluations, `predict ablations`/`extensions` the files' order:
    both must fall back to the same checkpoint for a run without step checkpoints."""
    rows = [{"run": "C", "seed": 1, "split": "val", "checkpoint": c, "pass_at_1": p}
            for c, p in (("sft", 0.3), ("base", 0.1))]
    for metrics in (rows, rows[::-1]):
        (chosen,) = select_checkpoints(metrics, "fixed", 100)
        assert (chosen["checkpoint"], chosen["val_pass_at_1"], chosen["fallback"]) == ("sft", 0.3, True)


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
    t = power_table(deltas=[0.03], discordances={"config": [0.2]}, tasks=[100, 2000], study_tasks=500,
                    val_tasks=50, significance=0.05, target=0.8).to_pylist()
    power = {r["n_tasks"]: r["power"] for r in t}
    assert power[50] < power[100] < power[500] < power[2000]
    assert [r["n_tasks"] for r in t if r["study_design"]] == [500]
    assert {r["n_tasks"]: r["design"] for r in t} == {50: "val", 100: "grid", 500: "test", 2000: "grid"}
    assert "n_seeds" not in t[0]  # no pooled multi-seed rows: no test the statistics run pools seeds


def brute_force_power(delta: float, d: float, n: int, significance: float) -> float:
    """Power by enumerating every (discordant count, wins) outcome with scipy's exact binomial test."""
    from scipy.stats import binom

    q = (1 + delta / d) / 2
    total = 0.0
    for discordant in range(n + 1):
        p_d = binom.pmf(discordant, n, d)
        for wins in range(discordant + 1):
            if discordant and binomtest(wins, discordant, 0.5).pvalue < significance:
                total += p_d * binom.pmf(wins, discordant, q)
    return total


def test_power_table_agrees_with_an_exact_calculation() -> None:
    for delta, d, n in ((0.05, 0.2, 60), (0.1, 0.3, 45), (0.02, 0.1, 80)):
        row = power_table(deltas=[delta], discordances={"config": [d]}, tasks=[n], significance=0.05,
                          target=0.8).to_pylist()[0]
        assert row["power"] == pytest.approx(brute_force_power(delta, d, n, 0.05), abs=1e-12)
    # the example: delta 0.05 at discordance 0.2 is 0.68 on one pairing of 500 tasks (not 0.94, the
    # pooled 2 seeds), 0.07 on the 50 val tasks
    rows = power_table(deltas=[0.05], discordances={"config": [0.2]}, tasks=[], study_tasks=500,
                       val_tasks=50, significance=0.05, target=0.8).to_pylist()
    assert [(r["n_tasks"], round(r["power"], 2), r["powered"]) for r in rows] == [(50, 0.07, False),
                                                                                  (500, 0.68, False)]
    # and the exact power agrees with a simulation of the same design
    rng = np.random.default_rng(0)
    disc = rng.binomial(500, 0.2, size=20_000)
    wins = rng.binomial(disc, (1 + 0.05 / 0.2) / 2)
    assert np.mean(mcnemar_exact_p(wins, disc) < 0.05) == pytest.approx(rows[1]["power"], abs=0.015)


def test_an_evaluation_file_that_disagrees_with_its_path_is_named(tmp_path: Path) -> None:
    path = write_eval(tmp_path, "B", "step100", 42, [rollout(0, [PASS_KEEP], checkpoint="step50")])
    with pytest.raises(StatsInputError, match=r"seed42\.parquet: row 0 \(task 0\) has checkpoint/split/seed step50"):
        read_evaluation(path)
    with pytest.raises(StatsInputError, match="expected"):
        read_evaluation(tmp_path / "loose.parquet")


# ---------------------------------------------------------------------------------------------------------------
# Review fixes (issue 14 item 6) and the test split
# ---------------------------------------------------------------------------------------------------------------
def _ev(run: str, checkpoint: str, seed: int, rows: list[dict], split: str = "val") -> Evaluation:
    return Evaluation(run, checkpoint, split, seed, tuple(rows))


def test_a_comparison_with_no_shared_tasks_has_no_p_value() -> None:
    a = _ev("A", "step100", 42, [rollout(t, [PASS_KEEP], arm="A") for t in range(3)])
    b = _ev("A", "sft", 42, [rollout(t, [FAIL_KEEP], arm="A", checkpoint="sft") for t in range(3, 6)])
    row = compare(a, b, "vs_reference", 100, 0, 0.95)
    assert row["n"] == 0 and math.isnan(row["mcnemar_p"])  # no test ran: not "p = 1, no difference"
    same = compare(a, a, "vs_reference", 100, 0, 0.95)
    assert (same["n"], same["mcnemar_p"]) == (3, 1.0)  # shared, none discordant: the exact test's p is 1


def test_a_task_missing_from_one_side_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    a = _ev("A", "step100", 42, [rollout(t, [PASS_KEEP], arm="A") for t in range(5)])
    b = _ev("A", "sft", 42, [rollout(t, [FAIL_KEEP], arm="A", checkpoint="sft") for t in (0, 1, 2, 7)])
    with caplog.at_level("WARNING", logger="predict.stats"):
        row = compare(a, b, "vs_reference", 100, 0, 0.95)
    assert (row["n"], row["n_only_a"], row["n_only_b"]) == (3, 2, 1)
    assert "2 task(s) scored only in the first, 1 only in the second" in caplog.text
    assert "A/step100/val/seed42 vs A/sft/val/seed42" in caplog.text


def test_confusion_and_mechanism_metrics_drop_the_same_infrastructure_failures() -> None:
    good = [rollout(0, [PASS_KEEP]), rollout(1, [FAIL_REVISE, FAIL_KEEP])]
    broken = {**rollout(2, [FAIL_KEEP, FAIL_KEEP]), "ok": False, "final_pass": None, "stop_reason": "error"}
    m, counts = mechanism_metrics([*good, broken]), confusion([*good, broken])
    assert (m["n"], m["n_scored"], m["n_infra"]) == (3, 2, 1)
    assert sum(counts.values()) == m["n_patches"] == 3  # the broken rollout's two patches are in neither
    assert counts == confusion(good)


def test_first_patch_correctness_counts_a_rollout_without_a_patch_as_a_failure() -> None:
    rows = [rollout(0, [PASS_KEEP]), rollout(1, [FAIL_KEEP]), rollout(2, [])]
    m = mechanism_metrics(rows)
    assert (m["n_first_patch_pass"], m["n_scored"], m["first_patch_pass"]) == (1, 3, 1 / 3)
    assert m["n_with_patch"] == 2


def test_the_ablation_tables_arm_a_is_arm_as_own_selected_checkpoint(tmp_path: Path) -> None:
    """best_val picks step50 for A and step100 for B: the deficit to A reads A at step50, not at B's step100."""
    paths = []
    scripts = {("A", "step50"): 8, ("A", "step100"): 2, ("B", "step50"): 1, ("B", "step100"): 4,
               ("forced_keep", "step50"): 3, ("forced_keep", "step100"): 5}
    for (run, ckpt), passes in scripts.items():
        rows = [rollout(t, [PASS_KEEP if t < passes else FAIL_KEEP], arm="A" if run == "A" else "B",
                        checkpoint=ckpt) for t in range(10)]
        paths.append(write_eval(tmp_path, run, ckpt, 42, rows))
    metrics = [{"run": ev.run, "checkpoint": ev.checkpoint, "split": ev.split, "seed": ev.seed,
                **mechanism_metrics(ev.rows)} for ev in map(read_evaluation, paths)]
    selection = select_checkpoints(metrics, "best_val", None)
    assert {s["run"]: s["checkpoint"] for s in selection} == {"A": "step50", "B": "step100",
                                                             "forced_keep": "step100"}
    row = ablation_table("forced_keep", paths, selection, base_arm="B", resamples=100, seed=0, ci=0.95).to_pylist()[0]
    assert row["pass_A"] == 0.8 and row["A_checkpoint"] == "step50"
    assert row["deficit_vs_A_base"] == pytest.approx(0.8 - 0.4)


def test_holm_and_fisher_match_their_definitions() -> None:
    from scipy.stats import fisher_exact as scipy_fisher

    p = [0.01, 0.04, 0.03, math.nan, 0.005]
    got = holm(p)
    # Holm by hand over the four real p-values: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, running max
    assert got[4] == pytest.approx(0.02) and got[0] == pytest.approx(0.03)
    assert got[2] == pytest.approx(0.06) and got[1] == pytest.approx(0.06) and math.isnan(got[3])
    assert fisher_exact(43, 261, 37, 276) == pytest.approx(scipy_fisher([[43, 218], [37, 239]]).pvalue)
    assert math.isnan(fisher_exact(0, 0, 3, 10))


def test_test_statistics_compare_the_val_selection_and_say_what_is_missing(tmp_path: Path) -> None:
    paths = []
    for run in ("A", "B"):
        for seed in (42, 43):
            for ckpt in ("sft", "step50", "step100"):
                rows = [rollout(t, [PASS_KEEP if (t + seed) % 3 else FAIL_KEEP], arm=run, seed=seed,
                                checkpoint=ckpt, split="test") for t in range(12)]
                paths.append(write_eval(tmp_path, run, ckpt, seed, rows, split="test"))
    selection = [{"run": r, "seed": s, "mode": "best_val", "step": None, "checkpoint": c, "val_pass_at_1": 0.5,
                  "fallback": False} for r, c in (("A", "step50"), ("B", "step100")) for s in (42, 43)]
    with pytest.raises(StatsInputError, match="--selection"):
        study_stats(paths, arms=["A", "B"], resamples=100, reference="sft", default_test_cost=1, seed=0, ci=0.95)
    tables = study_stats(paths, arms=["A", "B"], selection=selection, resamples=100, reference="sft",
                         default_test_cost=1, seed=0, ci=0.95)
    assert tuple(tables) == TEST_STATS_TABLES
    metrics = tables["metrics"].to_pylist()
    assert {m["split"] for m in metrics} == {"test"}
    assert {(m["run"], m["checkpoint"]) for m in metrics if m["selected"]} == {("A", "step50"), ("B", "step100")}
    ab = [p for p in tables["pairs"].to_pylist() if p["kind"] == "A_vs_B"]
    # every seed pairing of the SELECTED checkpoints (A's step50 vs B's step100), one Holm family
    assert [(p["checkpoint_a"], p["seed_a"], p["checkpoint_b"], p["seed_b"]) for p in ab] == [
        ("step50", 42, "step100", 42), ("step50", 42, "step100", 43), ("step50", 43, "step100", 42),
        ("step50", 43, "step100", 43)]
    assert {p["family"] for p in ab} == {"A_vs_B/final_pass/test/selected"}
    assert [p["mcnemar_p_holm"] for p in ab] == pytest.approx(holm([p["mcnemar_p"] for p in ab]))
    with pytest.raises(StatsInputError, match="run B seed 43: the selected checkpoint step100 has no test"):
        study_stats([p for p in paths if "B/step100/test/seed43" not in p.as_posix()], arms=["A", "B"],
                    selection=selection, resamples=100, reference="sft", default_test_cost=1, seed=0, ci=0.95)
    with pytest.raises(StatsInputError, match="more than one split"):
        study_stats([*paths, write_eval(tmp_path, "A", "sft", 42, [rollout(0, [PASS_KEEP], arm="A", checkpoint="sft")])],
                    arms=["A", "B"], selection=selection, resamples=100, reference="sft", default_test_cost=1, seed=0, ci=0.95)


def test_test_statistics_make_the_ablation_and_extension_tables_at_the_selected_checkpoints(tmp_path: Path) -> None:
    paths, selection, ablations, extensions = small_test_campaign(tmp_path)
    tables = study_stats(paths, arms=["A", "B"], ablations=ablations, extensions=extensions, selection=selection,
                         resamples=100, reference="sft", default_test_cost=1, seed=0, ci=0.95)
    ablation = tables["ablations"].to_pylist()
    assert [(r["ablation"], r["split"], r["checkpoint"], r["base_checkpoint"], r["A_checkpoint"]) for r in ablation] \
        == [("forced_keep", "test", "step100", "step100", "step100")]
    assert (ablation[0]["pass_ablation"], ablation[0]["pass_base"], ablation[0]["pass_A"]) == (0.6, 0.4, 0.7)
    ext = tables["extensions"].to_pylist()
    assert [(r["extension"], r["split"], r["mechanism"]) for r in ext] == [("edit_on_revise", "test", "edit_on_revise")]
    assert (ext[0]["pass_ext"], ext[0]["pass_vs_A"], ext[0]["pass_vs_B"]) == (0.5, 0.7, 0.4)
    # the ablation is compared with B at B's selected checkpoint in the pairs too, and nothing at step50 is
    assert [(p["run_a"], p["checkpoint_a"], p["checkpoint_b"]) for p in tables["pairs"].to_pylist()
            if p["kind"] == "ablation_vs_base"] == [("forced_keep", "step100", "step100")]

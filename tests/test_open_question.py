"""The open question (issue 28): the environments both protocols play (`predict.runs.environments`), the table of
Arm B vs Arm A within each (`predict.stats.open_question`) from synthetic records with known pairings, whose p-values
scipy gives back (exact McNemar = a two-sided binomial test of the discordant counts) and whose Holm values
statsmodels gives back; the val stage, the test statistics through the campaign ledger, the power of the family and
the report's section."""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.stats import binomtest
from statsmodels.stats.multitest import multipletests

from predict.campaign import select_checkpoints
from predict.cli import main
from predict.config import ConfigError, load_config
from predict.runs import Environment, environments, extension_counterpart
from predict.stats import (
    exact_power,
    mechanism_metrics,
    paired_bootstrap,
    power_table,
    read_evaluation,
)
from predict.stats.open_question import family_size, open_question_table
from predict.stats.power import with_open_question_power

from .conftest import REPO
from .synthetic import (
    A_FAIL,
    A_PASS,
    FAIL_KEEP,
    FAIL_REVISE,
    PASS_KEEP,
    PASS_REVISE,
    record_campaign,
    rollout,
    write_eval,
)

PAPER_ENVIRONMENTS = [
    Environment("study", "none", 1, "A", "B"),
    Environment("expensive", "none", 3, "expensive_tests_A", "expensive_tests_B"),
    Environment("irreversible", "irreversible", 1, "irreversible_A", "irreversible_B"),
    Environment("blind", "blind", 1, "blind_A", "blind_B"),
]


# -- the pairing ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["config.yaml", "local.yaml"])
def test_the_environments_pair_the_reactive_and_the_predictive_run_of_each(name: str) -> None:
    config = load_config(REPO / "config" / name)
    assert environments(config) == PAPER_ENVIRONMENTS
    assert extension_counterpart(config, "irreversible_B") == "irreversible_A"
    assert extension_counterpart(config, "blind_A") == "blind_B"
    assert extension_counterpart(config, "expensive_tests_B") == "expensive_tests_A"  # as before
    for run in ("A", "B", "edit_on_revise", "mask_decision", "rft_A", "rft_B"):
        assert extension_counterpart(config, run) is None, run


def test_a_run_that_changes_more_than_the_environment_is_no_side_of_one() -> None:
    config = load_config(REPO / "config" / "local.yaml")
    changed = copy.deepcopy(config)
    changed["extensions"] = {"cheap_alpha0_B": {"base_arm": "B", "test_cost": 5, "alpha": 0.0},  # alpha changed too
                             "cheap_A": {"base_arm": "A", "test_cost": 5},
                             "blind_rft_A": {"base_arm": "A", "variant": "blind", "trainer": "rft"},
                             "blind_B": {"base_arm": "B", "variant": "blind"},
                             "blind_x3_A": {"base_arm": "A", "variant": "blind", "test_cost": 3},
                             "blind_x3_B": {"base_arm": "B", "variant": "blind", "test_cost": 3}}
    assert environments(changed) == [Environment("study", "none", 1, "A", "B"),
                                     Environment("blind+expensive", "blind", 3, "blind_x3_A", "blind_x3_B")]
    twice = copy.deepcopy(config)
    twice["extensions"]["expensive_again_A"] = {"base_arm": "A", "test_cost": 3}
    with pytest.raises(ConfigError, match=r"environment expensive \(variant none, test_cost 3\) has two reactive runs "
                                          r"\(expensive_tests_A, expensive_again_A\)"):
        environments(twice)


# -- the table from synthetic records with known pairings ---------------------------------------------------------------
N_TASKS = 40
SEEDS = (42, 43)
# Arm B's chance to pass per environment (Arm A's is 0.4 everywhere): from no difference to a large one
B_PASS = {"study": 0.4, "expensive": 0.5, "irreversible": 0.65, "blind": 0.85}
INFRA = ("A", 42, 39)  # one rollout of Arm A seed 42 fails for infrastructure: its task is compared nowhere


def passes(env: str, side: str, seed: int) -> set[int]:
    """The tasks a run passes at its selected checkpoint (seeded, so every pairing's counts are known)."""
    rng = random.Random(f"{env}/{side}/{seed}")
    p = 0.4 if side == "A" else B_PASS[env]
    return {t for t in range(N_TASKS) if rng.random() < p}


def b_script(task: int, passed: bool) -> list:
    """Arm B's rollout: a third of its passes come after a REVISE of a failing patch, a quarter of its failures
    after a REVISE of a passing one; the rest are KEEP-only."""
    if passed:
        return [FAIL_REVISE, PASS_KEEP] if task % 3 == 0 else [PASS_KEEP]
    return [PASS_REVISE, FAIL_KEEP] if task % 4 == 0 else [FAIL_KEEP]


def write_environment_evaluations(root: Path, split: str = "val", reference_seed: int | None = None) -> list[Path]:
    """Every environment's two runs, both seeds: step100 (the selected one) and step50 (every task failing, so a
    wrong checkpoint shows). With `reference_seed`, the arms' SFT as the test campaign evaluates it: once, under
    that seed."""
    paths = []
    for env in PAPER_ENVIRONMENTS:
        for side, run in (("A", env.reactive), ("B", env.predictive)):
            for seed in SEEDS:
                won = passes(env.name, side, seed)
                for ckpt in ("step50", "step100"):
                    rows = []
                    for t in range(N_TASKS):
                        passed = ckpt == "step100" and t in won
                        script = ([A_PASS] if passed else [A_FAIL]) if side == "A" else b_script(t, passed)
                        rows.append(rollout(t, script, arm=side, seed=seed, checkpoint=ckpt, split=split))
                    if (run, seed) == INFRA[:2]:
                        rows[INFRA[2]] |= {"ok": False, "final_pass": None, "error": "sandbox died"}
                    paths.append(write_eval(root, run, ckpt, seed, rows, split=split))
                if reference_seed == seed and run in ("A", "B"):
                    rows = [rollout(t, [A_FAIL] if side == "A" else [FAIL_KEEP], arm=side, seed=seed,
                                    checkpoint="sft", split=split) for t in range(N_TASKS)]
                    paths.append(write_eval(root, run, "sft", seed, rows, split=split))
    # a run of no environment: never read
    other = [rollout(t, [PASS_KEEP], seed=42, checkpoint="step100", split=split) for t in range(N_TASKS)]
    paths.append(write_eval(root, "edit_on_revise", "step100", 42, other, split=split))
    return paths


def selection_of(paths: list[Path]) -> list[dict[str, Any]]:
    metrics = [{"run": e.run, "checkpoint": e.checkpoint, "split": e.split, "seed": e.seed,
                **mechanism_metrics(e.rows)} for e in map(read_evaluation, paths)]
    return select_checkpoints(metrics, "fixed", 100)


def expected_row(env: Environment, seed_a: int, seed_b: int) -> dict[str, Any]:
    """What a row must say, from the sets of passed tasks alone."""
    shared = set(range(N_TASKS)) - ({INFRA[2]} if (env.reactive, seed_a) == INFRA[:2] else set())
    a, b = passes(env.name, "A", seed_a) & shared, passes(env.name, "B", seed_b) & shared
    b_all = passes(env.name, "B", seed_b)
    revised_pass = {t for t in b_all if t % 3 == 0}  # FAIL_REVISE then PASS_KEEP
    revised_fail = {t for t in set(range(N_TASKS)) - b_all if t % 4 == 0}  # PASS_REVISE then FAIL_KEEP
    return {"n": len(shared), "n_pass_A": len(a), "n_pass_B": len(b), "n_B_only_passes": len(b - a),
            "n_A_only_passes": len(a - b), "diff": (len(b) - len(a)) / len(shared),
            "n_revised_patches_B": len(revised_pass) + len(revised_fail), "n_revised_fail_patches_B": len(revised_pass),
            "ever_revised_n_B": len(revised_pass) + len(revised_fail), "ever_revised_n_pass_B": len(revised_pass),
            "never_revised_n_B": N_TASKS - len(revised_pass) - len(revised_fail),
            "never_revised_n_pass_B": len(b_all) - len(revised_pass),
            "vectors": ([t in b for t in sorted(shared)], [t in a for t in sorted(shared)])}


@pytest.fixture(scope="module")
def val_paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_environment_evaluations(tmp_path_factory.mktemp("eval"))


def test_the_table_gives_scipys_exact_mcnemar_and_statsmodels_holm_back(val_paths: list[Path]) -> None:
    """Old code: there was no open-question table (predict.stats.open_question did not exist)."""
    rows = open_question_table(val_paths, selection_of(val_paths), PAPER_ENVIRONMENTS, resamples=500,
                               seed=7, ci=0.95).to_pylist()
    # a row per environment and seed pairing (Arm A's seed, then Arm B's), in environment order
    assert [(r["environment"], r["seed_A"], r["seed_B"]) for r in rows] == [
        (env.name, sa, sb) for env in PAPER_ENVIRONMENTS for sa in SEEDS for sb in SEEDS]
    expected_p = []
    for r in rows:
        env = next(e for e in PAPER_ENVIRONMENTS if e.name == r["environment"])
        want = expected_row(env, r["seed_A"], r["seed_B"])
        vectors = want.pop("vectors")
        assert (r["run_A"], r["run_B"], r["checkpoint_A"], r["checkpoint_B"]) == (
            env.reactive, env.predictive, "step100", "step100")
        assert (r["variant"], r["test_cost"], r["split"]) == (env.variant, env.test_cost, "val")
        assert {k: r[k] for k in want} == pytest.approx(want), (env.name, r["seed_A"], r["seed_B"])
        assert (r["n_only_A"], r["n_only_B"]) == ((0, 1) if (env.reactive, r["seed_A"]) == INFRA[:2] else (0, 0))
        assert (r["pass_A"], r["pass_B"]) == pytest.approx((want["n_pass_A"] / want["n"], want["n_pass_B"] / want["n"]))
        # exact McNemar: the two-sided binomial test of B's wins among the discordant tasks at one half
        discordant = want["n_B_only_passes"] + want["n_A_only_passes"]
        p = binomtest(want["n_B_only_passes"], discordant, 0.5).pvalue if discordant else 1.0
        assert r["mcnemar_p"] == pytest.approx(p, rel=1e-9)
        expected_p.append(p)
        # the study's paired bootstrap of B - A on the shared tasks, with the configured seed
        boot = paired_bootstrap(*vectors, resamples=500, seed=7, ci=0.95)
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((boot["ci_low"], boot["ci_high"]))
        assert r["ci_low"] <= r["diff"] <= r["ci_high"]
        assert r["revise_precision_B"] == pytest.approx(want["n_revised_fail_patches_B"] / want["n_revised_patches_B"])
        assert r["never_revised_pass_B"] == pytest.approx(want["never_revised_n_pass_B"] / want["never_revised_n_B"])
        assert r["family"] == "open_question/final_pass/val" and not r["selection_fallback"]
    # Holm over the whole family: every environment and seed pairing
    holm = multipletests(expected_p, method="holm")[1]
    assert [r["mcnemar_p_holm"] for r in rows] == pytest.approx(list(holm), rel=1e-9)
    blind = [r for r in rows if r["environment"] == "blind"]
    assert all(r["diff"] > 0.2 and r["mcnemar_p_holm"] < 0.05 for r in blind)  # B - A, not A - B
    assert any(r["mcnemar_p_holm"] > 0.5 for r in rows if r["environment"] == "study")


def test_a_missing_side_is_an_error_and_a_missing_environment_is_left_out(val_paths: list[Path]) -> None:
    from predict.campaign import StatsInputError

    selection = selection_of(val_paths)
    no_blind = [p for p in val_paths if "/blind_" not in str(p)]
    rows = open_question_table(no_blind, selection, PAPER_ENVIRONMENTS, resamples=50, seed=0, ci=0.95).to_pylist()
    assert {r["environment"] for r in rows} == {"study", "expensive", "irreversible"}
    no_blind_a = [p for p in val_paths if "/blind_A/" not in str(p)]
    with pytest.raises(StatsInputError, match="environment blind: blind_B has val evaluations, its counterpart "
                                              "blind_A none"):
        open_question_table(no_blind_a, selection, PAPER_ENVIRONMENTS, resamples=50, seed=0, ci=0.95)
    unselected = [s for s in selection if (s["run"], s["seed"]) != ("irreversible_B", 43)]
    with pytest.raises(StatsInputError, match="environment irreversible: no val checkpoint selection for run "
                                              "irreversible_B seed 43"):
        open_question_table(val_paths, unselected, PAPER_ENVIRONMENTS, resamples=50, seed=0, ci=0.95)


def paper_like_config() -> dict[str, Any]:
    config = load_config(REPO / "config" / "local.yaml")
    config["seeds"] = list(SEEDS)
    config["evaluation"]["selection"] = {"mode": "fixed", "step": 100}
    config["evaluation"]["bootstrap"] = {"resamples": 300, "seed": 0, "ci": 0.95}
    return config


def test_the_val_stage_writes_the_table(val_paths: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "extensions" / "open_question.parquet"
    assert main(["open-question", "--config-json", json.dumps(paper_like_config()), "--eval", *map(str, val_paths),
                 "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 4 * 4 and {r["checkpoint_B"] for r in rows} == {"step100"}  # the stage selected step100
    assert rows[0]["n_B_only_passes"] == expected_row(PAPER_ENVIRONMENTS[0], 42, 42)["n_B_only_passes"]


def test_the_test_table_comes_from_the_campaigns_files_with_the_reference_evaluated_once(tmp_path: Path) -> None:
    """The test's open-question table is a table of `predict stats` on the test campaign (held against its ledger).
    Old code: no such table; and with the arms' SFT evaluated once (under the first seed, as the campaign does) the
    ablation and extension tables of the test statistics read that one file twice and stopped ("a second file for
    run/checkpoint/split/seed ('A', 'sft', 'test', 42)")."""
    config = paper_like_config()
    paths = write_environment_evaluations(tmp_path / "eval", split="test", reference_seed=42)
    paths = [p for p in paths if "/edit_on_revise/" not in str(p)]
    selection = [{"run": run, "seed": seed, "mode": "fixed", "step": 100, "checkpoint": "step100", "val_pass_at_1": 0.5,
                  "val_n_pass": 1, "val_n_scored": 2, "fallback": False}
                 for env in PAPER_ENVIRONMENTS for run in env.runs for seed in SEEDS]  # the val selection
    from predict.outputs import write_rows
    from predict.stats import SELECTION_SCHEMA

    ledger = tmp_path / "campaign" / "ledger.jsonl"
    ledger.parent.mkdir()
    planned = [p for p in paths if "/step50/" not in str(p)]  # the campaign: selected checkpoints and the SFT
    record_campaign(ledger, config, planned, [{k: s[k] for k in ("run", "seed", "checkpoint")} for s in selection])
    selection_path = write_rows(selection, SELECTION_SCHEMA, tmp_path / "selection.parquet")
    out = tmp_path / "test" / "stats"
    assert main(["stats", "--config-json", json.dumps(config), "--eval", *map(str, planned), "--selection",
                 str(selection_path), "--test-ledger", str(ledger), "--out-dir", str(out)]) == 0
    rows = pq.read_table(out / "open_question.parquet").to_pylist()
    assert [(r["environment"], r["seed_A"], r["seed_B"]) for r in rows] == [
        (env.name, sa, sb) for env in PAPER_ENVIRONMENTS for sa in SEEDS for sb in SEEDS]
    assert {r["split"] for r in rows} == {"test"} and {r["family"] for r in rows} == {"open_question/final_pass/test"}
    for r in rows:
        env = next(e for e in PAPER_ENVIRONMENTS if e.name == r["environment"])
        want = expected_row(env, r["seed_A"], r["seed_B"])
        assert (r["n_B_only_passes"], r["n_A_only_passes"]) == (want["n_B_only_passes"], want["n_A_only_passes"])
    extensions = pq.read_table(out / "extensions.parquet").to_pylist()
    assert {r["extension"] for r in extensions} == {e.predictive for e in PAPER_ENVIRONMENTS[1:]} | {
        e.reactive for e in PAPER_ENVIRONMENTS[1:]}
    # a file the campaign never recorded is refused, as for every test statistic
    assert main(["stats", "--config-json", json.dumps(config), "--eval", *map(str, paths), "--selection",
                 str(selection_path), "--test-ledger", str(ledger), "--out-dir", str(tmp_path / "other")]) != 0


# -- power --------------------------------------------------------------------------------------------------------------
def test_the_power_of_one_test_of_the_open_questions_family(tmp_path: Path) -> None:
    assert family_size(PAPER_ENVIRONMENTS, SEEDS) == 16
    grid = {"deltas": [0.05, 0.1], "discordances": {"config": [0.2]}, "tasks": [250], "significance": 0.05,
            "target": 0.8, "study_tasks": 500}
    rows = with_open_question_power(power_table(**grid, family_size=4), 16, **grid).to_pylist()
    for r in rows:
        assert r["family_size_open_question"] == 16 and r["holm_significance_open_question"] == 0.05 / 16
        assert r["power_open_question"] == pytest.approx(exact_power(r["delta"], r["discordance"], r["n_tasks"],
                                                                     0.05 / 16))
        assert r["power_open_question"] < r["power_holm"] < r["power"]  # 16 tests are held to a stricter level
        assert r["powered_open_question"] == (r["power_open_question"] >= 0.8)
    none = with_open_question_power(power_table(**grid), 0, **grid).to_pylist()
    assert all(r["power_open_question"] is None for r in none)
    # the stage: its family size is the rule's flag
    out = tmp_path / "power.parquet"
    assert main(["power", "--config-json", json.dumps(paper_like_config()), "--open-question-family", "16",
                 "--out", str(out)]) == 0
    assert {r["family_size_open_question"] for r in pq.read_table(out).to_pylist()} == {16}


# -- the report -----------------------------------------------------------------------------------------------------------
def test_the_report_has_the_open_question_with_its_table_and_figure(val_paths: list[Path], tmp_path: Path) -> None:
    from predict.outputs import write_table
    from predict.report import build_report

    from .test_report import _cells, _images, _non_blank

    config = paper_like_config()
    table = open_question_table(val_paths, selection_of(val_paths), PAPER_ENVIRONMENTS, resamples=200, seed=0, ci=0.95)
    val = write_table(table, tmp_path / "extensions" / "open_question.parquet")
    test_dir = tmp_path / "test"
    write_table(table.set_column(table.schema.get_field_index("split"), "split",
                                 [["test"] * table.num_rows]), test_dir / "open_question.parquet")
    write_table(table.slice(0, 0), test_dir / "metrics.parquet")  # present, so the page reads the test directory
    grid = {"deltas": [0.05], "discordances": {"config": [0.2]}, "tasks": [], "significance": 0.05, "target": 0.8,
            "study_tasks": 500}
    power = write_table(with_open_question_power(power_table(**grid), 16, **grid), tmp_path / "power.parquet")
    html = build_report(config, stats_dir=tmp_path / "none", ablations=[], power=power, out=tmp_path / "index.html",
                        open_question=val, test_stats_dir=test_dir).read_text()
    section = html.split('<section id="open-question">')[1].split("</section>")[0]
    assert "<h2>The open question" in html.split('<section id="open-question">')[1][:80]
    assert "The frozen test" in section and "Val (selection only, n=40)" in section
    images = _images(section)
    assert len(images) == 2 and all(_non_blank(img) > 0.01 for img in images)  # B - A per environment, per split
    cells = _cells(html, "open-question")
    assert {c.split(" (")[0] for c in cells["environment"]} == {"study", "expensive", "irreversible", "blind"}
    assert "expensive (test cost 3)" in cells["environment"]
    first = table.to_pylist()[0]
    assert cells["Arm A pass@1"][0] == f"{100 * first['n_pass_A'] / first['n']:.1f}% ({first['n_pass_A']}/{first['n']})"
    for head in ("Arm A pass@1", "Arm B pass@1", "Arm B REVISE precision", "Arm B pass@1, never revised",
                 "Arm B pass@1, ever revised"):
        assert all(c == "–" or c.endswith(")") and "/" in c for c in cells[head]), head  # every rate with its n
    assert "Holm-adjusted p (family of 16)" in cells and "B - A [95% CI]" in cells
    assert not any("_" in head and head.islower() for head in cells)  # labelled in words, no parquet field names
    assert "power, Holm-adjusted (at least)" in cells and "16 tests" in section
    assert math.isfinite(np.mean([r["diff"] for r in table.to_pylist()]))


def test_the_holm_family_the_table_names_counts_only_rows_with_a_p_value(val_paths: list[Path]) -> None:
    """Holm leaves a row with no p-value (no discordant task) out of its family (predict.stats.exact.holm); the
    table's header counted every row (old code)."""
    from predict.report.open_question import open_question_rows

    rows = open_question_table(val_paths, selection_of(val_paths), PAPER_ENVIRONMENTS, resamples=50, seed=0,
                               ci=0.95).to_pylist()
    rows[0] = {**rows[0], "mcnemar_p": None, "mcnemar_p_holm": None}
    rows[1] = {**rows[1], "mcnemar_p": math.nan, "mcnemar_p_holm": math.nan}
    assert f"Holm-adjusted p (family of {len(rows) - 2})" in open_question_rows(rows)


def test_a_second_file_for_one_key_is_named_by_its_label_not_its_rows(val_paths: list[Path]) -> None:
    """Old code: the error printed the whole Evaluation, every row of it (~100 kB for 40 tasks)."""
    from predict.campaign import StatsInputError
    from predict.stats import load_evaluations

    ev = read_evaluation(val_paths[0])
    with pytest.raises(StatsInputError) as error:
        load_evaluations([ev, ev])
    assert str(error.value) == (f"{ev.label}: a second file for run/checkpoint/split/seed "
                                f"('{ev.run}', '{ev.checkpoint}', 'val', {ev.seed})")

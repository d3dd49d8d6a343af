"""The writeup's TEST figures come back through the real stages: synthetic per-trajectory test records built to
them (tests/synthetic.py: `write_writeup_evaluations`) go through `predict stats` on val (the selection), `predict
stats` on test with `--selection`, and `predict report --test-stats`; the tables and the page give back 56.4% vs
52.0%, the RL vs SFT p-values of both arms and seeds, first patch 42.8% -> 47.8% (p=0.0013) and the 409/91 REVISE
split, and the page opens with the test."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from predict.cli import main
from predict.config import load_config
from predict.stats import STATS_TABLES, TEST_STATS_TABLES

from .conftest import REPO
from .synthetic import WRITEUP_TEST, record_campaign, write_writeup_evaluations


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("writeup")
    config = load_config(REPO / "config" / "local.yaml")
    config["seeds"] = [42, 43]
    config["evaluation"]["selection"] = {"mode": "fixed", "step": 100}
    config["evaluation"]["bootstrap"] = {"resamples": 2000, "seed": 0, "ci": 0.95}
    config_json = json.dumps(config)
    val, test = write_writeup_evaluations(root / "eval")
    stats, test_stats = root / "stats", root / "test" / "stats"
    assert main(["stats", "--config-json", config_json, "--eval", *map(str, val), "--out-dir", str(stats)]) == 0
    ledger = record_campaign(root / "ledger.jsonl", config, test, pq.read_table(stats / "selection.parquet").to_pylist())
    assert main(["stats", "--config-json", config_json, "--eval", *map(str, test), "--out-dir", str(test_stats),
                 "--selection", str(stats / "selection.parquet"), "--test-ledger", str(root / "ledger.jsonl")]) == 0
    assert ledger
    power = stats / "power.parquet"
    assert main(["power", "--config-json", config_json, "--pairs", str(stats / "pairs.parquet"),
                 "--out", str(power)]) == 0
    html = root / "report" / "index.html"
    assert main(["report", "--config-json", config_json, "--stats-dir", str(stats), "--test-stats", str(test_stats),
                 "--power", str(power), "--out", str(html)]) == 0
    return {"stats": stats, "test": test_stats, "html": html}


def rows(directory: Path, name: str) -> list[dict]:
    return pq.read_table(directory / f"{name}.parquet").to_pylist()


def test_the_stages_write_exactly_their_declared_tables(study: dict[str, Path]) -> None:
    assert sorted(p.stem for p in study["test"].glob("*.parquet")) == sorted([*TEST_STATS_TABLES, "open_question"])
    assert set(STATS_TABLES) <= {p.stem for p in study["stats"].glob("*.parquet")}


def test_pass_at_1_and_rl_vs_sft_p_values_come_back(study: dict[str, Path]) -> None:
    metrics = rows(study["test"], "metrics")
    got = {(m["run"], m["checkpoint"], m["seed"]): (m["n_pass"], m["n_scored"]) for m in metrics}
    assert got == {k: (v, 500) for k, v in WRITEUP_TEST["pass_at_1"].items()}
    assert {m["split"] for m in metrics} == {"test"}
    a, b = (next(m for m in metrics if (m["run"], m["checkpoint"], m["seed"]) == (r, "step100", 42)) for r in "AB")
    assert (round(100 * a["pass_at_1"], 1), round(100 * b["pass_at_1"], 1)) == (56.4, 52.0)
    pairs = rows(study["test"], "pairs")
    rl = {(p["run_a"], p["seed_a"]): p for p in pairs if p["kind"] == "vs_reference" and p["metric"] == "final_pass"}
    assert {k: float(f"{p['mcnemar_p']:.2g}") for k, p in rl.items()} == WRITEUP_TEST["rl_vs_sft_p"]
    assert all(p["checkpoint_a"] == "step100" and p["checkpoint_b"] == "sft" for p in rl.values())
    ab = [p for p in pairs if p["kind"] == "A_vs_B"]
    assert len(ab) == 4 and all(p["mcnemar_p_holm"] > 0.05 for p in ab)  # neither arm beats the other


def test_first_patch_recovery_and_the_revise_split_come_back(study: dict[str, Path]) -> None:
    metrics = {(m["run"], m["checkpoint"], m["seed"]): m for m in rows(study["test"], "metrics")}
    for key, count in WRITEUP_TEST["first_patch"].items():
        assert (metrics[key]["n_first_patch_pass"], metrics[key]["n_scored"]) == (count, 500)
    assert round(100 * metrics["A", "sft", 42]["first_patch_pass"], 1) == 42.8
    assert round(100 * metrics["A", "step100", 42]["first_patch_pass"], 1) == 47.8
    first = next(p for p in rows(study["test"], "pairs") if p["kind"] == "vs_reference"
                 and p["metric"] == "first_patch_pass" and (p["run_a"], p["seed_a"]) == ("A", 42))
    assert float(f"{first['mcnemar_p']:.2g}") == WRITEUP_TEST["first_patch_p"]
    b = metrics["B", "step100", 42]
    assert (b["never_revised_n"], b["ever_revised_n"]) == (409, 91)
    assert (b["never_revised_n_pass"], b["ever_revised_n_pass"]) == (259, 1)
    recovery = {(r["run"], r["seed"]): r for r in rows(study["test"], "recovery")}
    from scipy.stats import fisher_exact

    r = recovery["A", 42]
    assert (r["n_recovered_b"], r["n_recovery_b"], r["n_recovered_a"], r["n_recovery_a"]) == (37, 276, 43, 261)
    assert r["fisher_p"] == pytest.approx(fisher_exact([[43, 261 - 43], [37, 276 - 37]]).pvalue)
    shares = {(s["run"], s["seed"], s["cls"]): s for s in rows(study["test"], "prediction_shares")}
    assert shares["B", 42, "PASS"]["share_reference"] == 1.0  # the SFT checkpoint predicted PASS for everything
    assert shares["B", 42, "PASS"]["n_predicted_selected"] == 505


def test_the_report_opens_with_the_test_and_gives_the_figures_back(study: dict[str, Path]) -> None:
    html = study["html"].read_text()
    first_section = html.index("<section")
    # the campaign card, then the test's headline, before any val section
    assert html.index('<section id="test-campaign">') == first_section
    card = html.split('<section id="test-campaign">')[1].split("</section>")[0]
    assert "design hash" in card and "1 campaign in this checkout" in card and "(this report)" in card
    assert html.index('<section id="test-campaign">') < html.index('<section id="test-headline">')
    assert html.index('<section id="test-headline">') < html.index('<section id="headline">')
    head = html.split('<section id="test-headline">')[1].split("</section>")[0]
    for text in ("56.4% (282/500)", "52.0% (260/500)", "0.0003", "0.028", "0.033", "0.0017", "Holm"):
        assert text in head, text
    first = html.split('<section id="test-first-patch">')[1].split("</section>")[0]
    for text in ("42.8% (214/500)", "47.8% (239/500)", "0.0013", "13.4% (37/276)", "16.5% (43/261)", "Fisher"):
        assert text in first, text
    revise = html.split('<section id="test-revise">')[1].split("</section>")[0]
    assert "409 / 91" in revise and "63.3% (259/409)" in revise and "1.1% (1/91)" in revise
    assert "22.2% (70/315)" in revise and "8.5% (24/284)" in revise
    conf = html.split('<section id="test-confusion">')[1].split("</section>")[0]
    assert "<img" in conf and "100.0% (500/500)" in conf  # SFT's predicted PASS share
    val = html.split('<section id="headline">')[1].split("</section>")[0]
    assert "selection only, n=10" in val
    for field in ("n_pass_a", "mcnemar_p", "pass_at_1", "n10", "ci_low"):  # labels are words, not field names
        assert f">{field}<" not in html, field

"""The stats -> ablations -> power -> report stages on synthetic evaluations (the real record schema), through
the `predict` CLI as the rules call it; the HTML is self-contained, every section is there, every figure decodes
and is not blank, and (when Chromium is installed) a headless screenshot of the page is not blank either."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from predict.cli import main
from predict.config import load_config
from predict.report import SECTIONS
from predict.report.build import TEST_SECTIONS
from predict.train.step_metrics import rollout_metrics, write_metrics

from .chromium import CHROMIUM
from .chromium import screenshot as chromium_screenshot
from .conftest import REPO
from .synthetic import FAIL_KEEP, FAIL_REVISE, PASS_KEEP, PASS_REVISE, rollout, write_eval

SCRIPTS = {
    "A": [PASS_KEEP] * 6 + [FAIL_KEEP] * 4,
    "B": [PASS_KEEP] * 4 + [FAIL_REVISE] * 3 + [PASS_REVISE] + [FAIL_KEEP] * 2,
    "alpha0": [PASS_KEEP] * 4 + [FAIL_KEEP] * 6,
    "forced_keep": [PASS_KEEP] * 5 + [FAIL_KEEP] * 5,
    "budget_neutral": [PASS_KEEP] * 5 + [FAIL_REVISE] * 5,
    "expensive_tests_A": [PASS_KEEP] * 5 + [FAIL_KEEP] * 5,
    "expensive_tests_B": [PASS_KEEP] * 5 + [FAIL_REVISE] * 5,
    "edit_on_revise": [PASS_KEEP] * 5 + [FAIL_REVISE] * 5,
    "mask_decision": [PASS_KEEP] * 3 + [FAIL_KEEP] * 7,
    "rft_A": [PASS_KEEP] * 7 + [FAIL_KEEP] * 3,
    "rft_B": [PASS_KEEP] * 2 + [FAIL_REVISE] * 8,
}
EXTENSIONS = ["expensive_tests_A", "expensive_tests_B", "edit_on_revise", "mask_decision", "rft_A", "rft_B"]
VARIANTS = {"forced_keep": "forced_keep", "budget_neutral": "budget_neutral"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("results")
    config = load_config(REPO / "config" / "local.yaml")
    config["seeds"] = [42, 43]
    config["evaluation"]["selection"] = {"mode": "fixed", "step": 100}  # the synthetic checkpoints: sft, step100
    config_json = __import__("json").dumps(config)
    evals = []
    for run, script in SCRIPTS.items():
        arm = "A" if run in ("A", "expensive_tests_A", "rft_A") else "B"
        for seed in config["seeds"]:
            for ckpt in ("sft", "step100"):
                rows = [rollout(t, [p], arm=arm, seed=seed, checkpoint=ckpt, variant=VARIANTS.get(run, "none"))
                        for t, p in enumerate(script)]
                evals.append(str(write_eval(root / "eval", run, ckpt, seed, rows)))
    stats = root / "stats"
    assert main(["stats", "--config-json", config_json, "--eval", *evals, "--out-dir", str(stats)]) == 0
    ablations = []
    for name in ("alpha0", "forced_keep", "budget_neutral"):
        out = root / "ablations" / f"{name}.parquet"
        mine = [e for e in evals if f"/{name}/" in e or "/B/" in e or "/A/" in e]
        assert main(["ablations", "--config-json", config_json, "--ablation", name, "--eval", *mine,
                     "--out", str(out)]) == 0
        ablations.append(str(out))
    extensions = []
    for name in EXTENSIONS:
        out = root / "extensions" / f"{name}.parquet"
        assert main(["extensions", "--config-json", config_json, "--extension", name, "--eval", *evals,
                     "--out", str(out)]) == 0
        extensions.append(str(out))
    power = root / "stats" / "power.parquet"
    assert main(["power", "--config-json", config_json, "--pairs", str(stats / "pairs.parquet"),
                 "--out", str(power)]) == 0
    rl = root / "rl" / "B" / "seed42" / "metrics.parquet"
    # the local trainer's writer: its rollout counting of each step's records, in the one per-step schema
    write_metrics([{"run": "B", "seed": 42, "step": step, "backend": "rl", "loss": 1 / (1 + step), "updated": True,
                    **rollout_metrics([rollout(t, [p], seed=42, checkpoint=f"rl-step{step}")
                                       for t, p in enumerate(SCRIPTS["B"][: 4 + step])])}
                   for step in range(1, 7)], rl)
    html_path = root / "report" / "index.html"
    example = next(e for e in evals if "/B/step100/" in e)
    assert main(["report", "--config-json", config_json, "--stats-dir", str(stats), "--ablations", *ablations,
                 "--extensions", *extensions, "--power", str(power), "--example", example, "--rl-metrics", str(rl), "--out", str(html_path)]) == 0
    return {"root": root, "html": html_path, "stats": stats}


def test_ablation_tables_have_a_row_per_seed(built: dict[str, Path]) -> None:
    for name, focus in (("alpha0", "runtime_error_recall"), ("forced_keep", "pass_at_1"),
                        ("budget_neutral", "deficit_vs_A")):
        rows = pq.read_table(built["root"] / "ablations" / f"{name}.parquet").to_pylist()
        assert [r["seed"] for r in rows] == [42, 43]
        assert {r["focus_metric"] for r in rows} == {focus}
        assert all(r["checkpoint"] == "step100" and r["pass_base"] == 0.4 and r["pass_A"] == 0.6 for r in rows)
    fk = pq.read_table(built["root"] / "ablations" / "forced_keep.parquet").to_pylist()[0]
    assert (fk["pass_ablation"], fk["revise_rate_ablation"]) == (0.5, 0.0)


def test_extension_tables_sit_beside_the_ablations_in_the_report(built: dict[str, Path]) -> None:
    focus = {"expensive_tests_A": "calls_saved_per_solved", "expensive_tests_B": "calls_saved_per_solved",
             "edit_on_revise": "edited_revise_pass", "mask_decision": "pred_freq_pass", "rft_A": "rft_minus_rl",
             "rft_B": "rft_minus_rl"}
    for name, metric in focus.items():
        rows = pq.read_table(built["root"] / "extensions" / f"{name}.parquet").to_pylist()
        assert [r["seed"] for r in rows] == [42, 43] and {r["focus_metric"] for r in rows} == {metric}, name
        assert all(r["pass_vs_A"] == 0.6 and r["pass_vs_B"] == 0.4 for r in rows), name
    rft = pq.read_table(built["root"] / "extensions" / "rft_A.parquet").to_pylist()[0]
    assert rft["rft_minus_rl"] == pytest.approx(0.1)
    html = built["html"].read_text()
    section = html.split('<section id="extensions">')[1].split("</section>")[0]
    assert all(name in section for name in focus) and "<img" in section and "calls_saved_per_solved" in section
    assert html.index('<section id="ablations">') < html.index('<section id="extensions">')


def _cells(html: str, section: str) -> dict[str, list[str]]:
    """A section's cells by column label (every table of the section; a label seen twice collects both)."""
    body = html.split(f'<section id="{section}">')[1].split("</section>")[0]
    out: dict[str, list[str]] = {}
    for tb in re.findall(r"<table>(.*?)</table>", body, re.S):
        heads = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", tb)]
        for row in re.findall(r"<tr>(.*?)</tr>", tb.split("<tbody>")[1]):
            for head, cell in zip(heads, re.findall(r"<td[^>]*>(.*?)</td>", row), strict=True):
                out.setdefault(head, []).append(cell)
    return out


def test_every_rate_on_the_val_pages_carries_its_n(built: dict[str, Path]) -> None:
    """The guide: each rate with its n. A share shown alone ("50.0%", "0.600") cannot be weighed."""
    html = built["html"].read_text()
    for section in ("selection", "mechanism", "extensions"):
        for head, cells in _cells(html, section).items():
            for cell in cells:
                assert not re.search(r"\d%(?!\s*\()", cell), f"{section}: {head!r} shows a rate without its n: {cell}"
    assert all(re.fullmatch(r"[\d.]+% \(\d+/\d+\)", c) for c in _cells(html, "selection")["val pass@1"])
    ext = _cells(html, "extensions")
    for head in ("REVISE precision", "pass, never revised", "PASS predicted", "PASS verified", "pass@1, RL run"):
        assert any(re.fullmatch(r"[\d.]+% \(n=\d+\)", c) for c in ext[head]), (head, ext[head])


def test_power_table_answers_was_the_study_powered(built: dict[str, Path]) -> None:
    rows = pq.read_table(built["stats"] / "power.parquet").to_pylist()
    assert {r["delta"] for r in rows} == {0.02, 0.03, 0.05}
    assert {r["discordance_source"] for r in rows} == {"config", "observed A vs B"}
    design = [r for r in rows if r["study_design"]]
    assert design and all((r["n_tasks"], r["design"]) == (500, "test") for r in design)
    html = built["html"].read_text()
    section = html.split('<section id="power">')[1].split("</section>")[0]
    assert "one seed pairing" in section and "Seeds are not pooled" in section and "significance 0.05" in section


def _images(html: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def _non_blank(img: Image.Image) -> float:
    """Share of pixels that are not the background colour."""
    a = np.asarray(img.convert("RGB")).reshape(-1, 3)
    background = np.median(a, axis=0)
    return float(np.mean(np.abs(a.astype(int) - background).sum(axis=1) > 30))


def test_report_is_self_contained_with_every_section_and_figure(built: dict[str, Path]) -> None:
    html = built["html"].read_text()
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in html, sid
    assert not re.search(r'(src|href)="(?!data:|#)', html), "the page links to something outside itself"
    images = _images(html)
    assert len(images) >= 5  # REVISE split, confusion, frequencies, training, (power/table-only sections aside)
    for img in images:
        assert img.size[0] > 100 and img.size[1] > 100 and _non_blank(img) > 0.01
    assert "task 0" in html or "task " in html
    assert "predicted ASSERTION_FAILURE" in html and "REVISE" in html  # the rendered rollout shows predictions
    assert "No RL metrics yet for:" in html  # the other runs' metrics are missing, and the page says so


def test_report_says_what_is_missing_when_there_is_no_data(tmp_path: Path) -> None:
    from predict.report import build_report

    config = load_config(REPO / "config" / "local.yaml")
    out = build_report(config, stats_dir=tmp_path, ablations=[], power=tmp_path / "none.parquet",
                       out=tmp_path / "index.html")
    html = out.read_text()
    assert all(f'<section id="{sid}">' in html for sid, _ in SECTIONS)
    assert html.count('class="empty"') >= len(SECTIONS) - 1


def test_the_test_sections_show_ablations_and_extensions_and_say_when_the_test_has_not_run(tmp_path: Path) -> None:
    from predict.outputs import write_table
    from predict.report import build_report
    from predict.stats import study_stats

    from .synthetic import small_test_campaign

    paths, selection, ablations, extensions = small_test_campaign(tmp_path / "eval")
    tables = study_stats(paths, arms=["A", "B"], ablations=ablations, extensions=extensions, selection=selection,
                         resamples=100, reference="sft", default_test_cost=1, seed=0, ci=0.95)
    for name, t in tables.items():
        write_table(t, tmp_path / "test" / f"{name}.parquet")
    config = load_config(REPO / "config" / "local.yaml")
    html = build_report(config, stats_dir=tmp_path / "none", ablations=[], power=tmp_path / "none.parquet",
                        out=tmp_path / "index.html", test_stats_dir=tmp_path / "test").read_text()
    section = html.split('<section id="test-ablations">')[1].split("</section>")[0]
    assert "forced_keep" in section and "edit_on_revise" in section and "60.0%" in section
    head = html.split('<section id="test-headline">')[1].split("</section>")[0]
    assert "70.0% (7/10)" in head and "40.0% (4/10)" in head  # A vs B at the selected checkpoints
    without = build_report(config, stats_dir=tmp_path / "none", ablations=[], power=tmp_path / "none.parquet",
                           out=tmp_path / "val-only.html").read_text()
    assert without.count("The frozen test has not been run yet") == len(TEST_SECTIONS)
    # test statistics without a single RL-vs-SFT pair: the test has run, its first-patch table has nothing to show
    (tmp_path / "test" / "pairs.parquet").unlink()
    no_pairs = build_report(config, stats_dir=tmp_path / "none", ablations=[], power=tmp_path / "none.parquet",
                            out=tmp_path / "no-pairs.html", test_stats_dir=tmp_path / "test").read_text()
    first = no_pairs.split('<section id="test-first-patch">')[1].split("</section>")[0]
    assert "has not been run" not in first and "No RL-vs-SFT pair" in first


def test_the_embedded_default_says_its_numbers_are_zero_and_points_to_the_signal_run(tmp_path: Path) -> None:
    from predict.report import build_report

    config = load_config(REPO / "config" / "local.yaml")
    head = build_report(config, stats_dir=tmp_path, ablations=[], power=tmp_path / "none.parquet",
                        out=tmp_path / "index.html").read_text().split("<nav>")[0]
    assert "embedded default" in head and "never solves an MBPP task" in head and "predict signal" in head
    paper = load_config(REPO / "config" / "config.yaml")
    paper_head = build_report(paper, stats_dir=tmp_path, ablations=[], power=tmp_path / "none.parquet",
                              out=tmp_path / "paper.html").read_text().split("<nav>")[0]
    assert "embedded default" not in paper_head  # the study's own report carries no such warning


def screenshot(html: Path, png: Path) -> None:
    """Headless Chromium screenshot of the page (the documented check; tests/test_report.py runs it)."""
    chromium_screenshot(html.resolve().as_uri(), png, "--window-size=1280,4000", "--hide-scrollbars")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(built: dict[str, Path]) -> None:
    png = built["root"] / "report" / "screenshot.png"
    screenshot(built["html"], png)
    img = Image.open(png)
    assert img.size == (1280, 4000)
    assert _non_blank(img) > 0.03
    # the top band (title, nav, headline table) is drawn, and so is the lower part with figures
    top, lower = img.crop((0, 0, 1280, 600)), img.crop((0, 1500, 1280, 4000))
    assert _non_blank(top) > 0.01 and _non_blank(lower) > 0.01
    keep = os.environ.get("PREDICT_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(png, keep)

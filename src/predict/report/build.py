"""The report page: its sections in order (`SECTIONS`), the navigation and the style, and `build_report`, which
reads the parquet tables and assembles the page (see `predict.report`).

The page opens with the frozen test when its statistics are given (``--test-stats``); every val section says it is
selection-only, with its n. The sections themselves live by topic: `campaign_results` (the frozen test campaign),
`evaluations` (pass@1, paired tests, mechanism, REVISE split, confusion, class shares), `ablations` (and
extensions), `open_question`, `power`, `training` (curves, step time, gradient terms, training outcomes) and
`example_rollout`; `elements` holds the tables, figures and cell formats they share."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from predict.report.ablations import ablations_section, extensions_section
from predict.report.campaign_results import (
    NO_TEST,
    test_ablations,
    test_campaign,
    test_confusion,
    test_first_patch,
    test_headline,
    test_revise,
)
from predict.report.elements import empty, eval_key, pct, table
from predict.report.evaluations import (
    confusion_section,
    frequencies,
    headline,
    mechanism_table,
    pairs_section,
    revise_split,
)
from predict.report.example_rollout import rollout_section
from predict.report.open_question import open_question_section
from predict.report.power import power_section
from predict.report.run_costs import run_costs_section
from predict.report.training import grad_terms_section, training, training_outcomes_section
from predict.stages import StageSettings, stage_settings

TEST_SECTIONS: tuple[tuple[str, str], ...] = (
    ("test-campaign", "The test campaign: what was frozen, where it ran, every campaign on this test split"),
    ("test-headline", "The frozen test: RL vs SFT per arm and seed, then Arm A vs Arm B"),
    ("test-first-patch", "Test: first-patch correctness and recovery, RL vs SFT"),
    ("test-revise", "Test: the REVISE split, REVISE on passing vs failing patches, budget exhaustion"),
    ("test-confusion", "Test: prediction confusion matrix and class shares"),
    ("test-ablations", "Test: ablations and extensions"),
)


VAL_SECTIONS: tuple[tuple[str, str], ...] = (
    ("headline", "Val: greedy pass@1 per run x checkpoint x seed"),
    ("pairs", "Val: paired tests, exact McNemar and bootstrap CI"),
    ("selection", "Checkpoint selection (val only)"),
    ("mechanism", "Val: mechanism metrics"),
    ("revise-split", "Val: the REVISE split"),
    ("confusion", "Val: prediction confusion matrix"),
    ("frequencies", "Val: predicted vs verified class frequencies"),
    ("ablations", "Val: ablations"),
    ("extensions", "Val: extensions: expensive tests, edit on REVISE, decision masking, RFT"),
)


SECTIONS: tuple[tuple[str, str], ...] = (
    *TEST_SECTIONS,
    ("open-question", "The open question: Arm B vs Arm A within each environment"),
    *VAL_SECTIONS,
    ("power", "Power: was the study powered?"),
    ("training", "Training curves (RL metrics)"),
    ("grad-terms", "Gradient interference: the RL and CE terms' gradient norms and cosine per step"),
    ("training-outcomes", "Training outcomes: verified vs predicted classes over all RL steps"),
    ("run-costs", "The plan beside the run: planned and measured wall time per rule"),
    ("rollout", "One rollout, rendered"),
)


NAV = {"test-campaign": "Test: campaign", "test-headline": "Test: headline", "test-first-patch": "Test: first patch, recovery",
       "test-revise": "Test: REVISE", "test-confusion": "Test: confusion, shares", "test-ablations": "Test: ablations",
       "open-question": "The open question",
       "headline": "Val: pass@1", "pairs": "Val: paired tests", "selection": "Selection", "mechanism": "Val: mechanism",
       "revise-split": "Val: REVISE", "confusion": "Val: confusion", "frequencies": "Val: class shares",
       "ablations": "Val: ablations", "extensions": "Val: extensions", "training": "Training",
       "grad-terms": "Gradient terms",
       "training-outcomes": "Training outcomes", "run-costs": "Plan vs run",
       "rollout": "Rollout"}  # else the title up to its colon


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1200px;color:#1b1b1b;
background:#fff;line-height:1.45}
h1{font-size:1.7rem;margin-bottom:.2rem}h2{font-size:1.25rem;border-bottom:2px solid #dde;padding-bottom:.2rem;
margin-top:2.2rem}
table{border-collapse:collapse;font-size:.8rem;margin:.6rem 0;max-width:100%}th,td{border:1px solid #ccd;
padding:.2rem .4rem;text-align:right}th{background:#eef1f7;font-weight:600;vertical-align:bottom}td{white-space:nowrap}
td.l,th.l{text-align:left}td.w{white-space:normal}.selonly{color:#555;font-weight:normal;font-size:.9rem}
.empty{color:#8a5a00;background:#fff7e0;padding:.5rem .8rem;border-left:4px solid #f0b000}
.note{color:#555;font-size:.85rem}img{max-width:100%;border:1px solid #eee;margin:.4rem 0}
.step{border:1px solid #dde;border-radius:6px;margin:.5rem 0;padding:.4rem .7rem}
.step pre{white-space:pre-wrap;margin:.2rem 0;font-size:.8rem;background:#f7f7fa;padding:.3rem}
.tag{display:inline-block;border-radius:4px;padding:0 .35rem;font-size:.75rem;margin-right:.3rem;background:#e3e8f4}
.tag.pass{background:#d5f2d8}.tag.fail{background:#f8d7d7}.tag.revise{background:#ffe7b8}
nav a{margin-right:.8rem;font-size:.85rem}.wide{overflow-x:auto;max-width:100%}
"""


def _read(path: Path | None) -> list[dict[str, Any]] | None:
    return pq.read_table(path).to_pylist() if path is not None and Path(path).exists() else None


def report_config(config: StageSettings | Mapping[str, Any]) -> StageSettings:
    """The report's typed object: the stage's own as it is, a mapping (a test's, the bundle's replay) read through
    the report's row."""
    return config if isinstance(config, StageSettings) else stage_settings("report", config)


def embedded_default_note(config: StageSettings) -> str:
    """The header's warning on the embedded default: its numbers are zero by construction, and why."""
    if config.model.base != "tiny":
        return ""
    return ('<p class="note"><b>This is the embedded default:</b> a randomly initialised tiny Qwen3 that never '
            "solves an MBPP task, so every pass@1, reward, advantage and RL loss on this page is 0 by construction "
            "and the comparisons are between zeros. It shows the pipeline runs end to end, not that training works. "
            "Whether training moves a model is checked by the learning-signal run (<code>predict signal</code>, "
            "run by CI on every change; docs/learning-signal.md has its measured margins): a tiny "
            "model fine-tuned to solve a few tasks sometimes, then GRPO and Arm B's CE-only samples through the "
            "study's code.</p>")


def build_report(
    config: StageSettings | Mapping[str, Any],
    *,
    stats_dir: Path,
    ablations: Sequence[Path],
    test_stats_dir: Path | None = None,
    power: Path,
    out: Path,
    example: Path | None = None,
    rl_metrics: Sequence[Path] = (),
    tasks: Path | None = None,
    extensions: Sequence[Path] = (),
    training_outcomes: Path | None = None,
    open_question: Path | None = None,
    plan_vs_run: Path | None = None,
) -> Path:
    """Write the self-contained report page; returns its path. `config`: the report stage's typed object (what
    `predict report` hands it), or a mapping read through the report's row (tests, the bundle's replay)."""
    from predict.outputs import write_text
    from predict.runs import study_runs
    from predict.stats import TEST_STATS_TABLES
    from predict.train.step_metrics import read_metrics

    view = report_config(config)

    def stat(name: str) -> list[dict[str, Any]] | None:
        return _read(stats_dir / f"{name}.parquet")

    metrics, pairs, selection = stat("metrics"), stat("pairs"), stat("selection")
    chosen = {eval_key(s) for s in selection or []}
    test = {name: _read(test_stats_dir / f"{name}.parquet") for name in TEST_STATS_TABLES} if test_stats_dir else {}
    val_n = max((m["n"] for m in metrics or [] if m["split"] == "val"), default="?")  # "?": no val evaluation yet
    note = (f'<p class="note"><b>Selection only</b> (val, n={val_n} tasks): these numbers choose checkpoints; the '
            "study's figures are the test's.</p>")
    # results/rl/{run}/seed{seed}/metrics.parquet -> "{run}/seed{seed}"
    rl = {f"{p.parent.parent.name}/{p.parent.name}": read_metrics(p) if Path(p).exists() else [] for p in rl_metrics}
    expected = [f"{run}/seed{seed}" for run in study_runs(view) for seed in view.seeds]
    task_rows = {r["task_id"]: r for r in (_read(tasks) or [])} if tasks else {}
    test_parts = {"test-campaign": test_campaign, "test-headline": test_headline, "test-first-patch": test_first_patch, "test-revise": test_revise,
                  "test-confusion": test_confusion, "test-ablations": test_ablations}
    body = {sid: part(test) if test.get("metrics") else empty(NO_TEST) for sid, part in test_parts.items()}
    body |= {
        "headline": headline(metrics, pairs),
        "pairs": pairs_section(pairs),
        "selection": table([{**s, "val_pass_at_1": pct(s.get("val_n_pass"), s.get("val_n_scored"))} for s in selection],
                           ["run", "seed", "mode", "step", "checkpoint", "val_pass_at_1", "fallback"])
                     if selection else empty("No selection yet."),
        "mechanism": mechanism_table(metrics) if metrics else empty("No evaluations yet."),
        "revise-split": revise_split(metrics, chosen),
        "confusion": confusion_section(stat("confusion"), chosen),
        "frequencies": frequencies(stat("classes"), chosen),
        "ablations": ablations_section({Path(p).stem: _read(Path(p)) for p in ablations}),
        "extensions": extensions_section({Path(p).stem: _read(Path(p)) for p in extensions}),
        "open-question": open_question_section(_read(test_stats_dir / "open_question.parquet") if test_stats_dir
                                               else None, _read(open_question), _read(power)),
        "power": power_section(_read(power), view),
        "training": training(rl, expected),
        "grad-terms": grad_terms_section(rl, view),
        "training-outcomes": training_outcomes_section(_read(training_outcomes)),
        "run-costs": run_costs_section(_read(plan_vs_run)),
        "rollout": rollout_section(_read(example), task_rows),
    }
    nav = "".join(f'<a href="#{sid}">{html.escape(NAV.get(sid, title.split(":")[0]))}</a>' for sid, title in SECTIONS)
    val_ids = {sid for sid, _ in VAL_SECTIONS}
    selonly = f' <span class="selonly">(selection only, n={val_n})</span>'
    sections = "".join(f'<section id="{sid}"><h2>{html.escape(title)}{selonly if sid in val_ids else ""}</h2>'
                       f"{note if sid in val_ids else ''}{body[sid]}</section>" for sid, title in SECTIONS)
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>PREDICT report: '
            f'{html.escape(view.run_name)}</title><style>{CSS}</style></head><body>'
            f"<h1>Reactive vs. Predictive Post-Training for Coding Agents</h1>"
            f'<p class="note">run <b>{html.escape(view.run_name)}</b>, model '
            f'{html.escape(view.model.base)}, seeds {", ".join(map(str, view.seeds))}; built '
            f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} from parquet only.</p>'
            f"{embedded_default_note(view)}<nav>{nav}</nav>{sections}"
            "</body></html>")
    return write_text(page, out)

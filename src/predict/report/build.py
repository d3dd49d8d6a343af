"""Sections, tables and figures of the report (see `predict.report`).

Rules: the page opens with the frozen test when its statistics are given (``--test-stats``); every val section
says it is selection-only, with its n. Column labels are words (`LABELS`), never parquet field names; every rate
is shown with its count and denominator ("56.4% (282/500)"); p-values keep two significant digits; a wide table
is built from merged cells (a comparison in one cell, a CI in one cell) so it fits the page."""

from __future__ import annotations

import base64
import html
import io
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

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
    ("rollout", "One rollout, rendered"),
)

NAV = {"test-campaign": "Test: campaign", "test-headline": "Test: headline", "test-first-patch": "Test: first patch, recovery",
       "test-revise": "Test: REVISE", "test-confusion": "Test: confusion, shares", "test-ablations": "Test: ablations",
       "open-question": "The open question",
       "headline": "Val: pass@1", "pairs": "Val: paired tests", "selection": "Selection", "mechanism": "Val: mechanism",
       "revise-split": "Val: REVISE", "confusion": "Val: confusion", "frequencies": "Val: class shares",
       "ablations": "Val: ablations", "extensions": "Val: extensions", "training": "Training",
       "grad-terms": "Gradient terms",
       "training-outcomes": "Training outcomes", "rollout": "Rollout"}  # else the title up to its colon

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


def is_missing(value: Any) -> bool:
    """None or NaN: a number the statistics could not give (shown as "–")."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_value(value: Any) -> str:
    """A cell's text: "–" when missing, yes/no, three decimals (three significant digits when tiny), else escaped."""
    if is_missing(value):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
    return html.escape(str(value))


# Column labels in words, for the columns several tables share (each table labels its own columns): a parquet
# field name never reaches the page (one that is a word already, "run", "seed", "mode", is its own label).
LABELS: dict[str, str] = {
    "who": "run / checkpoint / seed", "n_infra": "infrastructure failures", "pass_at_1": "pass@1",
    "p_vs_reference": "McNemar p vs own SFT", "p_vs_B": "McNemar p vs Arm B (same seed)", "val_pass_at_1": "val pass@1",
    "fallback": "base stand-in", "selection_fallback": "base stand-in", "cls": "class",
    "budget_rev": "budget exhausted, ever revised", "budget_keep": "budget exhausted, never revised",
}


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], labels: Mapping[str, str] | None = None,
          wrap: Sequence[str] = ()) -> str:
    """An HTML table; `wrap`: columns whose cells may break over lines (long merged cells), the others never do."""
    labels = {**LABELS, **(labels or {})}
    text_cols = {c for c in columns if rows and isinstance(rows[0].get(c), str)}
    head = "".join(f'<th class="{"l" if c in text_cols else ""}">{html.escape(labels.get(c, c))}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in text_cols else ""}{" w" if c in wrap else ""}">{format_value(r.get(c))}</td>'
                         for c in columns) + "</tr>"
        for r in rows
    )
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def empty(message: str) -> str:
    return f'<p class="empty">{html.escape(message)}</p>'


def figure(fig: Any, alt: str) -> str:
    """A matplotlib figure as an embedded PNG."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def agg_pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display), imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pct(k: Any, n: Any) -> str:
    """A rate with its count and denominator: "56.4% (282/500)"; "– (0/0)" when there is no denominator."""
    if is_missing(k) or is_missing(n):
        return "–"
    return f"{100 * k / n:.1f}% ({k}/{n})" if n else f"– (0/{n})"


def pval(p: Any) -> str:
    """A p-value, two significant digits; "–" when no test ran (no shared task)."""
    if is_missing(p):
        return "–"
    return "<0.0001" if p < 1e-4 else f"{p:.2g}"


def points(diff: Any, low: Any = None, high: Any = None) -> str:
    """A difference of rates in percentage points, with its CI: "+4.4 pts [+0.2, +8.6]"."""
    if is_missing(diff):
        return "–"
    out = f"{100 * diff:+.1f} pts"
    return out if is_missing(low) or is_missing(high) else f"{out} [{100 * low:+.1f}, {100 * high:+.1f}]"


def eval_key(row: Mapping[str, Any], side: str = "") -> tuple[str, str, int]:
    """(run, checkpoint, seed) of a row, or of one side of a pair (`side` "_a", "_b")."""
    return row[f"run{side}"], row[f"checkpoint{side}"], row[f"seed{side}"]


def eval_label(row: Mapping[str, Any], side: str = "") -> str:
    """"run / checkpoint / seed N" of a row, or of one side of a pair."""
    run, checkpoint, seed = eval_key(row, side)
    return f"{run} / {checkpoint} / seed {seed}"


# ---------------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------------
def headline(metrics: list[dict[str, Any]] | None, pairs: list[dict[str, Any]] | None) -> str:
    if not metrics:
        return empty("No evaluations yet (results/stats/metrics.parquet is missing or empty).")
    p_of: dict[tuple, dict[str, Any]] = {}
    for p in pairs or []:
        if (p["seed_a"] == p["seed_b"] or p["kind"] != "A_vs_B") and p.get("metric", "final_pass") == "final_pass":
            p_of.setdefault((p["kind"], *eval_key(p, "_a")), p)
    rows = []
    for m in metrics:
        vs_ref = p_of.get(("vs_reference", *eval_key(m)))
        vs_b = p_of.get(("A_vs_B", *eval_key(m))) or p_of.get(("ablation_vs_base", *eval_key(m)))
        rows.append({**m, "pass_at_1": pct(m.get("n_pass"), m["n_scored"]),
                     "p_vs_reference": pval(vs_ref["mcnemar_p"]) if vs_ref else None,
                     "p_vs_B": pval(vs_b["mcnemar_p"]) if vs_b else None})
    cols = ["run", "checkpoint", "split", "seed", "n_infra", "pass_at_1", "p_vs_reference", "p_vs_B"]
    return table(rows, cols) + (
        '<p class="note">pass@1: greedy, one sample per task, rollouts with a verdict; checkpoint <b>base</b> is the '
        "untrained stand-in where no trained checkpoint exists yet.</p>")


METRIC_WORDS = {"final_pass": "pass@1", "first_patch_pass": "first patch PASS"}
KIND_WORDS = {"vs_reference": "vs own SFT", "A_vs_B": "Arm A vs Arm B", "ablation_vs_base": "ablation vs Arm B"}


def pair_cells(p: Mapping[str, Any]) -> dict[str, str]:
    """The cells of a paired comparison every table shows: difference [CI], discordant counts, p, Holm p."""
    return {"diff": points(p["diff"], p["ci_low"], p["ci_high"]), "disc": f"{p['n10']} / {p['n01']}",
            "p": pval(p["mcnemar_p"]), "holm": pval(p.get("mcnemar_p_holm"))}


def pairs_section(pairs: list[dict[str, Any]] | None) -> str:
    """Paired comparisons, one merged cell per side, rate, CI and discordant pair: fits the page."""
    if not pairs:
        return empty("No paired comparisons (needs two runs or checkpoints on the same tasks).")
    rows = [{
        "kind": KIND_WORDS.get(p["kind"], p["kind"]), "metric": METRIC_WORDS.get(p.get("metric"), p.get("metric")),
        "first": eval_label(p, "_a"),
        "second": eval_label(p, "_b"),
        "rate_a": pct(p.get("n_pass_a"), p["n"]), "rate_b": pct(p.get("n_pass_b"), p["n"]), **pair_cells(p),
        "only": f"{p.get('n_only_a') or 0} / {p.get('n_only_b') or 0}",
    } for p in pairs]
    return table(rows, list(rows[0]), {
        "kind": "comparison", "rate_a": "first: rate", "rate_b": "second: rate", "diff": "difference [95% CI]",
        "disc": "discordant (first / second wins)", "p": "McNemar p", "holm": "Holm-adjusted p",
        "only": "tasks scored on one side only"}) + (
        '<p class="note">Each row: first vs second on the tasks both scored (n); difference = first - second in '
        "percentage points with its 95% paired-bootstrap CI; discordant: tasks only the first passes / only the "
        "second passes; Holm: adjusted within the row's family (kind, metric, checkpoint).</p>")


def revise_split(metrics: list[dict[str, Any]] | None, chosen: set[tuple[str, str, int]],
                 none: str = "No predictive-protocol evaluations yet.") -> str:
    """`chosen`, here and below: the (run, checkpoint, seed) of the selected checkpoints."""
    all_rows = [m for m in metrics or [] if "predictive" in (m.get("protocol") or "") and m["n_scored"]]
    if not all_rows:
        return empty(none)
    rows = [m for m in all_rows if eval_key(m) in chosen] or all_rows  # the figure
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows)), 3.4))
    xs = range(len(rows))
    for dx, group, color, text_color in ((-0.2, "never", "#4c72b0", "white"), (0.2, "ever", "#dd8452", None)):
        rates = [0 if math.isnan(r[f"{group}_revised_pass"]) else r[f"{group}_revised_pass"] for r in rows]
        ax.bar([x + dx for x in xs], rates, 0.4, label=f"{group} revised", color=color)
        for x, r in zip(xs, rows, strict=True):
            ax.text(x + dx, 0.02, f"n={r[f'{group}_revised_n']}", ha="center", fontsize=7, color=text_color,
                    rotation=90, va="bottom")
    ax.set_xticks(list(xs), [f"{r['run']}/{r['checkpoint']}/s{r['seed']}" for r in rows], rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1")
    ax.set_title("pass@1 of never- vs ever-revised rollouts")
    ax.legend(fontsize=8)
    return (figure(fig, "REVISE split") + '<p class="note">Figure: the selected checkpoint of each predictive run '
            "and seed; table: every evaluation.</p>" + revise_table(all_rows))


def revise_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The REVISE split, REVISE on passing vs failing patches and budget exhaustion, every rate with its n."""
    out = [{
        "who": eval_label(m),
        "never": pct(m.get("never_revised_n_pass"), m["never_revised_n"]),
        "ever": pct(m.get("ever_revised_n_pass"), m["ever_revised_n"]),
        "split": f"{m['never_revised_n']} / {m['ever_revised_n']}",
        "rev_pass": pct(m.get("n_revised_pass_patches"), m["n_pass_patches"]),
        "rev_fail": pct(m.get("n_revised_fail_patches"), m["n_fail_patches"]),
        "budget_rev": pct(m.get("n_budget_exhausted_revise"), m["ever_revised_n"]),
        "budget_keep": pct(m.get("n_budget_exhausted_keep"), m.get("n_keep_only")),
    } for m in rows]
    return table(out, ["who", "split", "never", "ever", "rev_pass", "rev_fail", "budget_rev", "budget_keep"], {
        "split": "rollouts never / ever revised", "never": "pass@1, never revised", "ever": "pass@1, ever revised",
        "rev_pass": "REVISE on patches that pass", "rev_fail": "REVISE on patches that fail"})


def confusion_section(confusion: list[dict[str, Any]] | None, chosen: set[tuple[str, str, int]],
                      per_seed: bool = False) -> str:
    if not confusion:
        return empty("No predictions recorded yet (no predictive-protocol patches).")
    from predict.outcomes import OUTCOMES

    groups: dict[tuple, dict[tuple[str, str], int]] = {}
    for c in confusion:
        ident = (c["run"], c["checkpoint"], c["split"], c["seed"])
        groups.setdefault(ident, {})[c["verified"], c["predicted"]] = c["count"]
    # one matrix per run: its selected checkpoint (else its first), first seed; per_seed: every selected seed's
    keys = []
    for run in sorted({k[0] for k in groups}, key=lambda r: (r != "B", r)):
        mine = sorted((k for k in groups if k[0] == run), key=lambda k: ((k[0], k[1], k[3]) not in chosen, k[3], k))
        picked = [k for k in mine if (k[0], k[1], k[3]) in chosen] if per_seed else []
        keys += picked or mine[:1]
    keys = keys[:6]
    plt = agg_pyplot()
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    classes = list(OUTCOMES)
    predicted = classes + (["MALFORMED"] if any(p == "MALFORMED" for k in keys for _, p in groups[k]) else [])
    short = [c.replace("_", " ").replace("ASSERTION FAILURE", "ASSERT").replace("RUNTIME ERROR", "RUNTIME")
             .replace("SYNTAX ERROR", "SYNTAX") for c in predicted]
    for ax, key in zip(axes.flat, keys, strict=False):
        counts = groups[key]
        grid = [[counts.get((t, p), 0) for p in predicted] for t in classes]
        im = ax.imshow(grid, cmap="Blues")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v:
                    ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                            color="white" if v > max(map(max, grid)) / 2 else "black")
        ax.set_xticks(range(len(predicted)), short, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(classes)), short[: len(classes)], fontsize=7)
        ax.set_xlabel("predicted")
        ax.set_ylabel("verified")
        ax.set_title(f"{key[0]}/{key[1]}/{key[2]}/s{key[3]}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return figure(fig, "confusion matrix") + '<p class="note">Applied patches of the predictive protocol: ' \
        "verified class (seen or shadow execution) against the predicted class.</p>"


def class_share_chart(pairs: Sequence[tuple[str, float, float]], title: str) -> str:
    """Bars of each class's verified and predicted share; `pairs`: (class, predicted share, verified share)."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    xs = range(len(pairs))
    ax.bar([x - 0.2 for x in xs], [p[2] for p in pairs], 0.4, label="verified (real)", color="#55a868")
    ax.bar([x + 0.2 for x in xs], [p[1] for p in pairs], 0.4, label="predicted", color="#c44e52")
    ax.set_xticks(list(xs), [p[0] for p in pairs], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("share of patches")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return figure(fig, title)


def frequencies(classes: list[dict[str, Any]] | None, chosen: set[tuple[str, str, int]]) -> str:
    if not classes:
        return empty("No predictions recorded in evaluation yet: no class frequencies.")
    shown = [c for c in classes if eval_key(c) in chosen] or classes
    shown = [c for c in shown if c["n_predicted"] or c["n_verified"]]
    key = min({(c["run"] != "B", c["run"], c["checkpoint"], c["split"], c["seed"]) for c in shown})
    first = [c for c in shown if (c["run"], c["checkpoint"], c["split"], c["seed"]) == key[1:]]
    return (class_share_chart([(c["cls"], c["predicted_freq"], c["verified_freq"]) for c in first],
                        f"evaluation {key[1]}/{key[2]}/{key[3]}/s{key[4]}: real vs predicted class frequency")
            + class_share_table(shown)
            + '<p class="note">Selected checkpoints; classes neither predicted nor verified are left out.</p>')


def ablations_section(tables: Mapping[str, list[dict[str, Any]] | None]) -> str:
    rows = [r for name in sorted(tables) for r in tables[name] or []]
    if not rows:
        return empty("No ablation tables yet.")
    return ablation_rows(rows) + (
        '<p class="note">alpha0: does the RUNTIME_ERROR distinction survive (recall)? forced_keep: does pass@1 '
        "recover? budget_neutral: does the deficit to Arm A survive a free REVISE?</p>")


def _share(x: Any, n: Any = None) -> str:
    if is_missing(x):
        return "–"
    return f"{100 * x:.1f}%" + (f" (n={n})" if n is not None else "")


def ablation_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    out = [{"ablation": r["ablation"], "seed": r["seed"],
            "checkpoints": f"{r['checkpoint']} vs B {r['base_checkpoint']} (A {r.get('A_checkpoint') or '–'})",
            "n": r["n"], "pass_ablation": _share(r["pass_ablation"]), "pass_base": _share(r["pass_base"]),
            "pass_A": _share(r["pass_A"]), "diff": points(r["diff"], r["ci_low"], r["ci_high"]),
            "p": pval(r["mcnemar_p"]), "focus": f"{r['focus_metric']}: {format_value(r['focus_ablation'])} vs "
                                                f"{format_value(r['focus_base'])}",
            "selection_fallback": r["selection_fallback"]} for r in rows]
    return table(out, list(out[0]), wrap=("checkpoints", "focus"), labels={
        "checkpoints": "checkpoints (selected)", "n": "tasks compared", "pass_ablation": "pass@1, ablation",
        "pass_base": "pass@1, Arm B", "pass_A": "pass@1, Arm A", "diff": "ablation - Arm B [95% CI]",
        "p": "McNemar p", "focus": "metric it tests: ablation vs Arm B"})


def extension_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    out = [{"extension": r["extension"], "seed": r["seed"], "checkpoint": r["checkpoint"],
            "pass_ext": _share(r["pass_ext"], r.get("n_ext")),
            **{f"vs_{arm}": f"{_share(r.get(f'pass_vs_{arm}'), r.get(f'n_vs_{arm}'))}: "
                            f"{points(r.get(f'diff_vs_{arm}'), r.get(f'ci_low_vs_{arm}'), r.get(f'ci_high_vs_{arm}'))}"
               for arm in ("A", "B")},
            "p_A": pval(r.get("mcnemar_p_vs_A")), "p_B": pval(r.get("mcnemar_p_vs_B")),
            "focus": f"{r['focus_metric']}: {format_value(r['focus_ext'])} vs {format_value(r['focus_other'])}",
            "selection_fallback": r["selection_fallback"]} for r in rows]
    return table(out, ["extension", "seed", "checkpoint", "pass_ext", "vs_A", "p_A", "vs_B", "p_B", "focus",
                       "selection_fallback"], wrap=("vs_A", "vs_B", "focus"), labels={
                 "pass_ext": "pass@1, extension", "vs_A": "Arm A pass@1: extension - A [95% CI]",
                  "p_A": "McNemar p vs A", "vs_B": "Arm B pass@1: extension - B [95% CI]", "p_B": "McNemar p vs B",
                  "focus": "mechanism metric: extension vs compared with"})


EXTENSION_TEXT = {  # mechanism -> (the title of its panel, its note under the figure)
    "test_cost": ("calls per solved task, run vs other arm", "calls per solved task: the run's vs its counterpart's "
                  "at the same test cost (saved = other - run); REVISE precision = REVISEd patches whose verified "
                  "outcome was not PASS"),
    "edit_on_revise": ("pass, edited REVISE vs never revised",
                       "pass rate of rollouts with an edited REVISE vs never-revised ones"),
    "mask_decision": ("PASS predicted vs verified",
                      "how often PASS is predicted vs verified (DECISION tokens out of RL credit)"),
    "rft": ("pass@1, RFT vs RL", "pass@1 of rejection-sampling fine-tuning vs the RL run of the same arm"),
}


def extensions_section(tables: Mapping[str, list[dict[str, Any]] | None]) -> str:
    """One table of every extension's rows (pairs vs Arm A and Arm B, mechanism metric) and one small figure: each
    extension's mechanism metric next to what it is compared with, per seed."""
    rows = [r for name in tables for r in tables[name] or []]
    if not rows:
        return empty("No extension tables yet.")
    out = extension_rows(rows)
    # every rate with its n (a share of what the n counts); calls per solved task are means, RFT - RL a difference
    rates = {"revise_precision": "n_revised_patches", "edited_revise_pass": "n_edited",
             "never_revised_pass": "n_never_revised", "pred_freq_pass": "n_predicted_patches",
             "verified_freq_pass": "n_predicted_patches", "pass_rl": "n_rl"}
    mech = [{**r, **{k: _share(r.get(k), r.get(n)) for k, n in rates.items()},
             "rft_minus_rl": points(r.get("rft_minus_rl"))} for r in rows]
    out += table(mech, ["extension", "seed", "calls_per_solved", "calls_per_solved_other", "calls_saved_per_solved",
                        *rates, "rft_minus_rl"], {
        "calls_per_solved": "calls per solved task", "calls_per_solved_other": "calls per solved task, counterpart",
        "calls_saved_per_solved": "calls saved per solved task", "revise_precision": "REVISE precision",
        "edited_revise_pass": "pass, edited REVISE", "never_revised_pass": "pass, never revised",
        "pred_freq_pass": "PASS predicted", "verified_freq_pass": "PASS verified", "pass_rl": "pass@1, RL run",
        "rft_minus_rl": "RFT - RL"})
    plt = agg_pyplot()
    mechanisms = list(dict.fromkeys(r.get("mechanism") or "none" for r in rows))
    fig, axes = plt.subplots(1, len(mechanisms), figsize=(3.2 * len(mechanisms), 2.8), squeeze=False)
    for ax, mechanism in zip(axes[0], mechanisms, strict=True):  # one panel per mechanism: its own scale
        mine = [r for r in rows if (r.get("mechanism") or "none") == mechanism]
        xs = list(range(len(mine)))
        for dx, col, label in ((-0.2, "focus_ext", "extension"), (0.2, "focus_other", "compared with")):
            heights = [math.nan if r.get(col) is None else float(r[col]) for r in mine]
            ax.bar([x + dx for x in xs], heights, 0.4, label=label)
        ax.set_xticks(xs, [f"{r['extension']}/s{r['seed']}" for r in mine], rotation=30, ha="right", fontsize=7)
        title = EXTENSION_TEXT[mechanism][0] if mechanism in EXTENSION_TEXT else mine[0].get("focus_metric")
        ax.set_title(f"{mechanism}: {title}", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    out += figure(fig, "extensions: mechanism metric vs its comparison")
    notes = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, (_, v) in EXTENSION_TEXT.items()
                    if any(r.get("mechanism") == k for r in rows))
    return out + f'<ul class="note">{notes}</ul>'


def power_section(power: list[dict[str, Any]] | None, config: Mapping[str, Any]) -> str:
    if not power:
        return empty("No power table yet.")
    cfg = config.get("power") or {}
    significance, target = cfg.get("significance", 0.05), cfg.get("target", 0.8)
    test_n = config["data"]["sizes"]["test"]
    assumptions = (
        f"<p>What the power is of: the test the statistics run, <b>one seed pairing</b> (one arm's seed against "
        f"the other's) on the {test_n} test tasks, a two-sided exact McNemar test at significance {significance}. "
        "Assumed: the two arms disagree on a share d of the tasks (the discordance), independently from task to "
        "task; among the tasks they disagree on, the first arm wins with probability (1 + delta / d) / 2, so its "
        "pass@1 is higher by delta. Power is then computed exactly (a sum over the binomial number of discordant "
        "tasks, no simulation). Seeds are not pooled, because no pooled (stratified) test is run: two seeds "
        f"are two separate tests. Powered means power of at least {target}.</p>")
    family = max((int(r.get("family_size") or 1) for r in power), default=1)
    if family > 1:
        assumptions += (
            f"<p>The report Holm-adjusts Arm A vs Arm B over its family of {family} tests (one per seed pairing), so "
            f"each of them is held to at most significance {significance}/{family} = {significance / family:.4g}, "
            "the family's first Holm level. The column <i>power, Holm-adjusted</i> is the power of one test of that "
            "family there: the power of the A vs B comparison as the report runs it. <i>power, one test</i> is the "
            "unadjusted power (the RL-vs-SFT tests, one per arm and seed, are adjusted in families of their own).</p>")
    design = [r for r in power if r["design"] in ("test", "val")]
    verdict = [{"design": "test" if r["design"] == "test" else "val (selection only)", "n": r["n_tasks"],
                "delta": f"{100 * r['delta']:.0f} pts", "d": f"{r['discordance']:.2f}",
                "source": r["discordance_source"], "power": format_value(r["power"]),
                "powered": "powered" if r["powered"] else "not powered",
                "power_holm": format_value(r.get("power_holm", r["power"])),
                "powered_holm": "powered" if r.get("powered_holm", r["powered"]) else "not powered"}
               for r in sorted(design, key=lambda r: (r["design"] != "test", r["delta"], r["discordance"]))]
    curves: dict[tuple, list[dict[str, Any]]] = {}  # (delta, discordance, source) -> its rows, fewest tasks first
    for r in sorted(power, key=lambda r: r["n_tasks"]):
        curves.setdefault((r["delta"], r["discordance"], r["discordance_source"]), []).append(r)
    need = {k: next((r for r in rows if r["powered"]), None) for k, rows in curves.items()}  # fewest powered
    grid = [{"delta": f"{100 * k[0]:.0f} pts", "d": f"{k[1]:.2f}", "source": k[2],
             "n": need[k]["n_tasks"] if need[k] else "none on the grid",
             "power": format_value(need[k]["power"]) if need[k] else "–"} for k in sorted(curves)]
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    drawn = {min(k[1] for k in curves), max(k[1] for k in curves)}  # the lowest and the highest discordance
    for (delta, disc, _), rows in sorted(curves.items()):
        if disc in drawn:
            ax.plot([r["n_tasks"] for r in rows], [r["power"] for r in rows], marker="o", ms=3,
                    label=f"delta {delta:.2f}, discordance {disc:.2f}")
    ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.axvline(test_n, color="black", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("paired tasks (one seed pairing; dotted: the test)")
    ax.set_ylabel("power")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6, ncol=2)
    labels = {"design": "design", "n": "tasks", "delta": "difference to detect", "d": "discordance",
              "source": "discordance from", "power": "power, one test", "powered": "verdict, one test"}
    if family > 1:
        labels |= {"power_holm": f"power, Holm-adjusted (A vs B, family of {family})",
                   "powered_holm": "verdict, Holm-adjusted"}
    return (assumptions + table(verdict, list(labels), labels) + figure(fig, "power curves")
            + "<p>Fewest tasks on the grid reaching the target power, one seed pairing:</p>"
            + table(grid, ["delta", "d", "source", "n", "power"], {**labels, "n": "tasks needed"}))


CURVES = {"reward_mean": "mean reward", "pass_rate": "pass rate", "loss": "loss", "revise_rate": "REVISE rate",
          "budget_exhausted_rate": "budget exhausted"}
"""The per-step columns (`predict.train.metrics`) the training curves plot, with their titles."""


def training(rl: Mapping[str, list[dict[str, Any]]], expected: Sequence[str]) -> str:
    missing = [name for name in expected if not rl.get(name)]
    note = empty(f"No RL metrics yet for: {', '.join(missing)}.") if missing else ""
    present = {k: v for k, v in rl.items() if v}
    if not present:
        return note or empty("No RL runs configured.")
    metrics = [c for c in CURVES if any(r.get(c) is not None for rows in present.values() for r in rows)]
    if not metrics:
        return empty("The RL metrics have no reward, loss or rate logged yet.") + note
    plt = agg_pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3), squeeze=False)
    for ax, col in zip(axes[0], metrics, strict=False):
        for name, rows in sorted(present.items()):
            pts = sorted((r["step"], r[col]) for r in rows if r.get(col) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1.3)
        ax.set_title(CURVES[col], fontsize=9)
        ax.set_xlabel("step")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return figure(fig, "training curves") + step_time(present) + note


STEP_PARTS = {"rollout_s": "rollout", "update_s": "update", "sync_s": "weight sync"}
"""The parts of an RL step's time (`predict.train.metrics`) the step-time bar stacks, with their labels."""


def step_time(rl: Mapping[str, list[dict[str, Any]]]) -> str:
    """Where a step's time goes, per run: the mean seconds of each part over the steps that logged it, stacked, with
    the rest of ``step_s`` (samples, checkpoints, waits) as "other"; and the same numbers as a table. A part a
    backend does not log (prime-rl rolls out beside the trainer: no ``rollout_s``) is left out of its bar."""
    rows = []
    for name, steps in sorted(rl.items()):
        row: dict[str, Any] = {"run": name}
        for col in [*STEP_PARTS, "step_s"]:
            values = [r[col] for r in steps if r.get(col) is not None and not is_missing(r[col])]
            row[col] = sum(values) / len(values) if values else None
        if any(row[c] is not None for c in STEP_PARTS):
            known = sum(row[c] or 0.0 for c in STEP_PARTS)
            row["other_s"] = max(row["step_s"] - known, 0.0) if row["step_s"] is not None else None
            rows.append(row)
    if not rows:
        return ""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(rows) + 1.0))
    left = [0.0] * len(rows)
    for col, label in [*STEP_PARTS.items(), ("other_s", "other")]:
        widths = [r.get(col) or 0.0 for r in rows]
        ax.barh([r["run"] for r in rows], widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("seconds per step (mean)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    fig.tight_layout()
    labels = {"run": "run", "rollout_s": "rollout s", "update_s": "update s", "sync_s": "weight sync s",
              "other_s": "other s", "step_s": "step s"}  # fmt: skip
    cols = ["run", *STEP_PARTS, "other_s", "step_s"]
    return figure(fig, "step time split") + table(rows, cols, labels)


# ---------------------------------------------------------------------------------------------------------------
# Gradient interference (predict.train.grad_terms)
# ---------------------------------------------------------------------------------------------------------------
GRAD_TERM_PANELS = {"rl_grad_norm": "RL term: gradient norm", "ce_grad_norm": "CE term: gradient norm",
                    "rl_ce_grad_cosine": "cosine(RL gradient, CE gradient)"}  # fmt: skip
PAPER_BACKEND_NOTE = ("The paper backend (prime-rl) does not measure these: its custom-loss hook is a function of one "
                      "sample's RL log-probs and never sees the CE term, the parameters or their gradients (one "
                      "backward of the summed loss follows it).")  # fmt: skip


def grad_terms_section(rl: Mapping[str, list[dict[str, Any]]], config: Mapping[str, Any]) -> str:
    """Arm B, its ablations and its RL extensions (the predictive runs of the local trainer): the RL and CE terms'
    gradient norms (before clipping, the step's whole batch) and their cosine per step, and a row per run and seed
    of their medians over the measured steps. A run whose steps carry none (prime-rl, ``rl.grad_terms_every: 0``)
    is named, not drawn."""
    from predict.runs import resolve_run

    def predictive(key: str) -> bool:
        try:
            spec = resolve_run(config, key.split("/")[0])
        except ValueError:  # a metrics file of a run the config no longer has
            return False
        return spec.predictive and spec.trainer == "rl"

    runs = {k: v for k, v in sorted(rl.items()) if v and predictive(k)}
    if not runs:
        return empty("No RL metrics of Arm B or its ablations yet.")
    measured = {k: [r for r in v if r.get("rl_grad_norm") is not None] for k, v in runs.items()}
    unmeasured = [k for k, v in measured.items() if not v]
    prime_rl = [k for k in unmeasured if any(r.get("backend") == "prime_rl" for r in runs[k])]
    notes = (f'<p class="note">{html.escape(PAPER_BACKEND_NOTE)} Runs on it: {", ".join(prime_rl)}.</p>'
             if prime_rl else "")  # fmt: skip
    other = [k for k in unmeasured if k not in prime_rl]
    if other:
        notes += empty(f"Not measured (rl.grad_terms_every 0, or metrics written before the columns): {', '.join(other)}.")
    measured = {k: v for k, v in measured.items() if v}
    if not measured:
        return notes
    plt = agg_pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2), squeeze=False)
    axes[0][1].sharey(axes[0][0])  # one scale for both norms: their gap is the finding
    colour = {name: f"C{i % 10}" for i, name in enumerate(measured)}
    for ax, (col, title) in zip(axes[0], GRAD_TERM_PANELS.items(), strict=True):
        for name, rows in measured.items():
            pts = sorted((r["step"], r[col]) for r in rows if r.get(col) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=2.5, lw=1.2, label=name,
                        color=colour[name])  # fmt: skip
        if col != "rl_ce_grad_cosine":
            ax.set_yscale("symlog", linthresh=1e-3)  # norms span decades, and alpha 0's CE norm is 0
        else:
            ax.axhline(0.0, color="#888", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=6, loc="best")
    fig.tight_layout()

    def median(values: list[Any]) -> float | None:
        known = [v for v in values if not is_missing(v)]
        return statistics.median(known) if known else None

    rows = []
    for name, steps in measured.items():
        ratios = [r["ce_grad_norm"] / r["rl_grad_norm"] for r in steps if r["rl_grad_norm"]]
        rows.append({"run": name, "n_steps": f"{len(steps)} of {len(runs[name])}",
                     "rl": median([r["rl_grad_norm"] for r in steps]), "ce": median([r["ce_grad_norm"] for r in steps]),
                     "ratio": median(ratios), "cosine": median([r.get("rl_ce_grad_cosine") for r in steps])})  # fmt: skip
    labels = {"run": "run / seed", "n_steps": "steps measured", "rl": "RL gradient norm (median)",
              "ce": "CE gradient norm (median)", "ratio": "CE / RL norm (median)", "cosine": "cosine (median)"}
    return (figure(fig, "gradient terms per step") + table(rows, list(labels), labels)
            + '<p class="note">Each norm is its term\'s gradient over every trainable parameter, before clipping, on '
            "the step's whole batch (local trainer, <code>predict.train.grad_terms</code>); the cosine is undefined "
            "(–) where a norm is 0.</p>" + notes)


# ---------------------------------------------------------------------------------------------------------------
# The frozen test (results/test/stats/)
# ---------------------------------------------------------------------------------------------------------------
NO_TEST = "The frozen test has not been run yet: no test statistics (results/test/stats/) were given."


def _selected(metrics: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, int]]:
    """The test's selected checkpoints, as the val sections take them (`chosen`)."""
    return {eval_key(m) for m in metrics if m.get("selected")}


def test_headline(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    metrics, pairs = test["metrics"], test.get("pairs") or []
    selected = _selected(metrics)
    rl = [p for p in pairs if p["kind"] == "vs_reference" and p["metric"] == "final_pass"]
    rl.sort(key=lambda p: (eval_key(p, "_a") not in selected, p["run_a"], p["seed_a"]))
    rows = [{"arm": p["run_a"], "seed": p["seed_a"], "sft": pct(p["n_pass_b"], p["n"]),
             "rl": pct(p["n_pass_a"], p["n"]),
             "ckpt": p["checkpoint_a"] + (" (selected)" if eval_key(p, "_a") in selected else ""), **pair_cells(p)}
            for p in rl]
    out = "<h3>RL vs its own SFT, per arm and seed</h3>" + table(rows, list(rows[0]), {
        "sft": "SFT pass@1", "rl": "RL pass@1", "ckpt": "RL checkpoint", "diff": "RL - SFT [95% CI]",
        "disc": "tasks only RL / only SFT passes", "p": "exact McNemar p", "holm": "Holm-adjusted p",
    }) if rows else empty("No RL vs SFT comparison on test.")
    ab = [p for p in pairs if p["kind"] == "A_vs_B"]
    rows = [{"a": f"seed {p['seed_a']} ({p['checkpoint_a']})", "b": f"seed {p['seed_b']} ({p['checkpoint_b']})",
             "pa": pct(p["n_pass_a"], p["n"]), "pb": pct(p["n_pass_b"], p["n"]), **pair_cells(p)} for p in ab]
    out += "<h3>Arm A vs Arm B, every seed pairing of the selected checkpoints</h3>"
    out += table(rows, list(rows[0]), {
        "a": "Arm A", "b": "Arm B", "pa": "Arm A pass@1", "pb": "Arm B pass@1", "diff": "A - B [95% CI]",
        "disc": "tasks only A / only B passes", "p": "exact McNemar p", "holm": "Holm-adjusted p (the A vs B family)",
    }) if rows else empty("No A vs B pairing on test.")
    infra = sum(m["n_infra"] for m in metrics)
    return out + (f'<p class="note">Greedy pass@1 on the test tasks both sides scored; 95% CI: paired bootstrap. '
                  f"Checkpoints: the val selection. Infrastructure failures left out: {infra}.</p>")


def test_campaign(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    """The campaign card: this campaign's design hash, date and what its rows depend on, then every campaign the
    ledger has seen on this test split, each with why it was declared."""
    campaigns = test.get("campaigns") or []
    this = next((c for c in campaigns if c["this"]), None)
    if this is None:
        return empty("The test statistics name no campaign (results/test/stats/campaigns.parquet is empty).")
    card = (f"<p>Campaign <b>{html.escape(this['campaign'])}</b>, design hash <code>{this['config_hash'][:12]}</code>, "
            f"frozen {html.escape(this['time'])} from <code>{html.escape(this['results_dir'])}</code> (run "
            f"{html.escape(this['run_name'])}); base model {html.escape(this['base_model'])}; vLLM "
            f"{html.escape(this['vllm_version'])} on {html.escape(this['device'])}; serving "
            f"<code>{html.escape(this['serving'])}</code>; {this['n_done']} of {this['n_planned']} planned "
            "evaluations done.</p>")
    others = len(campaigns) - 1
    card += (f'<p class="note">This test split has seen {len(campaigns)} campaign{"s" if len(campaigns) > 1 else ""} '
             "in this checkout's ledger (.test-campaigns/ledger.jsonl)"
             + (": every later one was declared with a reason, listed here." if others else ": this one only.")
             + "</p>")
    rows = [{"campaign": c["campaign"] + (" (this report)" if c["this"] else ""), "time": c["time"],
             "hash": c["config_hash"][:12], "model": c["base_model"], "where": c["results_dir"],
             "done": f"{c['n_done']}/{c['n_planned']}", "why": c["reason"] or "(the first)"} for c in campaigns]
    return card + table(rows, list(rows[0]), {
        "campaign": "campaign", "time": "frozen at", "hash": "design hash", "model": "base model",
        "where": "results folder", "done": "evaluations done / planned", "why": "why it was declared"})


def test_first_patch(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    pairs, recovery = test.get("pairs") or [], test.get("recovery") or []
    if not pairs:  # the test ran (build_report checked), but no RL checkpoint was paired with its SFT on it
        return empty("No RL-vs-SFT pair was evaluated on test: no first-patch or recovery comparison.")
    first = {eval_key(p, "_a"): p for p in pairs if p["kind"] == "vs_reference" and p["metric"] == "first_patch_pass"}
    rows = []
    for r in recovery:
        f = first.get((r["run"], r["checkpoint_a"], r["seed"])) or {}  # none: "–" (pct and pval take None)
        rows.append({"who": f"{r['run']} / seed {r['seed']}: {r['checkpoint_b']} → {r['checkpoint_a']}",
                     "fp_sft": pct(f.get("n_pass_b"), f.get("n")), "fp_rl": pct(f.get("n_pass_a"), f.get("n")),
                     "fp_p": pval(f.get("mcnemar_p")), "rec_sft": pct(r["n_recovered_b"], r["n_recovery_b"]),
                     "rec_rl": pct(r["n_recovered_a"], r["n_recovery_a"]), "rec_p": pval(r["fisher_p"])})
    return table(rows, ["who", "fp_sft", "fp_rl", "fp_p", "rec_sft", "rec_rl", "rec_p"], {
        "who": "arm / seed: SFT → RL", "fp_sft": "first patch PASS, SFT", "fp_rl": "first patch PASS, RL",
        "fp_p": "exact McNemar p", "rec_sft": "recovered, SFT", "rec_rl": "recovered, RL",
        "rec_p": "Fisher's exact p"}) + (
        '<p class="note">First patch: the first applied patch verified PASS; a rollout with no applied patch is a '
        "failure; denominator: every task, paired (McNemar). Recovery: passed in the end after a failing first "
        "patch; denominator: the trajectories whose first applied patch failed (a rollout that applied no patch is "
        "in neither count), which differ between SFT and RL, so the test is unpaired (Fisher's exact) and both "
        "counts are shown.</p>")


def test_revise(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    selected = _selected(test["metrics"])
    chosen = [m for m in test["metrics"] if eval_key(m) in selected]
    return (revise_split(test["metrics"], selected, "No predictive-protocol evaluation on test.")
            + ("<h3>Mechanism metrics of the selected checkpoints</h3>" + mechanism_table(chosen) if chosen else ""))


def test_confusion(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    chosen = _selected(test["metrics"])
    out = confusion_section([c for c in test.get("confusion") or [] if eval_key(c) in chosen], chosen, per_seed=True)
    classes = [c for c in test.get("classes") or [] if eval_key(c) in chosen]
    out += "<h3>Class shares of the patches: verified vs predicted</h3>" + class_share_table(classes)
    shares = [r for r in test.get("prediction_shares") or [] if r["n_predicted_reference"] or r["n_predicted_selected"]]
    rows = [{"who": f"{r['run']} / seed {r['seed']}", "cls": r["cls"],
             "ref": pct(r["n_predicted_reference"], r["n_patches_reference"]),
             "sel": pct(r["n_predicted_selected"], r["n_patches_selected"]),
             "ver": pct(r["n_verified_selected"], r["n_patches_selected"])} for r in shares]
    if rows:
        out += ("<h3>Predictions of the SFT checkpoint vs the selected checkpoint</h3>" + table(rows, list(rows[0]), {
            "who": "run / seed", "ref": "predicted share, SFT", "sel": "predicted share, selected",
            "ver": "verified share, selected"}))
    return out


def class_share_table(classes: Sequence[Mapping[str, Any]]) -> str:
    """Per evaluation and class: verified and predicted share of the patches, precision and recall, with counts."""
    classes = [c for c in classes if c["n_predicted"] or c["n_verified"]]
    totals: dict[tuple, int] = {}
    for c in classes:
        totals[eval_key(c)] = totals.get(eval_key(c), 0) + c["n_predicted"]
    rows = [{"who": eval_label(c), "cls": c["cls"], "verified": pct(c["n_verified"], totals[eval_key(c)]),
             "predicted": pct(c["n_predicted"], totals[eval_key(c)]),
             "precision": pct(None if is_missing(c["precision"]) else round(c["precision"] * c["n_predicted"]),
                              c["n_predicted"]),
             "recall": pct(None if is_missing(c["recall"]) else round(c["recall"] * c["n_verified"]), c["n_verified"])}
            for c in classes]
    return table(rows, list(rows[0]), {
        "verified": "verified share", "predicted": "predicted share", "precision": "precision (correct of predicted)",
        "recall": "recall (found of verified)"}) if rows else empty("No predictions at the selected checkpoints.")


def test_ablations(test: Mapping[str, list[dict[str, Any]] | None]) -> str:
    ablations, extensions = test.get("ablations") or [], test.get("extensions") or []
    out = ("<h3>Ablations vs Arm B</h3>" + ablation_rows(ablations)) if ablations else empty(
        "No ablation was evaluated on test.")
    out += ("<h3>Extensions vs Arm A and Arm B</h3>" + extension_rows(extensions)) if extensions else empty(
        "No extension was evaluated on test.")
    return out


# ---------------------------------------------------------------------------------------------------------------
# The open question (issue 28): Arm B vs Arm A within each environment (predict.stats.open_question)
# ---------------------------------------------------------------------------------------------------------------
ENVIRONMENT_WORDS = {  # environment -> what acting first costs there (the rules: predict.env.protocol's docstring)
    "study": "the study's own: a python_test costs one call and its outcome is seen",
    "expensive": "a python_test spends several budget calls (its test cost)",
    "irreversible": "the first python_test that runs is final: the episode is graded on that solution",
    "blind": "no test tool: no outcome is ever seen; graded at FINAL or when the budget runs out",
}


def _environment(row: Mapping[str, Any]) -> str:
    cost = f" (test cost {row['test_cost']})" if "expensive" in row["environment"] else ""
    return f"{row['environment']}{cost}"


def open_question_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """The open question's table: a row per environment and seed pairing, every rate with its n."""
    out = [{"environment": _environment(r),
            "pairing": f"{r['run_A']} / {r['checkpoint_A']} / seed {r['seed_A']} vs {r['run_B']} / "
                       f"{r['checkpoint_B']} / seed {r['seed_B']}",
            "pass_A": pct(r["n_pass_A"], r["n"]), "pass_B": pct(r["n_pass_B"], r["n"]),
            "diff": points(r["diff"], r["ci_low"], r["ci_high"]),
            "disc": f"{r['n_B_only_passes']} / {r['n_A_only_passes']}", "p": pval(r["mcnemar_p"]),
            "holm": pval(r["mcnemar_p_holm"]),
            "precision": pct(r["n_revised_fail_patches_B"], r["n_revised_patches_B"]),
            "never": pct(r["never_revised_n_pass_B"], r["never_revised_n_B"]),
            "ever": pct(r["ever_revised_n_pass_B"], r["ever_revised_n_B"]),
            "selection_fallback": r["selection_fallback"]} for r in rows]
    return table(out, list(out[0]), wrap=("pairing",), labels={
        "environment": "environment", "pairing": "Arm A vs Arm B (run / selected checkpoint / seed)",
        "pass_A": "Arm A pass@1", "pass_B": "Arm B pass@1", "diff": "B - A [95% CI]",
        "disc": "tasks only B / only A passes", "p": "exact McNemar p",
        "holm": f"Holm-adjusted p (family of {len(rows)})", "precision": "Arm B REVISE precision",
        "never": "Arm B pass@1, never revised", "ever": "Arm B pass@1, ever revised"})


def open_question_figure(rows: Sequence[Mapping[str, Any]], title: str) -> str:
    """B - A per environment: one point per seed pairing with its 95% CI, in percentage points."""
    plt = agg_pyplot()
    names = list(dict.fromkeys(_environment(r) for r in rows))
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(names)), 3.2))
    for i, name in enumerate(names):
        mine = [r for r in rows if _environment(r) == name]
        for j, r in enumerate(mine):
            x = i + (j - (len(mine) - 1) / 2) * 0.12
            y = 100 * r["diff"] if not is_missing(r["diff"]) else math.nan
            low = 0.0 if is_missing(r["ci_low"]) else y - 100 * r["ci_low"]
            high = 0.0 if is_missing(r["ci_high"]) else 100 * r["ci_high"] - y
            ax.errorbar([x], [y], yerr=[[low], [high]], fmt="o", ms=4, capsize=3, color=f"C{i}")
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel("Arm B - Arm A pass@1 (points)", fontsize=8)
    ax.set_xlabel("each point: one seed pairing (in table order) with its 95% CI", fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return figure(fig, f"open question: {title}")


def open_question_power(power: Sequence[Mapping[str, Any]] | None) -> str:
    """The power of one test of the open question's family at the test's size (power.parquet's open-question
    columns, `predict.stats.open_question.with_open_question_power`)."""
    design = [r for r in power or [] if r["design"] == "test" and not is_missing(r.get("power_open_question"))]
    if not design:
        return empty("No power of the open question's comparison yet (power.parquet has no open-question columns).")
    head = design[0]
    rows = [{"delta": f"{100 * r['delta']:.0f} pts", "d": f"{r['discordance']:.2f}", "source": r["discordance_source"],
             "power": format_value(r["power_open_question"]),
             "powered": "powered" if r["powered_open_question"] else "not powered"}
            for r in sorted(design, key=lambda r: (r["delta"], r["discordance"]))]
    return (f"<p>Power of one test of this family ({head['family_size_open_question']} tests: every environment x "
            f"seed pairing) on the {head['n_tasks']} test tasks, exact McNemar held to the family's first Holm level "
            f"{format_value(head['holm_significance_open_question'])} (the Power section says what is assumed):</p>"
            + table(rows, list(rows[0]), {"delta": "difference to detect", "d": "discordance",
                                          "source": "discordance from", "power": "power, Holm-adjusted",
                                          "powered": "verdict"}))


def open_question_section(test: Sequence[Mapping[str, Any]] | None, val: Sequence[Mapping[str, Any]] | None,
                          power: Sequence[Mapping[str, Any]] | None) -> str:
    """The writeup's open question: does predicting consequences help when they cannot be cheaply observed after
    acting? The test's table and figure (else a note), then val's (selection only), then the power."""
    words = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in ENVIRONMENT_WORDS.items())
    out = ("<p>Does learning to predict consequences improve decisions when those consequences cannot be cheaply "
           "observed after acting? Arm B (predict, then KEEP or REVISE) against Arm A (act, test, recover) within "
           f"each environment, each at its selected checkpoint:</p><ul class=\"note\">{words}</ul>")
    for split, rows in (("test", test), ("val", val)):
        if not rows:
            out += empty("No test open-question table: the test campaign has not run yet "
                         "(results/test/stats/open_question.parquet)." if split == "test" else
                         "No val open-question table yet (results/extensions/open_question.parquet).")
            continue
        n = max(r["n"] for r in rows)
        heading = "The frozen test" if split == "test" else f"Val (selection only, n={n})"
        out += (f"<h3>{heading}</h3>" + open_question_figure(rows, f"{split}: Arm B - Arm A per environment")
                + open_question_rows(rows))
    out += ('<p class="note">Each row: one seed pairing, on the tasks both runs scored; B - A in percentage points '
            "with its 95% paired-bootstrap CI; Holm over every row of the split (one family). REVISE precision: "
            "REVISEd patches whose verified outcome (seen or shadow) was not PASS; never / ever revised: Arm B's "
            "rollouts without / with a REVISE.</p>")
    return out + open_question_power(power)


def training_outcomes_section(rows: list[dict[str, Any]] | None) -> str:
    """Per predictive run and seed, over all its RL steps: each class's count and share of verified outcomes and
    of predictions (results/stats/training_outcomes.parquet)."""
    if not rows:
        return empty("No RL steps of a predictive run with predictions logged yet (training_outcomes.parquet).")
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["run"], r["seed"]), []).append(r)
    out = []
    for (run, seed), mine in sorted(groups.items()):
        head = mine[0]
        out.append(f"<p><b>{html.escape(run)}, seed {seed}</b>: {head['n_verified_total']:,} verified outcomes and "
                   f"{head['n_predicted_total']:,} predictions over {head['n_steps']} RL steps.</p>")
        out.append(table(mine, ["cls", "n_verified", "verified_share", "n_predicted", "predicted_share"],
                         {"n_verified": "verified (n)", "verified_share": "share of verified",
                          "n_predicted": "predicted (n)", "predicted_share": "share of predictions"}))
    first = groups[min(groups)]
    chart = class_share_chart([(r["cls"], r["predicted_share"] or 0.0, r["verified_share"] or 0.0) for r in first],
                        f"training {first[0]['run']}/s{first[0]['seed']}, all steps: real vs predicted class share")
    return chart + "".join(out) + '<p class="note">Every applied patch of every RL rollout (edit-on-REVISE ' \
        "replacements included); verified = the seen or shadow outcome; MALFORMED = an unparseable prediction.</p>"


def _tag(text: str, cls: str = "") -> str:
    return f'<span class="tag {cls}">{html.escape(text)}</span>'


def rollout_section(rows: list[dict[str, Any]] | None, tasks: Mapping[int, Mapping[str, Any]]) -> str:
    if not rows:
        return empty("No evaluation rollouts to render.")
    # the most telling one: predictions, a REVISE, then a pass
    row = max(rows, key=lambda r: (bool(r.get("n_predictions")), bool(r.get("ever_revised")), bool(r.get("final_pass")),
                                   bool(r.get("n_patches")), -r["task_id"]))
    task = tasks.get(row["task_id"]) or {}
    out = [f"<p><b>task {row['task_id']}</b> &middot; run arm {html.escape(str(row['arm']))} "
           f"({html.escape(str(row['protocol']))}, variant {html.escape(str(row['variant']))}) &middot; checkpoint "
           f"{html.escape(str(row['checkpoint']))} &middot; seed {row['seed']} &middot; split "
           f"{html.escape(str(row['split']))} &middot; final "
           f"{_tag(str(row.get('final_outcome')), 'pass' if row.get('final_pass') else 'fail')} stop "
           f"{html.escape(str(row['stop_reason']))} &middot; calls {row['calls_used']}/{row['budget']}</p>"]
    if task:
        out.append(f"<pre>{html.escape(str(task.get('text', '')))}\n\n"
                   f"{html.escape(chr(10).join(task.get('test_list') or []))}</pre>")
    for s in row.get("steps") or []:
        tags = [_tag(s.get("action") or "?")]
        if s.get("status"):
            tags.append(_tag(s["status"], {"success": "pass", "error": "fail", "failed": "fail"}.get(s["status"], "")))
        if s.get("prediction"):
            tags.append(_tag(f"predicted {s['prediction']}"))
        if s.get("decision"):
            tags.append(_tag(f"{s['decision']}{' (forced)' if s.get('forced') else ''}",
                             "revise" if s["decision"] == "REVISE" else ""))
        if s.get("outcome") and s.get("action") == "apply_patch":
            seen = "seen" if s.get("outcome_seen") else "shadow"
            tags.append(_tag(f"verified {s['outcome']} ({seen})", "pass" if s["outcome"] == "PASS" else "fail"))
        out.append(f'<div class="step"><b>step {s.get("index")}</b> {"".join(tags)}'
                   f"<pre>{html.escape(s.get('reply') or '')}</pre>"
                   + (f"<pre>&rarr; {html.escape(s['result'])}</pre>" if s.get("result") else "") + "</div>")
    return "".join(out)


def mechanism_table(metrics: Sequence[Mapping[str, Any]]) -> str:
    rows = [{"who": eval_label(m), "split": m["split"],
             "first": pct(m.get("n_first_patch_pass"), m["n_scored"]),
             "recovery": pct(m.get("n_recovered"), m.get("n_recovery")),
             "revise": pct(m.get("n_revised_patches"), m.get("n_decided_patches")),
             "precision": pct(m.get("n_revised_fail_patches"), m.get("n_revised_patches")),
             "budget": pct(m.get("n_budget_exhausted"), m["n_scored"]),
             "budget_rev": pct(m.get("n_budget_exhausted_revise"), m["ever_revised_n"]),
             "budget_keep": pct(m.get("n_budget_exhausted_keep"), m.get("n_keep_only")),
             "malformed": pct(m.get("n_malformed_predictions"), m.get("n_decided_patches"))} for m in metrics]
    return table(rows, list(rows[0]), {
        "first": "first patch PASS (of all tasks)", "recovery": "recovered (of failing first patches)",
        "revise": "REVISE (of decided patches)",
        "precision": "REVISE precision (REVISEd patches that would fail)", "budget": "budget exhausted",
        "malformed": "malformed predictions"})


# ---------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------
def embedded_default_note(config: Mapping[str, Any]) -> str:
    """The header's warning on the embedded default: its numbers are zero by construction, and why."""
    if str(config["model"]["base"]) != "tiny":
        return ""
    return ('<p class="note"><b>This is the embedded default:</b> a randomly initialised tiny Qwen3 that never '
            "solves an MBPP task, so every pass@1, reward, advantage and RL loss on this page is 0 by construction "
            "and the comparisons are between zeros. It shows the pipeline runs end to end, not that training works. "
            "Whether training moves a model is checked by the learning-signal run (<code>predict signal</code>, "
            "run by CI on every change; docs/learning-signal.md has its measured margins): a tiny "
            "model fine-tuned to solve a few tasks sometimes, then GRPO and Arm B's CE-only samples through the "
            "study's code.</p>")


def build_report(
    config: Mapping[str, Any],
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
) -> Path:
    """Write the self-contained report page; returns its path."""
    from predict.io import write_text
    from predict.runs import study_runs
    from predict.stats import TEST_STATS_TABLES
    from predict.train.metrics import read_metrics

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
    expected = [f"{run}/seed{seed}" for run in study_runs(config) for seed in config["seeds"]]
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
        "power": power_section(_read(power), config),
        "training": training(rl, expected),
        "grad-terms": grad_terms_section(rl, config),
        "training-outcomes": training_outcomes_section(_read(training_outcomes)),
        "rollout": rollout_section(_read(example), task_rows),
    }
    nav = "".join(f'<a href="#{sid}">{html.escape(NAV.get(sid, title.split(":")[0]))}</a>' for sid, title in SECTIONS)
    val_ids = {sid for sid, _ in VAL_SECTIONS}
    selonly = f' <span class="selonly">(selection only, n={val_n})</span>'
    sections = "".join(f'<section id="{sid}"><h2>{html.escape(title)}{selonly if sid in val_ids else ""}</h2>'
                       f"{note if sid in val_ids else ''}{body[sid]}</section>" for sid, title in SECTIONS)
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>PREDICT report: '
            f'{html.escape(config["run_name"])}</title><style>{CSS}</style></head><body>'
            f"<h1>Reactive vs. Predictive Post-Training for Coding Agents</h1>"
            f'<p class="note">run <b>{html.escape(config["run_name"])}</b>, model '
            f'{html.escape(str(config["model"]["base"]))}, seeds {", ".join(map(str, config["seeds"]))}; built '
            f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} from parquet only.</p>'
            f"{embedded_default_note(config)}<nav>{nav}</nav>{sections}"
            "</body></html>")
    return write_text(page, out)

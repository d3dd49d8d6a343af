"""Sections, tables and figures of the report (see `predict.report`)."""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

SECTIONS: tuple[tuple[str, str], ...] = (
    ("headline", "Headline: greedy pass@1 per run x checkpoint x seed"),
    ("pairs", "Paired tests: exact McNemar and bootstrap CI"),
    ("selection", "Checkpoint selection (val only)"),
    ("mechanism", "Mechanism metrics"),
    ("revise-split", "The REVISE split"),
    ("confusion", "Prediction confusion matrix"),
    ("frequencies", "Predicted vs verified class frequencies"),
    ("ablations", "Ablations"),
    ("power", "Power: was the study powered?"),
    ("training", "Training curves (RL metrics)"),
    ("rollout", "One rollout, rendered"),
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1200px;color:#1b1b1b;
background:#fff;line-height:1.45}
h1{font-size:1.7rem;margin-bottom:.2rem}h2{font-size:1.25rem;border-bottom:2px solid #dde;padding-bottom:.2rem;
margin-top:2.2rem}
table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0}th,td{border:1px solid #ccd;padding:.25rem .5rem;
text-align:right}th{background:#eef1f7}td.l,th.l{text-align:left}
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


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.3g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
    return html.escape(str(value))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], labels: Mapping[str, str] | None = None) -> str:
    labels = labels or {}
    text_cols = {c for c in columns if rows and isinstance(rows[0].get(c), str)}
    head = "".join(f'<th class="{"l" if c in text_cols else ""}">{html.escape(labels.get(c, c))}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in text_cols else ""}">{_fmt(r.get(c))}</td>' for c in columns) + "</tr>"
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


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(r: Mapping[str, Any]) -> str:
    return f"{r['run']}/{r['checkpoint']}/s{r['seed']}"


# ---------------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------------
def headline(metrics: list[dict[str, Any]] | None, pairs: list[dict[str, Any]] | None) -> str:
    if not metrics:
        return empty("No evaluations yet (results/stats/metrics.parquet is missing or empty).")
    p_of: dict[tuple, dict[str, Any]] = {}
    for p in pairs or []:
        if p["seed_a"] == p["seed_b"] or p["kind"] != "A_vs_B":
            p_of.setdefault((p["kind"], p["run_a"], p["checkpoint_a"], p["seed_a"]), p)
    rows = []
    for m in metrics:
        vs_ref = p_of.get(("vs_reference", m["run"], m["checkpoint"], m["seed"]))
        vs_b = p_of.get(("A_vs_B", m["run"], m["checkpoint"], m["seed"])) or p_of.get(
            ("ablation_vs_base", m["run"], m["checkpoint"], m["seed"]))
        rows.append({**m, "p_vs_reference": vs_ref["mcnemar_p"] if vs_ref else None,
                     "p_vs_B": vs_b["mcnemar_p"] if vs_b else None})
    cols = ["run", "checkpoint", "split", "seed", "n_scored", "n_infra", "pass_at_1", "p_vs_reference", "p_vs_B"]
    return table(rows, cols, {"pass_at_1": "pass@1", "p_vs_reference": "McNemar p vs own reference (SFT)",
                              "p_vs_B": "McNemar p vs B (same seed)"}) + (
        '<p class="note">pass@1: greedy, one sample per task, rollouts with a verdict; checkpoint <b>base</b> is the '
        "untrained stand-in where no trained checkpoint exists yet.</p>")


def pairs_section(pairs: list[dict[str, Any]] | None) -> str:
    if not pairs:
        return empty("No paired comparisons (needs two runs or checkpoints on the same tasks).")
    cols = ["kind", "run_a", "checkpoint_a", "seed_a", "run_b", "checkpoint_b", "seed_b", "n", "pass_a", "pass_b",
            "diff", "ci_low", "ci_high", "n10", "n01", "mcnemar_p"]
    return table(pairs, cols) + '<p class="note">diff = pass_a - pass_b; CI: paired bootstrap (percentile); ' \
        "n10: a passes and b fails.</p>"


def revise_split(metrics: list[dict[str, Any]] | None, selection: list[dict[str, Any]] | None) -> str:
    all_rows = [m for m in metrics or [] if "predictive" in (m.get("protocol") or "") and m["n_scored"]]
    if not all_rows:
        return empty("No predictive-protocol evaluations yet.")
    chosen = {(s["run"], s["checkpoint"], s["seed"]) for s in selection or []}
    rows = [m for m in all_rows if (m["run"], m["checkpoint"], m["seed"]) in chosen] or all_rows  # the figure
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows)), 3.4))
    xs = range(len(rows))
    never = [0 if math.isnan(r["never_revised_pass"]) else r["never_revised_pass"] for r in rows]
    ever = [0 if math.isnan(r["ever_revised_pass"]) else r["ever_revised_pass"] for r in rows]
    ax.bar([x - 0.2 for x in xs], never, 0.4, label="never revised", color="#4c72b0")
    ax.bar([x + 0.2 for x in xs], ever, 0.4, label="ever revised", color="#dd8452")
    for x, r in zip(xs, rows, strict=True):
        ax.text(x - 0.2, 0.02, f"n={r['never_revised_n']}", ha="center", fontsize=7, color="white", rotation=90,
                va="bottom")
        ax.text(x + 0.2, 0.02, f"n={r['ever_revised_n']}", ha="center", fontsize=7, rotation=90, va="bottom")
    ax.set_xticks(list(xs), [_label(r) for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1")
    ax.set_title("pass@1 of never- vs ever-revised rollouts")
    ax.legend(fontsize=8)
    cols = ["run", "checkpoint", "seed", "never_revised_n", "never_revised_pass", "ever_revised_n",
            "ever_revised_pass", "revise_rate_fail_patches", "revise_rate_pass_patches", "n_fail_patches",
            "n_pass_patches"]
    return (figure(fig, "REVISE split") + '<p class="note">Figure: the selected checkpoint of each predictive run '
            "and seed; table: every evaluation.</p>" + table(all_rows, cols))


def confusion_section(confusion: list[dict[str, Any]] | None, selection: list[dict[str, Any]] | None) -> str:
    if not confusion:
        return empty("No predictions recorded yet (no predictive-protocol patches).")
    from predict.outcomes import OUTCOMES

    groups: dict[tuple, dict[tuple[str, str], int]] = {}
    for c in confusion:
        groups.setdefault((c["run"], c["checkpoint"], c["split"], c["seed"]), {})[c["verified"], c["predicted"]] = c[
            "count"]
    # one matrix per run: its selected checkpoint (else its first), first seed
    chosen = {(s["run"], s["checkpoint"], s["seed"]) for s in selection or []}
    keys = []
    for run in sorted({k[0] for k in groups}, key=lambda r: (r != "B", r)):
        mine = sorted((k for k in groups if k[0] == run), key=lambda k: ((k[0], k[1], k[3]) not in chosen, k[3], k))
        keys.append(mine[0])
    keys = keys[:6]
    plt = _plt()
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    classes = list(OUTCOMES)
    predicted = classes + (["MALFORMED"] if any(p == "MALFORMED" for k in keys for _, p in groups[k]) else [])
    for ax, key in zip(axes.flat, keys, strict=False):
        counts = groups[key]
        grid = [[counts.get((t, p), 0) for p in predicted] for t in classes]
        im = ax.imshow(grid, cmap="Blues")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v:
                    ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                            color="white" if v > max(map(max, grid)) / 2 else "black")
        short = [c.replace("_", " ").replace("ASSERTION FAILURE", "ASSERT").replace("RUNTIME ERROR", "RUNTIME")
                 .replace("SYNTAX ERROR", "SYNTAX") for c in predicted]
        ax.set_xticks(range(len(predicted)), short, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(classes)), short[: len(classes)], fontsize=7)
        ax.set_xlabel("predicted")
        ax.set_ylabel("verified")
        ax.set_title(f"{key[0]}/{key[1]}/{key[2]}/s{key[3]}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return figure(fig, "confusion matrix") + '<p class="note">Applied patches of the predictive protocol: ' \
        "verified class (seen or shadow execution) against the predicted class.</p>"


PRED_PREFIXES = ("pred_freq_", "prediction_freq_")
VERIFIED_PREFIX = "verified_freq_"


def _train_freqs(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]] | None:
    """class -> (predicted, verified) share at the last logged step of an RL run, if it logs them."""
    if not rows:
        return None
    last = max(rows, key=lambda r: r.get("step") or 0)
    out = {}
    for key, value in last.items():
        for prefix in PRED_PREFIXES:
            if key.startswith(prefix) and value is not None:
                cls = key[len(prefix):]
                out[cls] = (float(value), float(last.get(VERIFIED_PREFIX + cls) or 0.0))
    return out or None


def _freq_chart(pairs: Sequence[tuple[str, float, float]], title: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    xs = range(len(pairs))
    ax.bar([x - 0.2 for x in xs], [p[2] for p in pairs], 0.4, label="verified (real)", color="#55a868")
    ax.bar([x + 0.2 for x in xs], [p[1] for p in pairs], 0.4, label="predicted", color="#c44e52")
    ax.set_xticks(list(xs), [p[0] for p in pairs], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("share of patches")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return figure(fig, title)


def frequencies(classes: list[dict[str, Any]] | None, selection: list[dict[str, Any]] | None,
                rl: Mapping[str, list[dict[str, Any]]]) -> str:
    if not classes:
        out = empty("No predictions recorded in evaluation yet: no class frequencies.")
    else:
        chosen = {(s["run"], s["checkpoint"], s["seed"]) for s in selection or []}
        shown = [c for c in classes if (c["run"], c["checkpoint"], c["seed"]) in chosen] or classes
        shown = [c for c in shown if c["n_predicted"] or c["n_verified"]]
        key = min({(c["run"] != "B", c["run"], c["checkpoint"], c["split"], c["seed"]) for c in shown})
        first = [c for c in shown if (c["run"], c["checkpoint"], c["split"], c["seed"]) == key[1:]]
        out = _freq_chart([(c["cls"], c["predicted_freq"], c["verified_freq"]) for c in first],
                          f"evaluation {key[1]}/{key[2]}/{key[3]}/s{key[4]}: real vs predicted class frequency")
        out += table(shown, ["run", "checkpoint", "split", "seed", "cls", "n_verified", "n_predicted", "verified_freq",
                             "predicted_freq", "precision", "recall"])
        out += '<p class="note">Selected checkpoints; classes neither predicted nor verified are left out.</p>'
    train = {name: f for name, rows in sorted(rl.items()) if (f := _train_freqs(rows))}
    if train:
        name, freqs = next(iter(train.items()))
        out += _freq_chart([(c, p, v) for c, (p, v) in sorted(freqs.items())],
                           f"training {name}, last step: real vs predicted class frequency")
    else:
        out += empty("Training-time frequencies: no RL metrics with pred_freq_<CLASS> / verified_freq_<CLASS> "
                     "columns yet.")
    return out


def ablations_section(tables: Mapping[str, list[dict[str, Any]] | None]) -> str:
    rows = [r for name in sorted(tables) for r in tables[name] or []]
    if not rows:
        return empty("No ablation tables yet.")
    cols = ["ablation", "seed", "checkpoint", "base_checkpoint", "n", "pass_ablation", "pass_base", "pass_A", "diff",
            "ci_low", "ci_high", "mcnemar_p", "focus_metric", "focus_ablation", "focus_base", "selection_fallback"]
    return table(rows, cols, {"selection_fallback": "base stand-in"}) + (
        '<p class="note">alpha0: does the RUNTIME_ERROR distinction survive (recall)? forced_keep: does pass@1 '
        "recover? budget_neutral: does the deficit to Arm A survive a free REVISE?</p>")


def power_section(power: list[dict[str, Any]] | None, config: Mapping[str, Any]) -> str:
    if not power:
        return empty("No power table yet.")
    design = [r for r in power if r["study_design"]]
    verdict = "".join(
        f"<li>delta {r['delta']:.2f} at discordance {r['discordance']:.2f} ({html.escape(r['discordance_source'])}):"
        f" power {r['power']:.2f} &rarr; <b>{'powered' if r['powered'] else 'not powered'}</b></li>"
        for r in design
    )
    # smallest tasks x seeds reaching the target, per delta x discordance
    need: dict[tuple, dict[str, Any]] = {}
    for r in sorted(power, key=lambda r: (r["n_pairs"], r["n_seeds"])):
        k = (r["delta"], r["discordance"], r["discordance_source"])
        if r["powered"] and k not in need:
            need[k] = r
    rows = [{"delta": k[0], "discordance": k[1], "source": k[2],
             "tasks": need[k]["n_tasks"] if k in need else None, "seeds": need[k]["n_seeds"] if k in need else None,
             "power": need[k]["power"] if k in need else None}
            for k in sorted({(r["delta"], r["discordance"], r["discordance_source"]) for r in power})]
    sizes = config["data"]["sizes"]["test"], len(config["seeds"])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    curves = sorted({(r["delta"], r["discordance"], r["discordance_source"]) for r in power})
    for delta, disc, source in curves:
        pts = sorted((r["n_tasks"], r["power"]) for r in power if (r["delta"], r["discordance"],
                     r["discordance_source"]) == (delta, disc, source) and r["n_seeds"] == sizes[1])
        if pts and disc in {min(c[1] for c in curves), max(c[1] for c in curves)}:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    label=f"delta {delta:.2f}, discordance {disc:.2f}")
    ax.axhline((config.get("power") or {}).get("target", 0.8), color="grey", ls="--", lw=0.8)
    ax.axvline(sizes[0], color="black", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"test tasks ({sizes[1]} seed(s); dotted: the study)")
    ax.set_ylabel("power")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6, ncol=2)
    chart = figure(fig, "power curves")
    return (chart + f"<p>The study: {sizes[0]} test tasks x {sizes[1]} seed(s), exact McNemar at alpha "
            f"{(config.get('power') or {}).get('alpha', 0.05)}.</p><ul>{verdict}</ul>"
            + "<p>Smallest design on the grid reaching the target power (empty: none on the grid):</p>"
            + table(rows, ["delta", "discordance", "source", "tasks", "seeds", "power"]))


def training(rl: Mapping[str, list[dict[str, Any]]], expected: Sequence[str]) -> str:
    missing = [name for name in expected if not rl.get(name)]
    note = empty(f"No RL metrics yet for: {', '.join(missing)}.") if missing else ""
    present = {k: v for k, v in rl.items() if v}
    if not present:
        return note or empty("No RL runs configured.")
    metrics = [c for c in ("reward", "pass_rate", "loss", "revise_rate", "budget_exhausted")
               if any(c in rows[0] for rows in present.values())]
    plt = _plt()
    fig, axes = plt.subplots(1, max(1, len(metrics)), figsize=(3.6 * max(1, len(metrics)), 3), squeeze=False)
    for ax, col in zip(axes[0], metrics, strict=False):
        for name, rows in sorted(present.items()):
            pts = sorted((r["step"], r[col]) for r in rows if r.get(col) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1.3)
        ax.set_title(col, fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return figure(fig, "training curves") + note


def _tag(text: str, cls: str = "") -> str:
    return f'<span class="tag {cls}">{html.escape(text)}</span>'


def rollout_section(rows: list[dict[str, Any]] | None, tasks: Mapping[int, Mapping[str, Any]]) -> str:
    if not rows:
        return empty("No evaluation rollouts to render.")
    # the most telling one: predictions, a REVISE, then a pass
    row = max(rows, key=lambda r: (bool(r.get("n_predictions")), bool(r.get("ever_revised")), bool(r.get("final_pass")),
                                   bool(r.get("n_patches")), -r["task_id"]))
    task = tasks.get(row["task_id"]) or {}
    passed = row.get("final_pass")
    out = [f"<p><b>task {row['task_id']}</b> &middot; run arm {html.escape(str(row['arm']))} "
           f"({html.escape(str(row['protocol']))}, variant {html.escape(str(row['variant']))}) &middot; checkpoint "
           f"{html.escape(str(row['checkpoint']))} &middot; seed {row['seed']} &middot; split "
           f"{html.escape(str(row['split']))} &middot; final "
           f"{_tag(str(row.get('final_outcome')), 'pass' if passed else 'fail')} stop {html.escape(str(row['stop_reason']))}"
           f" &middot; calls {row['calls_used']}/{row['budget']}</p>"]
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


# ---------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------
def _rl_name(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.parent.name}"  # results/rl/{run}/seed{seed}/metrics.parquet


def build_report(
    config: Mapping[str, Any],
    *,
    stats_dir: Path,
    ablations: Sequence[Path],
    power: Path,
    out: Path,
    example: Path | None = None,
    rl_metrics: Sequence[Path] = (),
    tasks: Path | None = None,
) -> Path:
    """Write the self-contained report page; returns its path."""
    from predict.io import write_text

    def stat(name: str) -> list[dict[str, Any]] | None:
        return _read(stats_dir / f"{name}.parquet")

    metrics, pairs, selection = stat("metrics"), stat("pairs"), stat("selection")
    rl = {_rl_name(p): (_read(p) or []) for p in rl_metrics}
    expected = [f"{run}/seed{seed}" for run in [*config["arms"], *(config.get("ablations") or {})]
                for seed in config["seeds"]]
    task_rows = {r["task_id"]: r for r in (_read(tasks) or [])} if tasks else {}
    body = {
        "headline": headline(metrics, pairs),
        "pairs": pairs_section(pairs),
        "selection": table(selection, ["run", "seed", "mode", "step", "checkpoint", "val_pass_at_1", "fallback"],
                           {"fallback": "base stand-in"}) if selection else empty("No selection yet."),
        "mechanism": table(metrics, ["run", "checkpoint", "split", "seed", "first_patch_pass", "recovery_rate",
                                     "revise_rate", "budget_exhausted", "budget_exhausted_revise",
                                     "budget_exhausted_keep", "malformed_prediction_rate"]) if metrics
        else empty("No evaluations yet."),
        "revise-split": revise_split(metrics, selection),
        "confusion": confusion_section(stat("confusion"), selection),
        "frequencies": frequencies(stat("classes"), selection, rl),
        "ablations": ablations_section({Path(p).stem: _read(Path(p)) for p in ablations}),
        "power": power_section(_read(power), config),
        "training": training(rl, expected),
        "rollout": rollout_section(_read(example), task_rows),
    }
    nav = "".join(f'<a href="#{sid}">{html.escape(title.split(":")[0])}</a>' for sid, title in SECTIONS)
    sections = "".join(f'<section id="{sid}"><h2>{html.escape(title)}</h2>{body[sid]}</section>'
                       for sid, title in SECTIONS)
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>PREDICT report: '
            f'{html.escape(config["run_name"])}</title><style>{CSS}</style></head><body>'
            f"<h1>Reactive vs. Predictive Post-Training for Coding Agents</h1>"
            f'<p class="note">run <b>{html.escape(config["run_name"])}</b>, model '
            f'{html.escape(str(config["model"]["base"]))}, seeds {", ".join(map(str, config["seeds"]))}; built '
            f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} from parquet only.</p><nav>{nav}</nav>{sections}'
            "</body></html>")
    return write_text(page, out)

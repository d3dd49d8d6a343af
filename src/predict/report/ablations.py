"""The ablations (Arm B with one part taken out, vs Arm B) and the extensions (vs Arm A and Arm B, with each
extension's mechanism metric): their sections on val and the rows the frozen test's section reuses."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from predict.report.elements import agg_pyplot, empty, figure, format_value, is_missing, points, pval, table


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

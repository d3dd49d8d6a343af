"""The open question (issue 28): does predicting consequences help when they cannot be cheaply observed after
acting? Arm B vs Arm A within each environment, on the frozen test and on val, with the power of its family of tests
(`predict.stats.open_question`)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from predict.report.elements import agg_pyplot, empty, figure, format_value, is_missing, pct, points, pval, table

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
    family = sum(not is_missing(r["mcnemar_p"]) for r in rows)  # Holm leaves a row with no p-value out of it
    return table(out, list(out[0]), wrap=("pairing",), labels={
        "environment": "environment", "pairing": "Arm A vs Arm B (run / selected checkpoint / seed)",
        "pass_A": "Arm A pass@1", "pass_B": "Arm B pass@1", "diff": "B - A [95% CI]",
        "disc": "tasks only B / only A passes", "p": "exact McNemar p",
        "holm": f"Holm-adjusted p (family of {family})", "precision": "Arm B REVISE precision",
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
    columns, `predict.stats.power.with_open_question_power`)."""
    design = [r for r in power or [] if r["design"] == "test" and not is_missing(r.get("power_open_question"))]
    if not design:
        return empty("No power of the open question's comparison yet (power.parquet has no open-question columns).")
    head = design[0]
    rows = [{"delta": f"{100 * r['delta']:.0f} pts", "d": f"{r['discordance']:.2f}", "source": r["discordance_source"],
             "power": format_value(r["power_open_question"]),
             "powered": "powered" if r["powered_open_question"] else "not powered"}
            for r in sorted(design, key=lambda r: (r["delta"], r["discordance"]))]
    return (f"<p>Power of one test of this family ({head['family_size_open_question']} tests: every environment x "
            f"seed pairing) on the {head['n_tasks']} test tasks, exact McNemar at the family's strictest Holm level "
            f"{format_value(head['holm_significance_open_question'])}: a lower bound of its power under Holm, which "
            "holds the other tests to looser levels (the Power section says what is assumed):</p>"
            + table(rows, list(rows[0]), {"delta": "difference to detect", "d": "discordance",
                                          "source": "discordance from", "power": "power, Holm-adjusted (at least)",
                                          "powered": "verdict (on the lower bound)"}))


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

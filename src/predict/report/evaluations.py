"""The sections on one split's evaluations (results/stats/ on val; the frozen test's reuse them): greedy pass@1,
paired comparisons, mechanism metrics, the REVISE split, the prediction confusion matrix and class shares."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from predict.report.elements import (
    agg_pyplot,
    empty,
    eval_key,
    eval_label,
    figure,
    is_missing,
    pct,
    points,
    pval,
    table,
)


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
    from predict.vocabulary import OUTCOMES

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

"""The training sections, from the RL metrics of the runs (results/rl/{run}/seed{seed}/metrics.parquet) and the
training outcomes: the training curves and where a step's time goes, the RL and CE terms' gradient interference, and
the verified vs predicted classes over all RL steps."""

from __future__ import annotations

import html
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from predict.report.elements import agg_pyplot, empty, figure, is_missing, table
from predict.report.evaluations import class_share_chart

CURVES = {"reward_mean": "mean reward", "pass_rate": "pass rate", "loss": "loss", "revise_rate": "REVISE rate",
          "budget_exhausted_rate": "budget exhausted"}
"""The per-step columns (`predict.train.step_metrics`) the training curves plot, with their titles."""


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
"""The parts of an RL step's time (`predict.train.step_metrics`) the step-time bar stacks, with their labels."""


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
              "other_s": "other s", "step_s": "step s"}
    cols = ["run", *STEP_PARTS, "other_s", "step_s"]
    return figure(fig, "step time split") + table(rows, cols, labels)


# ---------------------------------------------------------------------------------------------------------------
# Gradient interference (predict.train.grad_terms)
# ---------------------------------------------------------------------------------------------------------------
GRAD_TERM_PANELS = {"rl_grad_norm": "RL term: gradient norm", "ce_grad_norm": "CE term: gradient norm",
                    "rl_ce_grad_cosine": "cosine(RL gradient, CE gradient)"}


PAPER_BACKEND_NOTE = ("The paper backend (prime-rl) does not measure these: its custom-loss hook is a function of one "
                      "sample's RL log-probs and never sees the CE term, the parameters or their gradients (one "
                      "backward of the summed loss follows it).")


def grad_terms_section(rl: Mapping[str, list[dict[str, Any]]], config: Any) -> str:
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
             if prime_rl else "")
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
                        color=colour[name])
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
                     "ratio": median(ratios), "cosine": median([r.get("rl_ce_grad_cosine") for r in steps])})
    labels = {"run": "run / seed", "n_steps": "steps measured", "rl": "RL gradient norm (median)",
              "ce": "CE gradient norm (median)", "ratio": "CE / RL norm (median)", "cosine": "cosine (median)"}
    return (figure(fig, "gradient terms per step") + table(rows, list(labels), labels)
            + '<p class="note">Each norm is its term\'s gradient over every trainable parameter, before clipping, on '
            "the step's whole batch (local trainer, <code>predict.train.grad_terms</code>); the cosine is undefined "
            "(–) where a norm is 0.</p>" + notes)


# ---------------------------------------------------------------------------------------------------------------
# Training outcomes (results/stats/training_outcomes.parquet)
# ---------------------------------------------------------------------------------------------------------------
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

"""The plan beside what the run took, per rule (issue 60): the plan's table (results/plan/plan.parquet, `predict plan`
run by the workflow's `plan` rule) and Snakemake's benchmark files, read into one parquet table per job
(`plan_vs_run`, written beside the report) that the section is drawn from.

Rules:

* A job is matched by its benchmark file: the plan's row names the one Snakemake's dry-run gave it.
* A job the plan has and the run has not measured (yet: the report runs before the bundle and the Inspect logs) has
  no measured time; a measured job the plan has not (another config's, an older run's) is left out.
* Times are per job as Snakemake's benchmark measures them (wall seconds); the plan's are the same quantity
  (`predict.plan.schedule`), with a shared server's start paid by the job the plan lays it on.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from predict.report.elements import agg_pyplot, empty, figure, table

SCHEMA = pa.schema([
    ("rule", pa.string()), ("job", pa.string()), ("benchmark", pa.string()),
    ("planned_s", pa.float64()), ("took_s", pa.float64()), ("took_over_planned", pa.float64()),
    ("host_peak_mib", pa.float64()), ("not_calibrated", pa.string()),
])
LABELS = {"rule": "rule", "jobs": "jobs", "measured": "jobs measured", "planned_s": "planned, s (all its jobs)",
          "took_s": "took, s (the measured jobs)", "ratio": "took / planned", "worst": "the job furthest from its plan",
          "peak": "largest peak RSS, MiB", "missing": "not calibrated"}


def _key(path: str | None) -> str:
    return os.path.normpath(path) if path else ""


def benchmark_rows(benchmarks: Path) -> dict[str, dict[str, float]]:
    """{benchmark file: its wall seconds and peak RSS} for every Snakemake benchmark under `benchmarks`."""
    out: dict[str, dict[str, float]] = {}
    for tsv in sorted(benchmarks.rglob("*.tsv")) if benchmarks.is_dir() else []:
        with open(tsv) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if rows and rows[-1].get("s") not in (None, "", "NA"):
            last = rows[-1]
            rss = last.get("max_rss")
            out[_key(str(tsv))] = {"s": float(last["s"]),
                                   "max_rss": float(rss) if rss not in (None, "", "NA", "-") else float("nan")}
    return out


def plan_vs_run(plan: Sequence[Mapping[str, Any]], benchmarks: Path) -> pa.Table:
    """One row per planned job: its planned and measured wall seconds, their ratio, the measured peak RSS."""
    measured = benchmark_rows(benchmarks)
    rows = []
    for p in plan:
        if not p.get("benchmark"):
            continue  # a target rule, or a rule without a benchmark (nothing to compare with)
        m = measured.get(_key(p["benchmark"]))
        took, planned = (m or {}).get("s"), p.get("planned_s")
        rss = (m or {}).get("max_rss")
        rows.append({"rule": p["rule"], "job": p["job"], "benchmark": p["benchmark"], "planned_s": planned,
                     "took_s": took, "took_over_planned": took / planned if took is not None and planned else None,
                     "host_peak_mib": None if rss is None or rss != rss else rss,
                     "not_calibrated": p.get("not_calibrated") or ""})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def write_plan_vs_run(plan_table: Path, benchmarks: Path, out: Path) -> Path:
    import pyarrow.parquet as pq

    from predict.outputs import write_table

    plan = pq.read_table(plan_table).to_pylist() if plan_table.is_file() else []
    write_table(plan_vs_run(plan, benchmarks), out)
    return out


def _family(rule: str) -> str:
    from predict.plan.costs import family

    return family(rule)


def run_costs_section(rows: Sequence[Mapping[str, Any]] | None) -> str:
    """Per rule: planned and measured seconds, their ratio, the job furthest from its plan; a figure of both."""
    if not rows:
        return empty("No plan beside the run: the workflow plans the run where its device kind has a calibration "
                     "(cluster.device_kind; the CPU's where it serves on the CPU).")
    by_rule: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_rule.setdefault(_family(r["rule"]), []).append(r)
    out = []
    for rule, jobs in by_rule.items():
        done = [j for j in jobs if j["took_s"] is not None]
        planned = [j["planned_s"] for j in jobs]
        known = all(p is not None for p in planned)
        both = [j for j in done if j["planned_s"]]
        worst = max(both, key=lambda j: abs(j["took_over_planned"] - 1), default=None)
        peaks = [j["host_peak_mib"] for j in done if j["host_peak_mib"] is not None]
        planned_total = sum(planned) if known else None
        took_total = sum(j["took_s"] for j in done) if done else None
        out.append({
            "rule": rule, "jobs": len(jobs), "measured": len(done), "_planned": planned_total, "_took": took_total,
            "planned_s": f"{planned_total:.0f}" if planned_total is not None else "n/c",
            "took_s": f"{took_total:.0f}" if took_total is not None else "not run yet",
            "ratio": (f"{sum(j['took_s'] for j in both) / sum(j['planned_s'] for j in both):.2f}" if both else "–"),
            "worst": f"{worst['job']}: {worst['took_s']:.0f} s vs {worst['planned_s']:.0f} s" if worst else "–",
            "peak": round(max(peaks)) if peaks else "–",
            "missing": "; ".join(dict.fromkeys(m for j in jobs for m in j["not_calibrated"].split("; ") if m)) or "–",
        })
    total_planned = sum(j["planned_s"] for j in rows if j["planned_s"] and j["took_s"] is not None)
    total_took = sum(j["took_s"] for j in rows if j["planned_s"] and j["took_s"] is not None)
    note = ('<p class="note">Each job\'s wall time as its Snakemake benchmark measured it, beside the time '
            "<code>predict plan</code> gave it (docs/plan.md) before the run. Summed over jobs, so jobs that ran side "
            f"by side count each: over the {sum(1 for j in rows if j['planned_s'] and j['took_s'] is not None)} "
            f"jobs with both, took {total_took:.0f} s against {total_planned:.0f} s planned. "
            "A job's time limit on SLURM is its plan x 2 (predict.plan.limits).</p>")
    plotted = [r for r in out if r["_planned"] is not None and r["_took"] is not None]
    fig_html = ""
    if plotted:
        plt = agg_pyplot()
        fig, ax = plt.subplots(figsize=(7, 0.32 * len(plotted) + 1))
        ys = range(len(plotted))
        ax.barh([y + 0.2 for y in ys], [r["_planned"] for r in plotted], height=0.4, label="planned")
        ax.barh([y - 0.2 for y in ys], [r["_took"] for r in plotted], height=0.4, label="took")
        ax.set_yticks(list(ys), [r["rule"] for r in plotted])
        ax.invert_yaxis()
        ax.set_xlabel("seconds, summed over the rule's jobs")
        ax.legend(loc="lower right")
        fig_html = figure(fig, "planned against measured seconds per rule")
    columns = ["rule", "jobs", "measured", "planned_s", "took_s", "ratio", "worst", "peak", "missing"]
    return note + table(out, columns, LABELS, wrap=("worst", "missing")) + fig_html

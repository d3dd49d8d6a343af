"""`predict report`: the study report's command (the page itself: predict.report.build)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predict.stages import StageSettings


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stats-dir", required=True, help="the val statistics (results/stats/)")
    p.add_argument("--test-stats", default=None,
                   help="the test statistics (results/test/stats/): the report then opens with the test")
    p.add_argument("--training-outcomes", default=None, help="results/stats/training_outcomes.parquet")
    p.add_argument("--ablations", nargs="*", default=[])
    p.add_argument("--extensions", nargs="*", default=[], help="results/extensions/{name}.parquet")
    p.add_argument("--open-question", default=None, help="results/extensions/open_question.parquet (val)")
    p.add_argument("--power", required=True)
    p.add_argument("--example", default=None, help="an evaluation parquet to render one rollout from")
    p.add_argument("--rl-metrics", nargs="*", default=[], help="results/rl/{run}/seed{seed}/metrics.parquet")
    p.add_argument("--tasks-file", default=None, help="the example's split parquet, for the task text")
    p.add_argument("--plan", default=None, help="the run's plan (results/plan/plan.parquet, `predict plan`)")
    p.add_argument("--benchmarks", default=None, help="Snakemake's benchmark files (results/benchmarks/)")
    p.add_argument("--plan-vs-run-out", default=None,
                   help="write the plan beside the benchmarks here (parquet), and show it per rule")
    p.add_argument("--plan-vs-run", default=None,
                   help="a plan-beside-the-run table written before (the bundle's, re-rendered by verify-bundle)")
    p.add_argument("--out", required=True)


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console
    from predict.report import build_report
    from predict.report.run_costs import write_plan_vs_run

    plan_vs_run = Path(args.plan_vs_run) if args.plan_vs_run else None
    if args.plan and args.benchmarks and args.plan_vs_run_out:
        plan_vs_run = write_plan_vs_run(Path(args.plan), Path(args.benchmarks), Path(args.plan_vs_run_out))
    out = build_report(
        config,
        stats_dir=Path(args.stats_dir),
        test_stats_dir=Path(args.test_stats) if args.test_stats else None,
        ablations=[Path(p) for p in args.ablations],
        extensions=[Path(p) for p in args.extensions],
        open_question=Path(args.open_question) if args.open_question else None,
        power=Path(args.power),
        example=Path(args.example) if args.example else None,
        rl_metrics=[Path(p) for p in args.rl_metrics],
        tasks=Path(args.tasks_file) if args.tasks_file else None,
        training_outcomes=Path(args.training_outcomes) if args.training_outcomes else None,
        plan_vs_run=plan_vs_run,
        out=Path(args.out),
    )
    console.print(f"report: {out}")
    return 0

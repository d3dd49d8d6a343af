"""The verifier report: run every gold solution of the chosen splits through the sandbox.

Gold code should PASS its own tests; anything else is either a documented slow task or a verifier
bug, so this report is the first thing to read after changing the sandbox or the timeouts.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from predict.data import load_split
from predict.outputs import write_rows
from predict.vocabulary import OUTCOMES

if TYPE_CHECKING:
    from predict.stages import StageSettings

GOLD_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("task_id", pa.int64()),
        ("outcome", pa.string()),
        ("detail", pa.string()),
        ("duration_s", pa.float64()),
    ]
)
SUMMARY_SCHEMA = pa.schema([("split", pa.string()), ("outcome", pa.string()), ("count", pa.int64())])


def check_gold(
    data_dir: str | Path,
    splits: Sequence[str],
    *,
    timeout_s: float,
    memory_mb: int,
    workers: int,
    outcome_labels: str,
    require: str | Sequence[str],
    accept_weaker: bool,
    progress: bool = True,
    isolation: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per task of the given splits: the verified outcome of its gold solution.

    Before any check, the pool's isolation layers are held against ``require`` (config verifier.isolation): a missing
    one raises IsolationError unless ``accept_weaker``. The isolation record goes into ``isolation`` if given.
    """
    from predict.sandbox import Verifier, check_isolation

    tasks = [(split, row) for split in splits for row in load_split(Path(data_dir) / f"{split}.parquet")]
    with Verifier(timeout_s=timeout_s, memory_mb=memory_mb, workers=workers, outcome_labels=outcome_labels) as v:
        record = check_isolation(v.isolation_status(), require, accept_weaker)
        if isolation is not None:
            isolation.update(record)
        verdicts = v.check_many(
            [(row["code"], row["test_list"], row["test_setup_code"]) for _, row in tasks], progress=progress
        )
    return [
        {
            "split": split,
            "task_id": row["task_id"],
            "outcome": str(verdict.outcome),
            "detail": verdict.detail,
            "duration_s": verdict.duration_s,
        }
        for (split, row), verdict in zip(tasks, verdicts, strict=True)
    ]


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Counts by split and outcome class, every class listed (zeros included) so tables line up."""
    counts = Counter((r["split"], r["outcome"]) for r in rows)
    splits = sorted({r["split"] for r in rows})
    return [{"split": s, "outcome": o, "count": counts[(s, o)]} for s in splits for o in OUTCOMES]


def write_gold_report(rows: Sequence[dict[str, Any]], out: str | Path, summary_out: str | Path,
                      isolation: Mapping[str, Any] | None = None) -> None:
    """Both parquets; the isolation record (active layers, what was required) goes into their schema metadata."""
    from predict.sandbox import isolation_metadata

    metadata = isolation_metadata(dict(isolation)) if isolation else None
    write_rows(rows, GOLD_SCHEMA, out, metadata)
    write_rows(summarize(rows), SUMMARY_SCHEMA, summary_out, metadata)


# `predict verify-gold`: the gold solutions of config verifier.gold_splits under the verifier's settings.
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, help="the folder of `predict split`'s parquets")
    p.add_argument("--workers", type=int, default=None,
                   help="sandbox workers (default: verifier.workers; the rule passes its threads, which Snakemake "
                        "may lower to the cores it has)")
    p.add_argument("--out", required=True, help="per-task parquet")
    p.add_argument("--summary-out", required=True, help="counts by split and class, parquet")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    import logging

    from predict.outputs import print_table

    log = logging.getLogger("predict")
    verifier = config.verifier
    isolation: dict = {}
    rows = check_gold(
        args.data_dir,
        verifier.gold_splits,
        timeout_s=verifier.timeout_s,
        memory_mb=verifier.memory_mb,
        workers=args.workers if args.workers is not None else verifier.workers,
        outcome_labels=verifier.outcome_labels,
        require=verifier.isolation.require,
        accept_weaker=verifier.isolation.accept_weaker,
        isolation=isolation,
    )
    write_gold_report(rows, args.out, args.summary_out, isolation)
    if isolation["missing"]:
        log.warning("weaker sandbox isolation accepted: %s not active", ", ".join(isolation["missing"]))
    print_table("Verifier report: gold solutions by class", ("split", "outcome", "gold solutions"),
                [(e["split"], e["outcome"], e["count"]) for e in summarize(rows) if e["count"]])
    for r in rows:
        if r["outcome"] != "PASS":
            log.warning("gold solution of task %s (%s) is %s: %s", r["task_id"], r["split"], r["outcome"], r["detail"])
    return 0

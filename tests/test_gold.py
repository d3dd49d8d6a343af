"""The verifier report stage: gold solutions through the sandbox, counted by class."""

from __future__ import annotations

from pathlib import Path

from predict.data import MBPP_SCHEMA
from predict.outputs import read_rows, write_rows
from predict.sandbox.gold import check_gold, summarize, write_gold_report
from predict.vocabulary import OUTCOMES


def test_gold_report_counts_every_class(tmp_path: Path, mbpp_rows: list[dict]) -> None:
    rows = [dict(r) for r in mbpp_rows[:3]]
    rows[1]["code"] = rows[1]["code"] + "\nraise ValueError('broken on purpose')"
    rows[2]["code"] = "def oops(:\n"
    write_rows(rows, MBPP_SCHEMA, tmp_path / "val.parquet")
    report = check_gold(tmp_path, ["val"], timeout_s=3.0, memory_mb=1024, workers=1,
                        outcome_labels="structured", require="auto", accept_weaker=False, progress=False)
    assert [(r["task_id"], r["outcome"]) for r in report] == [
        (rows[0]["task_id"], "PASS"), (rows[1]["task_id"], "RUNTIME_ERROR"), (rows[2]["task_id"], "SYNTAX_ERROR")
    ]
    summary = summarize(report)
    assert [s["outcome"] for s in summary] == list(OUTCOMES), "every class listed, zeros included"
    assert {s["outcome"]: s["count"] for s in summary} == {
        "PASS": 1, "ASSERTION_FAILURE": 0, "RUNTIME_ERROR": 1, "SYNTAX_ERROR": 1, "TIMEOUT": 0, "OTHER": 0
    }
    write_gold_report(report, tmp_path / "gold.parquet", tmp_path / "summary.parquet")
    assert read_rows(tmp_path / "gold.parquet") == report
    assert sum(r["count"] for r in read_rows(tmp_path / "summary.parquet")) == 3

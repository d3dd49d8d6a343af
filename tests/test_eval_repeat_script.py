"""benchmarks/eval_repeat.py's comparison of rows (issue 59): where two runs' rows first differ, the trajectory before
the counts that follow from it, how many outcomes differ, and the rows of separate processes compared from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def eval_repeat():
    return benchmark_script("eval_repeat")


def _row(task: int, replies: list[str], outcome: str = "ASSERTION_FAILURE") -> dict:
    return {"task_id": task, "n_input_tokens": 100 * len("".join(replies)), "final_outcome": outcome,
            "final_pass": outcome == "PASS", "steps": [{"index": i, "reply": r} for i, r in enumerate(replies)]}


def test_a_differing_reply_is_named_before_the_counts_it_changes(eval_repeat) -> None:
    a, b = _row(1, ["read", "patch x"]), _row(1, ["read", "patch y!"])
    assert eval_repeat.first_difference(a, b) == "steps[1].reply@6"  # not n_input_tokens, which sorts first
    assert eval_repeat.first_difference(a, dict(a)) is None
    assert eval_repeat.first_difference(a, _row(1, ["read"])) == "steps.len"
    found = eval_repeat.differences([a, _row(2, ["x"])], [b, _row(2, ["x"], outcome="PASS")])
    assert found == {"first": {"1": "steps[1].reply@6", "2": "final_outcome@0"}, "outcome_differs": 1}


def test_rows_of_separate_processes_compare_from_their_files(eval_repeat, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for name, second in (("a", "patch x"), ("b", "patch x"), ("c", "patch z")):
        f = tmp_path / f"{name}.jsonl"
        f.write_text(json.dumps({"mode": "invariant", "rows": [_row(1, ["read", second]), _row(2, ["x"])]}) + "\n")
        files.append(f)
    assert eval_repeat.compare_files(files) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["tasks_whose_rows_differ"], r["first_differences"]) for r in report["against"]] == [
        (0, {}), (1, {"1": "steps[1].reply@6"})]

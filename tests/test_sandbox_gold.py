"""All 974 MBPP gold solutions PASS in the sandbox (3 s timeout, 2 workers), except the documented slow ones.

A gold solution that does not PASS is a verifier bug (or a too-tight limit), so this is the sandbox's main
regression test. The data is found through PREDICT_MBPP_PATH, defaulting to the repository's
resources/mbpp/mbpp.jsonl.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from predict.sandbox import Verifier
from predict.vocabulary import Outcome

MBPP_PATH = Path(os.environ.get("PREDICT_MBPP_PATH",
                                Path(__file__).resolve().parents[1] / "resources" / "mbpp" / "mbpp.jsonl"))
TIMEOUT_S = 3.0
WORKERS = 2

# Gold solutions allowed to TIMEOUT instead of PASS (they may still PASS on a faster or idle machine).
# benchmarks/verifier.py reads this literal (with ast, without importing this module) as its documented slow-task
# list: keep it a plain dict of int -> str.
KNOWN_EXCEPTIONS: dict[int, str] = {
    123: "amicable_numbers_sum(9999) is O(n^2) trial division: ~2.7 s alone, over 3 s on 2 busy cores",
}


@pytest.fixture(scope="module")
def gold_rows() -> list[dict]:
    if not MBPP_PATH.exists():
        pytest.fail(f"MBPP not found at {MBPP_PATH}; set PREDICT_MBPP_PATH")
    with MBPP_PATH.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow
def test_all_gold_solutions_pass(gold_rows: list[dict]) -> None:
    assert len(gold_rows) == 974
    items = [(r["code"], r["test_list"], r["test_setup_code"]) for r in gold_rows]
    start = time.perf_counter()
    with Verifier(timeout_s=TIMEOUT_S, workers=WORKERS) as verifier:
        verdicts = verifier.check_many(items)
    elapsed = time.perf_counter() - start
    counts = Counter(v.outcome for v in verdicts)
    print(f"\n{len(items)} gold checks in {elapsed:.1f}s ({len(items) / elapsed:.0f}/s): "
          f"{ {o.value: n for o, n in counts.items()} }")

    assert counts[Outcome.OTHER] == 0, "the verifier itself failed on a gold solution"
    unexpected = {
        r["task_id"]: (v.outcome.value, v.detail, v.stderr[-500:])
        for r, v in zip(gold_rows, verdicts, strict=True)
        if v.outcome is not Outcome.PASS
        and not (r["task_id"] in KNOWN_EXCEPTIONS and v.outcome is Outcome.TIMEOUT)
    }
    assert not unexpected, unexpected
    assert elapsed < 120, f"the gold loop took {elapsed:.0f}s; it should stay under 2 minutes"

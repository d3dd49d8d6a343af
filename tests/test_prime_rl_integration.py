"""PredictAlgorithm inside prime-rl's own orchestrator code (registry, Rollout/Trace, sample building, stamping,
zero-advantage filter, the trainer's sample check), on the CPU, at the pinned commit with the patch applied.

Needs the pinned sources (PREDICT_PRIME_RL_SRC, and PREDICT_VERIFIERS_SRC unless the checkout has its submodules;
see test_prime_rl_patch.py) and PREDICT_PRIME_RL_PYTHON: an interpreter with prime-rl's runtime dependencies
(prime-rl's own ``.venv/bin/python`` after ``predict prime-rl-setup``, or any with torch, msgspec, loguru, pydantic,
tokenizers). Skipped with the reason otherwise; it runs tests/prime_rl_real_flow.py in that interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from predict.train.prime_rl.cluster import PATCH
from tests.test_prime_rl_patch import _source, _verifiers_source

FLOW = Path(__file__).with_name("prime_rl_real_flow.py")


def test_predict_algorithm_in_prime_rls_orchestrator(tmp_path: Path) -> None:
    python = os.environ.get("PREDICT_PRIME_RL_PYTHON")
    if not python:
        pytest.skip("PREDICT_PRIME_RL_PYTHON is not set: an interpreter with prime-rl's runtime dependencies")
    src = _source(tmp_path)
    vf_src = _verifiers_source(tmp_path, src)
    work = tmp_path / "patched"
    subprocess.run(["cp", "-r", str(src), str(work)], check=True)
    subprocess.run(["git", "apply", str(PATCH)], cwd=work, check=True)
    result = subprocess.run([python, str(FLOW), str(work), str(vf_src)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["registered"]
    # rewards 1 and 0: GRPO advantages +-0.5 on the RL tokens, 8 label tokens out of RL, 3 CE samples each
    assert [r["advantages"] for r in out["mixed"]] == [[0.0, 0.5], [-0.5, 0.0]]
    assert all(r == {**r, "n_rl": 1, "n_ce": 3, "rl_zeroed": 8, "filtered": False} for r in out["mixed"])
    # equal rewards: the CE samples ship on their own (no advantage stream), past the zero-advantage filter
    assert all(r == {"filtered": False, "n_rl": 0, "n_ce": 3, "rl_zeroed": 0, "advantages": None} for r in out["equal"])
    # alpha 0 and equal rewards: nothing to keep, prime-rl's filter drops the rollouts as usual
    assert all(r["filtered"] and r["n_ce"] == 0 for r in out["alpha0_equal"])

"""Evaluation and sampled rollouts repeat on the real vLLM-CPU server (slow: one server start, shared by all runs).

The local config's evaluation of one checkpoint on 4 val tasks, run twice: first on a freshly started shared server
(the session's, tests/conftest.py: shared_vllm_cache; any server already recorded there is stopped first, and the
first evaluation must have started it) with ``env.concurrency`` 4, then on the same server reused (weights loaded in
place) with ``env.concurrency`` 2. The CPU build has no batch-invariant kernels, so evaluation sends one request at a
time (`predict.serving.identity`) and the rows are equal. On the old code requests were batched at the config's
concurrency and the greedy trajectories of the tiny model's near-tied logits differed between the runs. Then two
sampled (temperature 1) batches of the same tasks on that server: every request carries its rollout's seed, so the
rows are equal; without seeds they differ. The server is left running for the session's next leases (test_rl_vllm,
test_shared_server); the session stops it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from predict.env.records import PER_RUN_COLUMNS as PER_RUN  # times and a random id
from predict.serving.server import default_python

from .conftest import SESSION_SHARED

VLLM_PY = default_python("cpu")
needs_vllm = pytest.mark.skipif(VLLM_PY == sys.executable and not os.environ.get("CI"), reason="no .venv-vllm")
VAL_TASKS = (2, 11, 127, 12)
SAMPLED_TASKS = 2  # of VAL_TASKS, at 32 tokens a call: enough to show the seeds, little enough for a loaded machine


def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in r.items() if k not in PER_RUN} for r in rows), key=lambda r: r["rollout_key"])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~6 min alone; 15-25 min were seen beside other servers on the loaded 2-core machine
@needs_vllm
def test_real_evaluation_and_sampled_rollouts_repeat_across_servers_and_concurrency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mbpp_rows: list[dict[str, Any]], tiny: Path,
    shared_vllm_cache: Path,
) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    import predict.serving.server
    from predict.config import REPO_ROOT, load_config
    from predict.data import MBPP_SCHEMA
    from predict.evaluate import CheckpointEval, evaluate_checkpoints, evaluation_config
    from predict.outputs import read_rows, write_rows
    from predict.rollouts import RolloutJob, run_job

    model = tiny
    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    monkeypatch.setattr(predict.serving.server, "default_cache_dir", lambda: shared_vllm_cache)  # the session's
    predict.serving.server.stop_shared_server(shared_vllm_cache)  # the first evaluation starts a fresh one
    study = load_config(REPO_ROOT / "config" / "local.yaml")
    study["serving"] = {**study["serving"], "python": VLLM_PY, "shared": SESSION_SHARED}
    tasks = write_rows([r for r in mbpp_rows if r["task_id"] in VAL_TASKS], MBPP_SCHEMA, tmp_path / "val.parquet")

    def evaluation(name: str, concurrency: int) -> list[dict[str, Any]]:
        config = {**study, "env": {**study["env"], "concurrency": concurrency}}
        out = tmp_path / name / "A" / "sft" / "val" / "seed1.parquet"
        evaluate_checkpoints(evaluation_config(config, "val"), run="A", split="val", seed=1, tasks_path=tasks,
                             checkpoints=[CheckpointEval("sft", str(model), out)])
        return comparable(read_rows(out))

    def sampled(name: str) -> list[dict[str, Any]]:
        job = RolloutJob(tasks_path=tasks, split="val", out=tmp_path / name / "seed3.parquet", model=str(model),
                         checkpoint="rl-A-step0", arm="A", seed=3, n_tasks=SAMPLED_TASKS,
                         sampling={"temperature": 1.0, "max_tokens": 32})
        run_job(job, {**study, "env": {**study["env"], "concurrency": 1}})
        return comparable(read_rows(job.out))

    fresh = evaluation("fresh", concurrency=4)
    server_json = shared_vllm_cache / "serving" / "server.json"
    state = json.loads(server_json.read_text())
    assert state["leases"] == 1  # the fresh evaluation started the server
    reused = evaluation("reused", concurrency=2)
    assert json.loads(server_json.read_text())["pid"] == state["pid"]  # the same server, reused
    first, second = sampled("sampled1"), sampled("sampled2")
    assert len(fresh) == len(VAL_TASKS) and all(r["ok"] for r in fresh)
    differ = {k for f, r in zip(fresh, reused, strict=True) for k in f if f[k] != r[k]}
    assert differ == set(), f"fresh and reused evaluation rows differ in {sorted(differ)}"
    assert all(r["ok"] and r["request_seeds"] for r in first)
    differ = {k for f, r in zip(first, second, strict=True) for k in f if f[k] != r[k]}
    assert differ == set(), f"two sampled batches with the same seeds differ in {sorted(differ)}"

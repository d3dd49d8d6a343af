"""The RFT stage (`predict rft`) and the RL extension runs end to end against a scripted train-client endpoint (no
vLLM): real environment, real samples, real trainer updates. Task a's script solves it, task c's patch is wrong,
so RFT keeps exactly task a's rollouts; the RL extensions carry their test cost and decision mask into rollouts
and samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.config import load_config
from predict.data import MBPP_SCHEMA
from predict.env.runner import default_tokenizer_dir
from predict.outputs import write_rows
from predict.train.rl import RLJob, run_rl
from tests.scripted_endpoint import ScriptedEndpoint

from .conftest import REPO

pytest.importorskip("torch")

ADD = (
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'
)
WRONG = (
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x + y"}'
)
PASS_KEEP = "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>"
TEST = "CALL python_test {}"
FINAL = "FINAL: done"
SCRIPTS = {"[task:a]": [ADD, PASS_KEEP, FINAL], "[task:c]": [WRONG, PASS_KEEP, FINAL]}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory, mbpp_rows: list[dict]) -> Path:
    base = next(r for r in mbpp_rows if r["task_id"] == 127)
    rows = [{**base, "task_id": 9100 + i, "text": f"{base['text']} {m}"} for i, m in enumerate(SCRIPTS)]
    return write_rows(
        [{k: r[k] for k in MBPP_SCHEMA.names} for r in rows], MBPP_SCHEMA, tmp_path_factory.mktemp("d") / "rl.parquet"
    )


@pytest.fixture(scope="module")
def endpoint() -> Any:
    ep = ScriptedEndpoint(SCRIPTS, tokenizer_json=Path(default_tokenizer_dir()) / "tokenizer.json").start()
    yield ep
    ep.stop()


@pytest.fixture(autouse=True)
def _workdirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")


def study(**rl: Any) -> dict[str, Any]:
    config = load_config(REPO / "config" / "local.yaml")
    config["rl"] = {**config["rl"], "steps": 2, "group_size": 2, "tasks_per_step": 2, "checkpoint_every": 1, **rl}
    config["rft"] = {"group_size": 2, "tasks": None, "batch_rollouts": 2, "lr": None}
    config["env"] = {**config["env"], "concurrency": 4}
    return config


def test_rft_keeps_reward_1_rollouts_trains_rl_steps_and_writes_an_rl_runs_outputs(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path
) -> None:
    from predict.train.rft import run_rft

    job = RLJob(run="rft_B", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "rft_B" / "seed42",
                base_url=endpoint.base_url)
    summary = run_rft(job, study())
    assert summary["complete"] and (summary["n_sampled"], summary["n_kept"]) == (4, 2)
    rows = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert (r["n_sampled"], r["n_kept"], r["sample_pass_rate"], r["n_batch_rollouts"]) == (4, 2, 0.5, 2)
        assert r["updated"] and r["n_ce_tokens"] > 0 and r["ce_loss"] > 0
    sampled = pq.read_table(job.out_dir / ".work" / "rollouts.parquet").to_pylist()
    assert {r["arm"] for r in sampled} == {"B"} and all(r["tokens"] for r in sampled)
    for step in (1, 2):
        assert (job.out_dir / f"step{step}" / "model.safetensors").is_file()
    assert not (job.out_dir / ".work" / "state").exists()  # published: the resumable state is gone (rl.keep_state)
    assert not (job.out_dir / ".work" / "checkpoints").exists() and (job.out_dir / ".work" / "rollouts.parquet").exists()
    kept = RLJob(run="rft_B", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "kept", base_url=endpoint.base_url)
    run_rft(kept, study(keep_state=True))
    assert (kept.out_dir / ".work" / "state" / "trainer.json").exists() and (kept.out_dir / ".work" / "checkpoints").is_dir()
    n_requests = len(endpoint.requests)
    again = run_rft(job, study())  # a finished run asked for again (--forcerun): sampled and trained again
    assert again["complete"] and again["ran"] == 2 and len(endpoint.requests) > n_requests
    with pytest.raises(ValueError, match="trainer rft, not rl"):
        run_rl(job, study())
    with pytest.raises(ValueError, match="trainer rl, not rft"):
        run_rft(RLJob(run="B", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "x"), study())


def test_rl_extensions_carry_their_test_cost_and_decision_mask(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path
) -> None:
    rows = {}
    for run in ("B", "mask_decision", "expensive_tests_B"):
        job = RLJob(run=run, seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / run, base_url=endpoint.base_url)
        run_rl(job, study(steps=1))
        (rows[run],) = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
        records = pq.read_table(job.out_dir / ".work" / "rollouts" / "step1.parquet").to_pylist()
        want = (10, 3) if run == "expensive_tests_B" else (8, 1)  # budget scales by test_cost - 1
        assert {(r["budget"], r["test_cost"]) for r in records} == {want}, run
    # the DECISION value tokens (one per prediction point) leave RL credit, nothing else changes
    assert rows["mask_decision"]["n_rl_tokens"] < rows["B"]["n_rl_tokens"]
    assert rows["mask_decision"]["n_ce_tokens"] == rows["B"]["n_ce_tokens"]


def test_rft_resumes_mid_sampling_and_never_from_other_inputs(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path
) -> None:
    """A run killed while sampling samples only the rollouts it had not persisted (old code sampled them all
    again); one whose config changed samples and trains from scratch."""
    from predict.env.records import RECORD_SCHEMA
    from predict.fingerprint import run_fingerprint, start_or_resume
    from predict.outputs import ResumableParquet
    from predict.runs import resolve_run
    from predict.train.rft import run_rft

    first = RLJob(run="rft_A", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "first", base_url=endpoint.base_url)
    n_requests = len(endpoint.requests)
    run_rft(first, study())
    all_four = len(endpoint.requests) - n_requests
    sampled = pq.read_table(first.out_dir / ".work" / "rollouts.parquet").to_pylist()
    assert len(sampled) == 4

    # A killed run of the same job had persisted two of its four rollouts (marked, to tell them apart).
    job = RLJob(run="rft_A", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "rft_A" / "seed42",
                base_url=endpoint.base_url)
    config = study()
    work = job.out_dir / ".work"
    fp = run_fingerprint(config, "rft", spec=resolve_run(config, "rft_A"), init=tiny, tasks=tasks, seed=42)
    assert start_or_resume(work, fp, what="test") is False
    ResumableParquet(work / "rollouts.parquet", RECORD_SCHEMA, key=("task_id", "sample")).append(
        [{**r, "trace_id": "persisted"} for r in sampled[:2]]
    )
    n_requests = len(endpoint.requests)
    summary = run_rft(job, config, stop_after=1)
    assert summary["steps_done"] == 1
    rows = pq.read_table(work / "rollouts.parquet").to_pylist()
    assert len(rows) == 4 and [r["trace_id"] for r in rows[:2]] == ["persisted"] * 2
    assert "persisted" not in {r["trace_id"] for r in rows[2:]}
    assert 0 < len(endpoint.requests) - n_requests < all_four  # only the two missing rollouts were sampled

    # Killed after its first step, then rerun with another RFT lr: sampled and trained from scratch.
    config["rft"]["lr"] = 5e-4
    again = run_rft(job, config)
    assert again["ran"] == 2, "a changed config must not resume the old state"
    rows = pq.read_table(work / "rollouts.parquet").to_pylist()
    assert len(rows) == 4 and "persisted" not in {r["trace_id"] for r in rows}

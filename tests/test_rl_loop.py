"""The local RL loop (`predict rl`) against a scripted train-client endpoint: real environment, real samples, real
trainer updates, no vLLM (so no weight sync here; `test_rl_vllm.py` covers that). Arm B's scripted rollouts patch,
predict wrongly, get REVISEd and shadow-executed, so the step has label-masked RL samples and CE samples.

Resume is tested with a real SIGKILL of the `predict rl` process after its first saved state.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.config import load_config
from predict.data import MBPP_SCHEMA
from predict.env.runner import default_tokenizer_dir
from predict.outputs import write_rows
from predict.runs import checkpoint_steps, resolve_run, study_runs
from predict.train.rl import RLJob, run_rl, step_tasks
from predict.train.step_metrics import rollout_metrics
from tests.scripted_endpoint import ScriptedEndpoint

from .conftest import REPO

torch = pytest.importorskip("torch")

ADD = (
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'
)
AF_REVISE = "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>REVISE</DECISION>"
PASS_KEEP = "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>"
FINAL = "FINAL: done"
SCRIPTS = {
    "[task:a]": [ADD, AF_REVISE, ADD, PASS_KEEP, FINAL],  # shadow PASS on the REVISEd patch, then KEEP
    "[task:b]": [ADD, PASS_KEEP, FINAL],
}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory, mbpp_rows: list[dict]) -> Path:
    base = next(r for r in mbpp_rows if r["task_id"] == 127)
    rows = [{**base, "task_id": 9000 + i, "text": f"{base['text']} {m}"} for i, m in enumerate(SCRIPTS)]
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
    config["env"] = {**config["env"], "concurrency": 4}
    return config


def test_runs_and_ablations_resolve() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    assert study_runs(config)[:5] == ["A", "B", "alpha0", "forced_keep", "budget_neutral"]  # then the extensions
    a, b = resolve_run(config, "A"), resolve_run(config, "B")
    assert (a.protocol, a.alpha, b.protocol, b.alpha) == ("reactive", 0.0, "predictive", 1.0)
    assert resolve_run(config, "alpha0").alpha == 0.0 and resolve_run(config, "alpha0").arm == "B"
    assert resolve_run(config, "forced_keep").variant == "forced_keep"
    assert resolve_run(config, "budget_neutral").variant == "budget_neutral"
    assert checkpoint_steps(config["rl"]["steps"], config["rl"]["checkpoint_every"]) == [25, 50, 75, 100]
    assert checkpoint_steps(10, 4) == [4, 8, 10]


def test_step_tasks_are_seeded_and_cover_the_split() -> None:
    rows = [{"task_id": i} for i in range(5)]
    steps = [step_tasks(rows, 42, s, 2, 3) for s in (1, 2, 3)]
    assert [r["sample"] for r in steps[0]] == [0, 1, 2, 0, 1, 2]
    firsts = [r["task_id"] for s in steps for r in s if r["sample"] == 0]
    assert sorted(firsts[:5]) == list(range(5))  # one epoch visits every task once
    assert steps[0] == step_tasks(rows, 42, 1, 2, 3) and steps[0] != step_tasks(rows, 43, 1, 2, 3)


def test_arm_b_step_masks_labels_adds_ce_and_updates(tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path) -> None:
    job = RLJob(run="B", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "B" / "seed42", base_url=endpoint.base_url)
    summary = run_rl(job, study(steps=1))
    assert summary["complete"] and summary["steps_done"] == 1
    (row,) = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
    assert row["n_rollouts"] == 4 and row["n_failed"] == 0 and row["reward_mean"] == 1.0
    # task a: 2 prediction points (one REVISEd, shadow PASS), task b: 1; two rollouts each
    assert row["prediction_points"] == 6 and row["masked_labels"] == 6 and row["n_ce_samples"] == 6
    assert row["updated"] and row["n_ce_tokens"] > 0 and row["ce_loss"] > 0
    # every rollout passed: advantage 0, so the RL term pushes nothing; the CE term is the whole gradient
    assert (row["rl_grad_norm"], row["rl_ce_grad_cosine"]) == (0.0, None)
    assert row["ce_grad_norm"] == pytest.approx(row["grad_norm"], rel=1e-5) and row["ce_grad_norm"] > 0
    assert (row["n_patches"], row["n_predictions"], row["n_revise"]) == (6, 6, 2)
    assert (row["pred_ASSERTION_FAILURE"], row["pred_PASS"], row["verified_PASS"]) == (2, 4, 6)
    assert row["revise_rate"] == pytest.approx(2 / 6) and row["prediction_accuracy"] == pytest.approx(4 / 6)
    assert (job.out_dir / "step1" / "model.safetensors").is_file()
    assert (job.out_dir / "step1" / "tokenizer.json").is_file()


def test_arm_a_and_alpha0_have_no_ce(tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path) -> None:
    for run in ("A", "alpha0"):
        job = RLJob(run=run, seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / run, base_url=endpoint.base_url)
        run_rl(job, study(steps=1))
        (row,) = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
        assert row["n_ce_samples"] == 0 and row["n_ce_tokens"] == 0 and row["ce_loss"] == 0.0, run
        assert row["ce_grad_norm"] == 0.0 and row["rl_grad_norm"] == row["grad_norm"], run
    assert row["masked_labels"] == 6  # alpha0 still takes the sampled labels out of RL credit


def test_resumes_after_sigkill_never_from_step_zero(tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path) -> None:
    out = tmp_path / "results" / "rl" / "B" / "seed43"
    config = study(steps=3)
    config["results_dir"] = str(tmp_path / "results")  # the CLI's TensorBoard root: results/tensorboard
    has_tensorboard = importlib.util.find_spec("tensorboard") is not None  # the `track` extra
    config["tracking"] = {**config["tracking"], "tensorboard": has_tensorboard}
    cmd = [
        sys.executable, "-m", "predict.cli", "rl", "--config-json", json.dumps(config), "--run", "B", "--seed", "43",
        "--init", str(tiny), "--tasks-file", str(tasks), "--out-dir", str(out), "--base-url", endpoint.base_url,
    ]
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    state = out / ".work" / "state" / "trainer.json"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.exists(), "no state saved after step 1"
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.time()
    finally:
        proc.wait()
    first = json.loads(state.read_text())["extra"]["rl_step"]
    assert first >= 1 and not (out / "metrics.parquet").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pq.read_table(out / "metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["finished_at"] < killed_at for r in rows[:first])  # kept from the killed process
    assert all(r["finished_at"] > killed_at for r in rows[first:])  # only the rest was run again
    assert f"resuming B seed 43 from step {first}" in " ".join(done.stderr.split())
    assert all((out / f"step{n}" / "model.safetensors").is_file() for n in (1, 2, 3))
    if has_tensorboard:  # the live curves: each step once, the killed ones kept
        from tests.test_tracking import read_scalars

        curves = read_scalars(tmp_path / "results" / "tensorboard" / "rl" / "B" / "seed43")
        assert [s for s, _ in curves["rollout/reward_mean"]] == [1, 2, 3]
        assert [v for _, v in curves["rollout/reward_mean"]] == pytest.approx([r["reward_mean"] for r in rows])


def test_rollout_metrics_without_predictions() -> None:
    recs = [{"ok": True, "reward": 1.0, "final_pass": True, "budget_exhausted": False, "steps": []}]
    m = rollout_metrics(recs + [{"ok": False, "reward": None}])
    assert (m["n_rollouts"], m["n_failed"], m["pass_rate"], m["revise_rate"]) == (2, 1, 1.0, None)


def test_state_from_another_lr_or_sft_checkpoint_is_not_resumed(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path
) -> None:
    """Issue 15's stale resume: after a finished run, a new `rl.lr` (or a new SFT checkpoint at the same path) must
    train again from step 0; old code reported `resumed_from 2, ran 0` and republished the old run. A killed run
    rerun unchanged still resumes, and a finished one asked for again (--forcerun) trains again."""
    import shutil

    init = tmp_path / "checkpoints" / "B" / "sft"
    shutil.copytree(tiny, init)
    job = RLJob(run="B", seed=42, init=init, tasks=tasks, out_dir=tmp_path / "B" / "seed42", base_url=endpoint.base_url)
    first = run_rl(job, study(steps=2, lr=1e-4))
    assert (first["resumed_from"], first["ran"]) == (0, 2)

    again = run_rl(job, study(steps=2, lr=5e-4))
    assert (again["resumed_from"], again["ran"]) == (0, 2), "a new lr must not resume the old run"
    assert [r["lr"] for r in pq.read_table(job.out_dir / "metrics.parquet").to_pylist()] == [5e-4, 5e-4]

    killed = run_rl(job, study(steps=2, lr=5e-4), stop_after=1)
    assert killed["steps_done"] == 1
    (init / "generation_config.json").write_text('{"retrained": true}')  # the SFT job reran: a new checkpoint
    fresh = run_rl(job, study(steps=2, lr=5e-4))
    assert (fresh["resumed_from"], fresh["ran"]) == (0, 2), "a new SFT checkpoint must not resume the old state"

    run_rl(job, study(steps=2, lr=5e-4), stop_after=1)
    resumed = run_rl(job, study(steps=2, lr=5e-4))
    assert (resumed["resumed_from"], resumed["ran"]) == (1, 1), "a killed run with unchanged inputs resumes"
    forced = run_rl(job, study(steps=2, lr=5e-4))
    assert (forced["resumed_from"], forced["ran"]) == (0, 2), "a finished run asked for again trains again"


class Killed(BaseException):
    """Stands in for a SIGKILL: nothing in the run catches it."""


def weights_digest(tensors: dict[str, Any]) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class RecordingServer:
    """A running server as `run_rl(server=...)` takes one: rollouts go to the scripted endpoint; each weight update
    (folder reload or in-memory handoff) is read as the worker extension reads it and recorded by its digest.
    `kill_after`: the handoff version after which the 'process' dies (the handoff has landed, the step not ended).
    `drained`: whether each update was asked to pause the engine (drain) around it."""

    def __init__(self, base_url: str, kill_after: str | None = None) -> None:
        self.base_url, self.kill_after, self.updates, self.served = base_url, kill_after, [], None
        self.drained: list[bool] = []

    def reload_weights(self, weights_dir: Path, *, version: str | None = None, drain: bool = True) -> list[str]:
        from safetensors.torch import load_file

        self.drained.append(drain)

        self.served = Path(weights_dir)
        state = {k: v for f in sorted(self.served.glob("*.safetensors")) for k, v in load_file(f).items()}
        self.updates.append(("folder", version, weights_digest(state)))
        return []

    def push_weights(self, manifest: dict[str, Any], *, version: str | None = None, drain: bool = True) -> list[str]:
        from predict.serving.worker_ext import (
            check_manifest,
            checkpoint_shapes,
            close_mappings,
            open_buffers,
            tensor_views,
        )

        self.drained.append(drain)

        check_manifest(manifest, checkpoint_shapes(self.served))
        buffers, keep = open_buffers(torch, manifest)
        self.updates.append(("memory", version, weights_digest(dict(tensor_views(torch, manifest, buffers)))))
        del buffers
        close_mappings(keep)
        if version == self.kill_after:
            raise Killed(f"killed after handoff {version}")
        return []


def test_a_kill_after_an_in_memory_handoff_resumes_from_the_saved_state(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path
) -> None:
    """The local backend with weight_sync memory: killed after step 2's handoff reached the server and before its
    state was saved; the resumed run serves the last saved state (step 1's weights), not the lost update's."""
    config = study(steps=2, tasks_per_step=1, weight_sync="memory")
    job = RLJob(run="B", seed=44, init=tiny, tasks=tasks, out_dir=tmp_path / "B" / "seed44")
    first = RecordingServer(endpoint.base_url, kill_after="2")
    with pytest.raises(Killed):
        run_rl(job, config, server=first)
    assert [(how, v) for how, v, _ in first.updates] == [("folder", "0"), ("memory", "1"), ("memory", "2")]
    step1, lost = first.updates[1][2], first.updates[2][2]
    assert len({first.updates[0][2], step1, lost}) == 3  # each update changed the weights

    again = RecordingServer(endpoint.base_url)
    summary = run_rl(job, config, server=again)
    assert summary["complete"] and summary["resumed_from"] == 1
    assert again.updates[0] == ("folder", "0", step1)  # the server is reloaded from the saved state of step 1
    assert [(how, v) for how, v, _ in again.updates[1:]] == [("memory", "2")]
    rows = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2] and all(r["sync_s"] > 0 for r in rows)
    assert all((job.out_dir / f"step{n}" / "model.safetensors").is_file() for n in (1, 2))  # checkpoint_every 1


class SleepingServer(RecordingServer):
    """A GPU server in sleep mode (`VLLMServer.sleep` / `wake_up`): its sleeps and wake-ups are recorded among the
    weight updates, in the order they happen."""

    sleep_mode = True

    def sleep(self, level: int = 2) -> bool:
        self.updates.append(("sleep", str(level), None))
        return True

    def wake_up(self, tags: tuple[str, ...] | None = None) -> bool:
        self.updates.append(("wake_up", " ".join(tags) if tags else None, None))
        return True


def test_on_a_gpu_server_each_update_runs_asleep_and_the_weights_arrive_before_its_kv_cache_wakes(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path
) -> None:
    """Issue 37: the colocated server gives its memory back for the update (level 2 sleep: weights and KV cache go),
    its weights wake and take the new ones with no pause (the engine schedules nothing while its KV cache sleeps),
    then its KV cache wakes; the step's metrics say what the sleep and wake-ups cost."""
    config = study(steps=2, tasks_per_step=1, weight_sync="memory")
    job = RLJob(run="B", seed=45, init=tiny, tasks=tasks, out_dir=tmp_path / "B" / "seed45")
    server = SleepingServer(endpoint.base_url)
    assert run_rl(job, config, server=server)["complete"]
    assert [(what, v) for what, v, _ in server.updates] == [
        ("folder", "0"),
        ("sleep", "2"), ("wake_up", "weights"), ("memory", "1"), ("wake_up", "kv_cache"),
        ("sleep", "2"), ("wake_up", "weights"), ("memory", "2"), ("wake_up", "kv_cache"),
    ]
    assert server.drained == [True, False, False]  # the start's folder load drains; the asleep syncs need not
    rows = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
    assert all(r["sleep_s"] is not None and r["sleep_s"] >= 0 and r["update_s"] > 0 for r in rows)

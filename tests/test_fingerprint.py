"""Resumable state proves where it came from (`predict.fingerprint`): what a fingerprint sees, how a folder is resumed
or started fresh, the prime-rl output folder, and results/ refusing another run_name. The stages' own stale-resume
tests live beside each stage (test_train_sft, test_rl_loop, test_rft, test_rollouts, test_evaluate)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from predict.config import load_config
from predict.fingerprint import (
    FINGERPRINT_FILE,
    RUN_NAME_FILE,
    fingerprint,
    input_identity,
    mark_finished,
    start_or_resume,
    state_matches,
)

from .conftest import REPO


@pytest.fixture(autouse=True)
def _hash_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREDICT_HASH_CACHE", str(tmp_path / "hash-cache"))


def test_identity_follows_content_not_path(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights v1")
    (ckpt / "config.json").write_text("{}")
    (ckpt / ".model.safetensors.tmp").write_text("half a write")  # hidden temporaries are not content
    first = input_identity(ckpt)
    assert first.startswith("folder:") and input_identity(ckpt) == first  # (the second read is the cache's)
    moved = tmp_path / "moved"
    shutil.copytree(ckpt, moved)
    assert input_identity(moved) == first
    (moved / "model.safetensors").write_bytes(b"weights v2")  # retrained, same size, same path
    assert input_identity(moved) != first
    assert input_identity("Qwen/Qwen3-4B-Base") == "id:Qwen/Qwen3-4B-Base"
    (tmp_path / "rl.parquet").write_bytes(b"tasks")
    assert input_identity(tmp_path / "rl.parquet").startswith("file:")


def test_differences_name_the_key_the_input_and_the_seed(tmp_path: Path) -> None:
    config = load_config(REPO / "config" / "local.yaml")
    (tmp_path / "init").write_text("a")
    old = fingerprint(config, ["rl", "model.enable_thinking", "nope.missing"], inputs={"init": tmp_path / "init"},
                      seed=42, extra={"run": {"alpha": 1.0}})
    config["rl"]["lr"] = 5e-4
    config["power"]["target"] = 0.9  # outside the slice: not seen
    (tmp_path / "init").write_text("b")
    new = fingerprint(config, ["rl", "model.enable_thinking", "nope.missing"], inputs={"init": tmp_path / "init"},
                      seed=43, extra={"run": {"alpha": 0.0}})
    diffs = new.differences(old)
    assert diffs[0].startswith("config rl.lr ") and diffs[0].endswith("-> 0.0005")
    assert diffs[1:] == ["input init", "seed 42 -> 43", "run.alpha 1.0 -> 0.0"]
    assert new.config["nope.missing"] == "<absent>"


def test_a_folder_resumes_only_under_its_own_fingerprint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(REPO / "config" / "local.yaml")
    work = tmp_path / ".work"
    fp = fingerprint(config, ["rl"], seed=1)
    assert start_or_resume(work, fp, what="run") is False  # nothing there: fresh, fingerprint stored first
    assert (work / FINGERPRINT_FILE).is_file() and state_matches(work, fp)
    (work / "state").mkdir()
    (work / "state" / "trainer.json").write_text("{}")
    assert start_or_resume(work, fp, what="run") is True and (work / "state").exists()

    config["rl"]["lr"] = 1.0
    changed = fingerprint(config, ["rl"], seed=1)
    with caplog.at_level(logging.WARNING, logger="predict.fingerprint"):
        assert start_or_resume(work, changed, what="RL B seed 1") is False
    (line,) = [r.getMessage() for r in caplog.records]
    assert "RL B seed 1" in line and "config rl.lr" in line and "-> 1.0" in line and "starting fresh" in line
    assert [p.name for p in work.iterdir()] == [FINGERPRINT_FILE] and state_matches(work, changed)

    (work / "state").mkdir()
    mark_finished(work)  # published: asked for again, it is redone
    assert not state_matches(work, changed)
    assert start_or_resume(work, changed, what="run") is False and not (work / "state").exists()

    (work / "state").mkdir()
    (work / FINGERPRINT_FILE).unlink()  # state from before fingerprints: never resumed
    assert start_or_resume(work, changed, what="run") is False and not (work / "state").exists()


def test_prime_rl_output_dir_is_kept_only_for_the_same_toml_and_inputs(tmp_path: Path) -> None:
    from predict.train.prime_rl import configs
    from predict.train.prime_rl.cluster import launch

    paper = load_config(REPO / "config" / "config.yaml")
    model, tasks, out = tmp_path / "checkpoints" / "B" / "sft", tmp_path / "rl.parquet", tmp_path / "prime-rl"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"sft v1")
    tasks.write_bytes(b"tasks")

    def render(cfg: dict) -> Path:
        table = configs.rl_config(cfg, "B", 42, model=model, tasks=tasks, output_dir=out)
        return configs.write_toml(table, tmp_path / "B.toml")

    stale = out / "weights" / "step_100"  # an older run's finished step, from before fingerprints
    stale.mkdir(parents=True)
    (stale / "STABLE").touch()
    launch("rl", render(paper), tmp_path, uv="true")  # `true run ...` stands in for prime-rl
    assert not stale.exists(), "a run must never collect an older run's steps"
    mine = out / "weights" / "step_25"
    mine.mkdir(parents=True)
    launch("rl", render(paper), tmp_path, uv="true")  # a retry of the same run keeps its output_dir
    assert mine.exists()
    (model / "model.safetensors").write_bytes(b"sft v2")  # a new SFT checkpoint at the same path
    launch("rl", render(paper), tmp_path, uv="true")
    assert not mine.exists()
    mine.mkdir(parents=True)
    paper["rl"]["lr"] = 1e-5
    launch("rl", render(paper), tmp_path, uv="true")
    assert not mine.exists()


def _power(config: dict, out: Path) -> int:
    from predict.cli import main

    return main(["power", "--config-json", json.dumps(config), "--out", str(out)])


def test_results_dir_refuses_another_run_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = load_config(REPO / "config" / "local.yaml")
    config["results_dir"] = str(tmp_path / "results")
    config["power"] = {**config.get("power", {}), "deltas": [0.05], "discordance": [0.2], "tasks": [50]}
    assert _power(config, tmp_path / "results" / "power" / "power.parquet") == 0
    assert json.loads((tmp_path / "results" / RUN_NAME_FILE).read_text()) == {"run_name": "local"}

    paper = {**config, "run_name": "paper"}
    capsys.readouterr()
    assert _power(paper, tmp_path / "results" / "power" / "power.parquet") == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "'local'" in message and "'paper'" in message and "results_dir" in message
    # the same run_name is welcome, and a stage writing outside results_dir claims nothing
    assert _power(config, tmp_path / "results" / "power" / "again.parquet") == 0
    assert _power(paper, tmp_path / "scratch" / "power.parquet") == 0
    # the fix the message names: its own results_dir
    assert _power({**paper, "results_dir": str(tmp_path / "paper")}, tmp_path / "paper" / "power.parquet") == 0


def test_the_workflow_refuses_another_runs_results_dir_before_any_job(tmp_path: Path) -> None:
    """Stages under Snakemake get slices without run_name, so the workflow's onstart claims results_dir: a run of
    another config stops before its first job; a dry-run never claims."""
    import os
    import subprocess
    import sys

    results = tmp_path / "results"
    snakemake = [sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/local", "--config",
                 f"results_dir={results}", "run_name=other", "--", str(results / "data" / "manifest.json")]
    dry_run = [*snakemake[:5], "-n", *snakemake[5:]]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    dry = subprocess.run(dry_run, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and not (results / RUN_NAME_FILE).exists(), dry.stderr[-2000:]
    (results / RUN_NAME_FILE).write_text('{"run_name": "local"}\n')
    run = subprocess.run(snakemake, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    message = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0 and "run_name 'local', not 'other'" in message and "results_dir" in message
    assert not (results / "data").exists()


def test_resume_keys_are_within_each_stages_slice() -> None:
    """What a fingerprint records is read from the stage's slice (predict.stages), so it must be part of it."""
    from predict.fingerprint import RESUME_KEYS
    from predict.stages import STAGES

    def covered(key: str, reads: tuple[str, ...]) -> bool:
        return any(key == r or key.startswith(r + ".") for r in reads)

    for stage, keys in RESUME_KEYS.items():
        users = ["rollout", "evaluate"] if stage == "rollout" else [stage]
        for user in users:
            missing = [k for k in keys if not covered(k, STAGES[user].reads)]
            assert not missing, f"{user}: {missing} outside its slice"

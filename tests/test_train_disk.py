"""A run that cannot fit its disk stops before it starts, naming the bytes it needs and where (predict.train.disk):
the workflow before its first job, and each SFT and RL job as it starts."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path

import pytest
import yaml

from predict.cli import merge_config_files
from predict.config import load_config
from predict.stages import workflow_config
from predict.tiny_model import SHAPES

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
Usage = namedtuple("Usage", "total used free")


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    import predict.train.disk as disk

    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(free, 0, free))


def _design_on_one_node(tmp_path: Path) -> dict:
    """config/config.yaml + config/gpu.yaml with their base model a local Qwen3-4B-Base folder (its config.json)."""
    base = tmp_path / "Qwen3-4B-Base"
    base.mkdir()
    hf = {**SHAPES["qwen3-4b"], "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    (base / "config.json").write_text(json.dumps(hf))
    config = merge_config_files(REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml")
    config["model"] = {**config["model"], "base": str(base)}
    path = tmp_path / "one-node.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_config(path)


def test_the_one_node_design_is_refused_on_a_64_gib_disk_naming_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30 RL and RFT runs x 4 checkpoints of 8 GB, 6 SFT checkpoints and, while a run trains, its 32 GB state twice
    (it is replaced every 5 steps) and no served copy (a fresh run serves its SFT folder): 1.08 TB, refused on 64 GiB
    before any job."""
    from predict.train.disk import DiskSpaceError, check_workflow_disk, plan_bytes, workflow_needs

    config = workflow_config(_design_on_one_node(tmp_path))
    results = tmp_path / "results"
    needs = workflow_needs(config, results)
    by_what = {n.what: n for n in needs}
    one = 4_022_468_096 * 2
    assert by_what["RL A seed 42: 4 HF checkpoint(s) (step25, step50, step75, step100)"].bytes == 4 * one
    assert by_what["RL A seed 42: the resumable state (old and new while replaced)"].bytes == 2 * 4 * one
    assert by_what["SFT A: 1 HF checkpoint(s) (sft)"].bytes == one
    from predict.runs import sft_runs, study_runs

    runs, sfts = len(study_runs(config)) * len(config.seeds), len(sft_runs(config))
    assert (runs, sfts) == (30, 6)  # arms, ablations and extensions (RL and RFT), two seeds; arms and own-SFT runs
    assert plan_bytes(needs) == runs * 4 * one + sfts * one + 2 * 4 * one  # kept + the largest job's state
    _free(monkeypatch, 64 * GIB)
    with pytest.raises(DiskSpaceError) as refused:
        check_workflow_disk(config, results)
    message = str(refused.value)
    assert f"needs {plan_bytes(needs) / 1e9:.1f} GB" in message and "68.7 GB free" in message
    assert "RL B seed 43: 4 HF checkpoint(s)" in message and str(results / "rl" / "B" / "seed43") in message
    assert "the resumable state (old and new while replaced) (while it trains)" in message


def test_the_rehearsal_fits_a_64_gib_disk_and_what_is_done_is_not_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from predict.train.disk import check_workflow_disk, plan_bytes, workflow_needs

    config = workflow_config(load_config(REPO / "config" / "gpu-rehearsal.yaml"))
    results = tmp_path / "results"
    one = 4_022_468_096 * 2
    # base, 2 SFT, 2 RL checkpoints kept; the RL state's optimizer part while it trains (its weights are the step's
    # checkpoint's, linked)
    assert plan_bytes(workflow_needs(config, results)) == 5 * one + 3 * one
    _free(monkeypatch, 64 * GIB)
    check_workflow_disk(config, results)
    (results / "checkpoints" / "A" / "sft").mkdir(parents=True)
    (results / "checkpoints" / "A" / "sft" / "config.json").write_text("{}")
    assert plan_bytes(workflow_needs(config, results)) == 4 * one + 3 * one


def test_an_rl_job_that_cannot_fit_its_disk_stops_before_its_first_step(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model (19.6M parameters, float32 on the CPU): 2 checkpoints of 39 MB and a state of 235 MB saved
    twice; with 100 MB free the job stops at its start, naming each with its folder."""
    from predict.train.disk import DiskSpaceError
    from predict.train.driver import RLJob, TrainingRun

    config = load_config(REPO / "config" / "local.yaml")
    config["rl"] = {**config["rl"], "steps": 2, "checkpoint_every": 1, "state_every": 1}
    out = tmp_path / "rl" / "A" / "seed42"
    run = TrainingRun(RLJob(run="A", seed=42, init=tiny, tasks=tmp_path / "rl.parquet", out_dir=out), config, "rl")
    _free(monkeypatch, 100 * 10**6)
    with pytest.raises(DiskSpaceError) as refused:
        run.start()
    message = str(refused.value)
    assert "RL A seed 42: 2 HF checkpoint(s) (step1, step2)" in message and str(out) in message
    assert "RL A seed 42: the resumable state (old and new while replaced)" in message
    assert ": the served copy" not in message  # a fresh run serves its SFT folder
    _free(monkeypatch, 10**12)
    assert run.start() is False  # enough disk: it starts (fresh)


def test_an_sft_job_that_cannot_fit_its_disk_stops_before_its_first_step(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from predict.train.disk import DiskSpaceError
    from predict.train.sft import SFTConfig, run_sft
    from tests.test_train_sft import _write_traces

    traces = tmp_path / "A.parquet"
    _write_traces(traces, 6)
    cfg = SFTConfig(lr=3e-3, epochs=2, batch_tokens=1500, save_every=2, device="cpu", micro_batch_tokens=1500)
    _free(monkeypatch, 10**6)
    with pytest.raises(DiskSpaceError, match="SFT arm A needs") as refused:
        run_sft(traces=traces, base_model=tiny, out_dir=tmp_path / "ckpt", metrics_out=tmp_path / "m.parquet",
                state_dir=tmp_path / "state", cfg=cfg, arm="A", enable_thinking=True, progress=False)
    assert "SFT A: 1 HF checkpoint(s) (ckpt)" in str(refused.value) and "the resumable state" in str(refused.value)
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "state" / "trainer").exists()

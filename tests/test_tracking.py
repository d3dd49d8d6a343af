"""Live training curves (`predict.train.tracking`): a short local RL run against the scripted endpoint of
test_rl_loop, read back with TensorBoard's own reader (reward, loss terms, class counts at their steps; a killed and
resumed run has each step once); W&B offline read back from its own run file; SFT's curves; prime-rl's W&B monitor
settings checked against prime-rl's config classes at the pin; a TensorBoard screenshot where Chromium is installed.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.config import load_config
from predict.config.models import WandbSettings
from predict.train.rl import RLJob, run_rl
from predict.train.tracking import RunTracker, TrackingError, TrackingTargets, column_tag, scalar_tags
from tests.test_rl_loop import _workdirs, endpoint, study, tasks  # noqa: F401  (fixtures)

from .chromium import CHROMIUM
from .chromium import screenshot as chromium_screenshot
from .conftest import REPO

pytest.importorskip("torch")
pytest.importorskip("tensorboard")



def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of one TensorBoard run folder as [(step, value)], through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_columns_group_into_tags() -> None:
    assert column_tag("reward_mean") == "rollout/reward_mean" and column_tag("rl_loss") == "loss/rl_loss"
    assert column_tag("pred_PASS") == "pred_class/PASS" and column_tag("verified_SYNTAX_ERROR") == "verified_class/SYNTAX_ERROR"
    assert column_tag("update_s") == "time/update_s" and column_tag("lr") == "train/lr"
    tags = scalar_tags({"run": "B", "seed": 1, "step": 3, "backend": "rl", "updated": True, "loss": None, "lr": 1e-4})
    assert tags == {"train/updated": 1.0, "train/lr": 1e-4}  # identity columns and unmeasured ones are no curves


@pytest.fixture(scope="module")
def killed_and_resumed(tiny: Path, tasks: Path, endpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """Arm B, 4 steps, state every 2: killed after step 3 (state at 2); resumed, steps 3 and 4 run again and it dies
    the moment step 4's state is saved; resumed again, nothing is left to run."""
    from predict.train.trainer import Trainer

    root = tmp_path_factory.mktemp("results")
    settings = TrackingTargets(root / "tensorboard")
    job = RLJob(run="B", seed=42, init=tiny, tasks=tasks, out_dir=root / "rl" / "B" / "seed42",
                base_url=endpoint.base_url, tracking=settings)
    config = study(steps=4, state_every=2, checkpoint_every=4)
    killed = run_rl(job, config, stop_after=3)
    assert not killed["complete"] and killed["steps_done"] == 3
    first_attempt = read_scalars(root / "tensorboard" / "rl" / "B" / "seed42")

    class Killed(Exception):
        pass

    real_write = Trainer._write

    def write_then_die(self: Any, snap: Any, checkpoint: Any, state: Any, tag: Any = None) -> Any:
        took = real_write(self, snap, checkpoint, state, tag)
        if state is not None and snap.info["extra"].get("rl_step") == 4:
            raise Killed  # the state's folder is whole; nothing after it happened (written in the background, the
            # writer's error reaches the run at its next wait)
        return took

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "_write", write_then_die)
        with pytest.raises(Killed):
            run_rl(job, config)
    done = run_rl(job, config)
    assert done["complete"] and done["resumed_from"] == 4 and done["ran"] == 0
    return {"root": root, "job": job, "first": first_attempt}


def test_event_files_hold_the_curves_at_their_steps_once(killed_and_resumed: dict) -> None:
    job, root = killed_and_resumed["job"], killed_and_resumed["root"]
    # the first attempt was readable while it ran (flushed at each step's end)
    assert [s for s, _ in killed_and_resumed["first"]["rollout/reward_mean"]] == [1, 2, 3]
    scalars = read_scalars(root / "tensorboard" / "rl" / "B" / "seed42")
    rows = {r["step"]: r for r in pq.read_table(job.out_dir / "metrics.parquet").to_pylist()}
    for column in ("reward_mean", "loss", "rl_loss", "ce_loss", "grad_norm", "pred_PASS", "pred_ASSERTION_FAILURE",
                   "verified_PASS", "n_revise"):
        points = scalars[column_tag(column)]
        # step 3 of the first attempt purged; step 4, whose state was saved as the second attempt died, is there
        assert [s for s, _ in points] == [1, 2, 3, 4], (column, points)
        assert [v for _, v in points] == pytest.approx([float(rows[s][column]) for s in (1, 2, 3, 4)]), column
    assert scalars["pred_class/PASS"][0][1] == 4 and scalars["pred_class/ASSERTION_FAILURE"][0][1] == 2


def test_tensorboard_serves_the_study_and_renders_in_headless_chromium(killed_and_resumed: dict, tmp_path: Path) -> None:
    """`tensorboard --logdir <root>` (the README's command) lists the run; the screenshot where Chromium is installed."""
    root = killed_and_resumed["root"] / "tensorboard"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--port", str(port),
                           "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                runs = json.loads(urllib.request.urlopen(f"{url}/data/runs", timeout=2).read())
                if runs:
                    break
            except OSError:
                time.sleep(0.5)
        assert "rl/B/seed42" in runs
        tags = json.loads(urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=10).read())
        assert {"rollout/reward_mean", "loss/rl_loss", "pred_class/PASS"} <= set(tags["rl/B/seed42"])
        if CHROMIUM is None:
            pytest.skip("chromium is not installed (apt-get install -y chromium): no screenshot")
        shot = tmp_path / "tensorboard.png"
        chromium_screenshot(f"{url}/#timeseries", shot, "--window-size=1400,1000", "--virtual-time-budget=15000")
        assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
        if os.environ.get("PREDICT_SCREENSHOT_DIR"):
            shutil.copy(shot, Path(os.environ["PREDICT_SCREENSHOT_DIR"]) / shot.name)
    finally:
        tb.terminate()
        tb.wait(timeout=30)


def wandb_records(run_dir: Path) -> list[Any]:
    """The records of a W&B run file (``run-<id>.wandb``: a leveldb-style log of wandb's own protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data, pos, block, buf, out = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def test_wandb_offline_run_from_the_cli_holds_the_rows(tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("wandb")
    from predict.cli import main

    config = study(steps=2)
    config["results_dir"] = str(tmp_path / "results")
    config["tracking"] = {"tensorboard": True, "wandb": {"mode": "offline", "project": "predict-test", "entity": None}}
    out_dir = tmp_path / "results" / "rl" / "B" / "seed42"
    assert main(["rl", "--config-json", json.dumps(config), "--run", "B", "--seed", "42", "--init", str(tiny),
                 "--tasks-file", str(tasks), "--out-dir", str(out_dir), "--base-url", endpoint.base_url]) == 0
    rows = pq.read_table(out_dir / "metrics.parquet").to_pylist()
    (run_dir,) = (tmp_path / "results" / "wandb" / "wandb").glob("offline-run-*")
    records = wandb_records(run_dir)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_group, run.display_name, run.project) == ("local", "rl/B/seed42", "predict-test")
    assert run.run_id.startswith("local-rl-B-seed42-")  # kept beside the run's state for a resume
    assert (out_dir / ".work" / "wandb-id").read_text().strip() == run.run_id
    run_config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert run_config["rl"]["steps"] == 2 and "arms" in run_config  # the stage's slice
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [1, 2]
    for h, row in zip(history, rows, strict=True):
        assert h == {**h, **{k: pytest.approx(v) for k, v in scalar_tags(row).items()}}
    # the embedded default's TensorBoard run of the same job
    assert [s for s, _ in read_scalars(tmp_path / "results" / "tensorboard" / "rl" / "B" / "seed42")
            ["rollout/reward_mean"]] == [1, 2]


def test_a_tracker_that_cannot_start_stops_the_run_before_training(
    tiny: Path, tasks: Path, endpoint: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # the package is not installed
    settings = TrackingTargets(tmp_path / "tb", wandb=WandbSettings(mode="offline"), wandb_dir=tmp_path / "wandb")
    job = RLJob(run="A", seed=1, init=tiny, tasks=tasks, out_dir=tmp_path / "A", base_url=endpoint.base_url,
                tracking=settings)
    with pytest.raises(TrackingError, match=r"^tracking\.wandb\.mode: offline but the wandb package is missing"):
        run_rl(job, study(steps=1))
    assert not (job.out_dir / ".work" / "metrics.parquet").exists() and not (job.out_dir / ".work" / "rollouts").exists()
    with pytest.raises(TrackingError, match="tracking.wandb.mode"):
        TrackingTargets.from_config({"results_dir": "r", "run_name": "x", "tracking": {"wandb": {"mode": "sometimes"}}})


def test_online_wandb_without_credentials_is_one_line_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no saved login
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    settings = TrackingTargets(tmp_path / "tb", wandb=WandbSettings(mode="online"), wandb_dir=tmp_path / "wandb",
                               group="study")
    with pytest.raises(TrackingError) as err:
        RunTracker(settings, stage="rl", run="A", seed=1).start(0)
    assert str(err.value).startswith("tracking.wandb (mode online") and "\n" not in str(err.value)
    assert not (tmp_path / "tb").exists()  # stopped before anything was written


def test_a_resumed_job_continues_its_wandb_run_and_a_fresh_start_gets_its_own(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    settings = TrackingTargets(None, wandb=WandbSettings(mode="offline"), wandb_dir=tmp_path / "wandb", group="study")

    def run_id(done: int) -> str:
        before = set((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
        with RunTracker(settings, stage="rl", run="B", seed=1, id_file=tmp_path / "state" / "wandb-id").start(done):
            pass
        # Every start writes a folder of its own (a resumed one too: same id, new time). wandb's service writes the
        # records after finish() returns, so wait (bounded) for the run record rather than read an empty file.
        after = set((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
        run_dir = max(after - before or after, key=lambda p: p.name)  # the name starts with the start time

        def runs() -> list[Any]:
            try:
                return [r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run"]
            except Exception:  # no run file yet, or a record still being written: read again
                return []

        deadline = time.monotonic() + 60
        while not runs() and time.monotonic() < deadline:
            time.sleep(0.2)
        (run,) = runs()
        return run.run_id

    first = run_id(0)
    assert first.startswith("study-rl-B-seed1-") and run_id(3) == first  # resumed: the same W&B run
    assert run_id(0) != first  # started afresh: a run of its own


def test_the_default_configs_track_with_tensorboard_only() -> None:
    """Every training stage's slice (what its job gets) carries the tracking settings: TensorBoard on, W&B off."""
    from predict.stages import stage_settings

    for name in ("local.yaml", "config.yaml"):
        config = load_config(REPO / "config" / name)
        for stage in ("sft", "rl", "rft", "signal", "prime-rl-config"):
            s = TrackingTargets.from_config(stage_settings(stage, config))
            assert s.tensorboard_root == Path(config["results_dir"]) / "tensorboard", (name, stage)
            assert s.wandb.mode == "disabled" and s.group == config["run_name"], (name, stage)


def test_sft_writes_its_curve_under_sft_arm(tiny: Path, tmp_path: Path) -> None:
    from predict.train.sft import SFTConfig, run_sft
    from tests.test_train_sft import _write_traces

    traces = tmp_path / "A.parquet"
    _write_traces(traces, 2)
    cfg = SFTConfig(lr=3e-3, epochs=1, batch_tokens=600, save_every=0, device="cpu", micro_batch_tokens=1500)
    run_sft(traces=traces, base_model=tiny, out_dir=tmp_path / "ckpt",
            metrics_out=tmp_path / "m.parquet", state_dir=tmp_path / "state", cfg=cfg, arm="A", progress=False,
            tracking=TrackingTargets(tmp_path / "tb"), enable_thinking=True)
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    scalars = read_scalars(tmp_path / "tb" / "sft" / "A")
    assert [s for s, _ in scalars["loss/loss"]] == [r["step"] for r in rows] == [1, 2]  # a trace a step
    assert [v for _, v in scalars["loss/loss"]] == pytest.approx([r["loss"] for r in rows])


def test_prime_rl_metrics_are_mirrored_at_collection(tmp_path: Path) -> None:
    from predict.train.prime_rl.collect import mirror_metrics
    from predict.train.step_metrics import write_metrics

    rows = [{"run": "B", "seed": 1, "step": s, "backend": "prime_rl", "reward_mean": s / 10, "loss": 1 / s,
             "pred_PASS": s} for s in (2, 1, 3)]
    write_metrics(rows, tmp_path / "metrics.parquet")
    log_dir = mirror_metrics(tmp_path / "metrics.parquet", tmp_path / "tb", run="B", seed=1)
    assert log_dir == tmp_path / "tb" / "rl" / "B" / "seed1"
    scalars = read_scalars(log_dir)
    assert scalars["rollout/reward_mean"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3))]
    assert [v for _, v in scalars["pred_class/PASS"]] == [1, 2, 3]
    mirror_metrics(tmp_path / "metrics.parquet", tmp_path / "tb", run="B", seed=1)  # collected again: no duplicates
    assert [s for s, _ in read_scalars(log_dir)["loss/loss"]] == [1, 2, 3]


# ---------------------------------------------------------------------------------------------------------------
# prime-rl: its own W&B monitor settings, checked against its config classes at the pin
# ---------------------------------------------------------------------------------------------------------------
def _tracking(mode: str) -> dict[str, Any]:
    config = load_config(REPO / "config" / "config.yaml")
    config["tracking"] = {"tensorboard": True, "wandb": {"mode": mode, "project": "predict", "entity": "lab"}}
    return config


def _render(config: dict[str, Any], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from predict.train.prime_rl import configs

    rl = configs.rl_config(config, "B", 1, model=tmp_path / "m", tasks=tmp_path / "rl.parquet", output_dir=tmp_path / "o")
    sft = configs.sft_config(config, "B", model=tmp_path / "m", dataset_dir=tmp_path / "d", output_dir=tmp_path / "s")
    return configs.read_toml(configs.write_toml(rl, tmp_path / "rl.toml")), sft


def _class_fields(source: Path, name: str) -> dict[str, str]:
    """A pydantic config class's fields (annotation source by name), its bases' first, from prime-rl's source."""
    tree = ast.parse(source.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    cls = classes[name]
    fields: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            fields |= _class_fields(source, base.id)
    fields |= {s.target.id: ast.unparse(s.annotation) for s in cls.body if isinstance(s, ast.AnnAssign)}
    return fields


def test_prime_rl_renders_wandb_monitors_for_both_modes(tmp_path: Path) -> None:
    rl, sft = _render(_tracking("disabled"), tmp_path)
    assert "wandb" not in rl and "wandb" not in rl["trainer"] and "wandb" not in sft
    monitor = {"project": "predict", "entity": "lab", "name": "rl/B/seed1", "group": "paper"}
    rl, sft = _render(_tracking("online"), tmp_path)
    assert rl["wandb"] == monitor and "wandb" not in rl["trainer"] and "wandb" not in rl["orchestrator"]
    assert sft["wandb"] == {**monitor, "name": "sft/B", "offline": False}
    rl, sft = _render(_tracking("offline"), tmp_path)
    assert "wandb" not in rl  # the rl entrypoint's shared [wandb] refuses offline
    assert rl["trainer"]["wandb"] == rl["orchestrator"]["wandb"] == {**monitor, "offline": True}
    assert sft["wandb"] == {**monitor, "name": "sft/B", "offline": True}


def test_prime_rl_wandb_monitors_validate_against_the_pinned_config_classes(tmp_path: Path) -> None:
    from tests.test_prime_rl_patch import _source

    src = _source(tmp_path) / "packages" / "prime-rl-configs" / "src" / "prime_rl"
    shared_py, rl_py = src / "configs" / "shared.py", src / "configs" / "rl.py"
    shared = _class_fields(rl_py, "SharedWandbConfig")
    per_process = _class_fields(shared_py, "WandbWithExtrasConfig")
    trainer_field = _class_fields(src / "configs" / "trainer.py", "TrainerConfig")["wandb"]
    orch_field = _class_fields(src / "configs" / "orchestrator.py", "OrchestratorConfig")["wandb"]
    sft_field = _class_fields(src / "configs" / "sft.py", "SFTConfig")["wandb"]
    assert "WandbConfig" in trainer_field and "Wandb" in orch_field and "WandbConfig" in sft_field
    assert "SharedWandbConfig" in _class_fields(rl_py, "RLConfig")["wandb"]
    assert "if self.offline" in rl_py.read_text()  # SharedWandbConfig refuses offline: why offline goes per process
    types = {"project": "str", "entity": "str", "name": "str", "group": "str", "offline": "bool"}
    for mode in ("online", "offline"):
        rl, sft = _render(_tracking(mode), tmp_path)
        tables = [(rl.get("wandb"), shared), (sft["wandb"], _class_fields(shared_py, "WandbConfig"))]
        tables += [(rl[part].get("wandb"), per_process) for part in ("trainer", "orchestrator")]
        for table, fields in tables:
            if table is None:
                continue
            assert set(table) <= set(fields), (mode, sorted(set(table) - set(fields)))
            for key, value in table.items():
                assert types[key] in fields[key] and isinstance(value, bool if key == "offline" else str), key
        if mode == "offline":  # validate_shared_wandb_config: both per-process blocks, one project
            assert rl["trainer"]["wandb"]["project"] == rl["orchestrator"]["wandb"]["project"]


def test_the_tracker_is_imported_only_where_used(tmp_path: Path) -> None:
    code = ("import sys; from predict.train.tracking import RunTracker, TrackingTargets; "
            "RunTracker(TrackingTargets(None), stage='rl', run='A', seed=1).start(0).log({'loss': 1.0}, 1); "
            "import predict.train.rl, predict.train.sft, predict.train.learning_signal; "
            "print(sorted(m for m in ('wandb', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert out.stdout.strip() == "[]"

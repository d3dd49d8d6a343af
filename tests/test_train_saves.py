"""Saves off the step's critical path (`Trainer.save` in the background, the RL driver's saves): the next step runs
while the state is written, the bytes are a foreground save's, and a kill during a save resumes from the last whole
state."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from predict.tiny_model import cached_tiny_qwen3  # noqa: E402
from predict.train.trainer import Trainer  # noqa: E402
from tests.test_train_trainer import _samples  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STATE_FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "trainer.json", "config.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_tiny_qwen3(tmp_path_factory.mktemp("models"))


def _trainer(tiny: Path) -> Trainer:
    return Trainer(tiny, lr=1e-3, weight_decay=0.0, grad_clip=1.0, device="cpu", dtype="float32",
                   micro_batch_tokens=64, seed=0)


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_rl_drivers_state_is_written_while_the_next_step_runs(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1's state is still being written when step 2 starts (the old driver wrote it before step 2 could
    start: the writer below would wait for step 2 in vain); the run still ends with every state whole and each
    save's write time in its step's row."""
    from predict.config import load_config
    from predict.train.driver import RLJob, TrainingRun

    config = load_config(REPO / "config" / "local.yaml")
    config["rl"] = {**config["rl"], "steps": 3, "state_every": 1, "checkpoint_every": 2}
    job = RLJob(run="A", seed=42, init=tiny, tasks=tmp_path / "rl.parquet", out_dir=tmp_path / "A" / "seed42")
    run = TrainingRun(job, config, "rl")
    run.resumable = False
    trainer, done, metrics = run.open_trainer()
    started = {n: threading.Event() for n in (1, 2, 3)}
    seen_while_writing: list[int] = []
    save, states = torch.save, []

    def slow_save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == "optimizer.pt":  # step N's state (one a step): wait (a while) for step N+1 to start
            states.append(path)
            step = len(states)
            if step + 1 in started and started[step + 1].wait(timeout=5):
                seen_while_writing.append(step + 1)
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", slow_save)

    def step_fn(step: int, trainer: Any) -> dict[str, Any]:
        started[step].set()
        trainer.step(_samples())
        return {"updated": True}

    assert run.run_steps(trainer, done, metrics, step_fn) is None
    assert seen_while_writing == [2, 3]  # steps 1 and 2's states were written beside the next step
    info = Trainer.read_state_info(run.state_dir)
    assert info["extra"]["rl_step"] == 3 and info["step"] == 3  # the last state is whole when run_steps returns
    assert (run.work / "checkpoints" / "step2" / "model.safetensors").is_file()
    rows = pq.read_table(run.work / "metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["state_write_s"] > 0 and r["save_s"] >= 0 for r in rows)
    assert [r["checkpoint_write_s"] is not None for r in rows] == [False, True, True]  # step 2 and the last


def test_a_background_save_writes_what_a_foreground_save_writes_at_that_step(tiny: Path, tmp_path: Path) -> None:
    """The background save takes its copies when called: training on while it is written changes none of its bytes
    (on the CPU a tensor moved to the CPU is itself, so a save that kept the live tensors would write step 2)."""
    trainer = _trainer(tiny)
    trainer.step(_samples())
    extra = {"rl_step": 1}
    trainer.save(checkpoint=tmp_path / "fg" / "ckpt", state=tmp_path / "fg" / "state", extra=extra)
    gate = threading.Event()
    write = trainer._write

    def gated_write(*args: Any) -> Any:
        assert gate.wait(timeout=30), "the test never opened the gate"
        return write(*args)

    trainer._write = gated_write  # type: ignore[method-assign]
    trainer.save(checkpoint=tmp_path / "bg" / "ckpt", state=tmp_path / "bg" / "state", extra=extra, background=True)
    trainer.step(_samples())  # the weights and AdamW's moments move on while the save waits to be written
    extra["rl_step"] = 2  # and so does what the caller handed in
    gate.set()
    took = trainer.wait_saves()
    assert set(took) == {"checkpoint", "state"}
    for part in ("ckpt", "state"):
        fg, bg = _bytes(tmp_path / "fg" / part), _bytes(tmp_path / "bg" / part)
        assert fg.keys() == bg.keys() and set(STATE_FILES[:1]) <= fg.keys()
        assert [name for name in fg if fg[name] != bg[name]] == []
    resumed = Trainer.resume(tmp_path / "bg" / "state", device="cpu")
    assert resumed.step_count == 1 and resumed.state_extra == {"rl_step": 1}


def test_a_failed_background_save_stops_the_run_at_the_next_save(tiny: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing lost quietly: a write that fails in the background (a full disk) is raised by the next save or
    `wait_saves`, and the state before it stays whole."""
    trainer = _trainer(tiny)
    trainer.step(_samples())
    trainer.save(state=tmp_path / "state", extra={"rl_step": 1})
    trainer.step(_samples())

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    trainer.save(state=tmp_path / "state", extra={"rl_step": 2}, background=True)
    with pytest.raises(OSError, match="No space left"):
        trainer.wait_saves()
    assert Trainer.read_state_info(tmp_path / "state")["extra"] == {"rl_step": 1}


KILLED_MID_SAVE = """
import os, sys, torch
from pathlib import Path
from predict.train.trainer import Trainer
from tests.test_train_trainer import _samples
tiny, state = Path(sys.argv[1]), Path(sys.argv[2])
t = Trainer(tiny, lr=1e-3, weight_decay=0.0, grad_clip=1.0, device="cpu", dtype="float32", micro_batch_tokens=64, seed=0)
t.step(_samples())
t.save(state=state, extra={"rl_step": 1})
t.step(_samples())
save = torch.save
def killed(obj, path, *args, **kwargs):  # the process dies between the state's files: weights written, AdamW not
    if Path(path).name == "optimizer.pt":
        os._exit(9)
    return save(obj, path, *args, **kwargs)
torch.save = killed
t.save(state=state, extra={"rl_step": 2}, background=True)
t.step(_samples())
t.wait_saves()
"""


def test_a_kill_between_the_states_files_resumes_from_the_last_whole_state(tiny: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(tiny), str(state)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr[-2000:]
    assert [p.name for p in tmp_path.glob(".state.tmp-*")]  # the half-written state is there...
    resumed = Trainer.resume(state, device="cpu")
    assert resumed.step_count == 1 and resumed.state_extra == {"rl_step": 1}  # ...and not read
    resumed.step(_samples())
    resumed.save(state=state, extra={"rl_step": 2})
    assert not list(tmp_path.glob(".state.*"))  # the next save clears what the killed one left (32 GB at 4B)


def test_a_kill_between_the_two_renames_puts_the_last_whole_state_back(tiny: Path, tmp_path: Path) -> None:
    """A save renames the old state aside, then the new one into place: killed in between, the state folder is
    missing and the old one (whole: only a finished folder is renamed) lies beside it; it is read, not lost."""
    trainer = _trainer(tiny)
    trainer.step(_samples())
    state = trainer.save_state(tmp_path / "state", extra={"rl_step": 1})
    dead = 2**22 + 12345  # above Linux's default pid_max: no live process has it
    state.rename(tmp_path / f".state.old-{dead}")
    (tmp_path / f".state.tmp-{dead}").mkdir()  # the new state, half written
    (tmp_path / f".state.tmp-{dead}" / "model.safetensors").write_bytes(b"half")
    info = Trainer.read_state_info(state)
    assert info is not None and info["extra"] == {"rl_step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]

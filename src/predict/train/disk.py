"""The disk the local trainer's saves need, known before a run starts: a run that cannot fit its disk stops first,
naming the bytes it needs and where, instead of dying at its first 32 GB state an hour in.

Rules it follows:

1. **What is counted** (bytes from the model's parameter count, `predict.serving.gpu_memory.ModelShape`): the base
   model a config builds (``model.base: tiny``); each SFT's HF checkpoint and, while it trains, its resumable state;
   each RL/RFT run's HF checkpoints (`predict.runs.checkpoint_steps`; published by hard links, counted once), its
   served copy (``.work/policy``, the HF folder its vLLM server starts on) and its resumable state (``.work/state``:
   the weights in the training dtype and the optimizer's state: 8 bytes a parameter in bf16, 32 GB at 4B; 12 in
   float32). Rollouts, evaluations and logs are small beside them and not counted.
2. **A state being replaced is on disk twice** (`predict.train.saves.atomic_dir`: the new one is written whole before
   the old one goes), so a job that saves its state more than once needs two of them at its peak.
3. **What is kept adds up, what a job deletes does not**: checkpoints stay; a state and a served copy are deleted
   when their job ends (``rl.keep_state: false``), so a plan needs every job's kept bytes plus the largest job's
   transient bytes (the gpu profile runs one GPU job at a time). What is already on disk is not asked for again.
4. **Checked twice**: by the workflow before its first job (`check_workflow_disk`, workflow/rules/common.smk's
   onstart) and by each SFT, RL and RFT job as it starts (`check_disk`), which also covers a stage run by hand and a
   disk that filled meanwhile. The error names each item, its bytes and its folder, and what the disk has free.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from predict.config.models import TinyModelSettings
from predict.serving.gpu_memory import ModelShape

if TYPE_CHECKING:
    from predict.stages import StageSettings

log = logging.getLogger(__name__)

GB = 10**9
STATE_BYTES_PER_PARAM = {"bfloat16": 8, "float16": 8, "float32": 12}
"""A saved trainer state (`Trainer.save`): weights in the training dtype, then the optimizer: KahanAdamW's Kahan
buffer and its two bf16 moments below float32 (2 + 2 + 2 + 2), torch AdamW's two float32 moments on float32 (4 + 8)."""
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class DiskSpaceError(RuntimeError):
    """A run's saves do not fit the disk its results go to."""


@dataclass(frozen=True)
class DiskNeed:
    what: str
    path: Path
    bytes: int
    kept: bool
    """Stays after its job (a checkpoint), or deleted when the job ends (a state, a served copy)."""


def model_parameters(model: str | Path, tiny: TinyModelSettings | None = None) -> int | None:
    """Parameters of a checkpoint folder (its config.json) or of the tiny model `tiny` describes (model.tiny; left
    out for a `tiny` base: its defaults); None when neither is known here (a hub id not yet downloaded)."""
    folder = Path(model).expanduser()
    if (folder / "config.json").is_file():
        return ModelShape.from_config(json.loads((folder / "config.json").read_text())).parameters
    if tiny is not None or str(model) == "tiny":
        from predict.tiny_model import parameter_count

        return parameter_count(tiny if tiny is not None else TinyModelSettings())
    return None


def state_bytes(parameters: int, dtype: str) -> int:
    return parameters * STATE_BYTES_PER_PARAM[dtype]


def checkpoint_bytes(parameters: int, dtype: str = "bfloat16") -> int:
    return parameters * _DTYPE_BYTES[dtype]


def training_dtype(dtype: str, device: str) -> str:
    """The trainer's dtype (`Trainer`: auto is bf16 on a GPU, float32 on the CPU)."""
    return dtype if dtype != "auto" else ("bfloat16" if device == "gpu" else "float32")


def _du(path: Path) -> int:
    """Bytes a folder holds now (0 when it does not exist)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def training_needs(
    label: str,
    out_dir: Path,
    *,
    parameters: int,
    dtype: str,
    checkpoints: Sequence[Path],
    state_dir: Path,
    state_saves: int,
    keep_state: bool,
    served_copy: Path | None = None,
    state_links_checkpoint: bool = False,
) -> list[DiskNeed]:
    """One training job's needs (rules 1-3): its HF checkpoints not yet written, the served copy (a resumed RL run's:
    a fresh one serves its SFT folder), and its state (twice when it is replaced at least once), less what of them is
    on disk already. `state_links_checkpoint`: every state is saved with a checkpoint in its dtype, whose weights it
    links (`Trainer.save`), so only the optimizer's part is new."""
    one = checkpoint_bytes(parameters)
    missing = [c for c in checkpoints if not (c / "config.json").is_file()]
    needs = []
    if missing:
        steps = ", ".join(c.name for c in missing)
        needs.append(DiskNeed(f"{label}: {len(missing)} HF checkpoint(s) ({steps})", out_dir, one * len(missing), True))
    if served_copy is not None:
        needs.append(DiskNeed(f"{label}: the served copy", served_copy, max(one - _du(served_copy), 0), False))
    if state_saves:
        own = state_bytes(parameters, dtype) - (checkpoint_bytes(parameters, dtype) if state_links_checkpoint else 0)
        state = own * (2 if state_saves > 1 else 1)
        needs.append(DiskNeed(f"{label}: the resumable state{' (old and new while replaced)' if state_saves > 1 else ''}",
                              state_dir, max(state - _du(state_dir), 0), keep_state))
    return [n for n in needs if n.bytes > 0]


def rl_states_link_checkpoints(steps: int, done: int, state_every: int, checkpoint_steps: Sequence[int],
                               dtype: str) -> bool:
    """Whether every state an RL/RFT run saves after step `done` comes with a bf16 checkpoint it links."""
    saves = [s for s in range(done + 1, steps + 1) if s % state_every == 0 or s in checkpoint_steps or s == steps]
    return dtype == "bfloat16" and all(s in checkpoint_steps for s in saves)


def rl_state_saves(steps: int, done: int, state_every: int, checkpoint_steps: Sequence[int]) -> int:
    """How many times an RL/RFT run of `steps` saves its state after step `done` (the driver's rule)."""
    return sum(1 for s in range(done + 1, steps + 1) if s % state_every == 0 or s in checkpoint_steps or s == steps)


def sft_state_saves(total_steps: int | None, save_every: int, done: int = 0) -> int:
    """How many times SFT saves its state (every save_every steps, never at its last); unknown total: at least 2."""
    if not save_every:
        return 0
    if total_steps is None:
        return 2
    return sum(1 for s in range(done + 1, total_steps) if s % save_every == 0)


def plan_bytes(needs: Sequence[DiskNeed], *, concurrent: bool = False) -> int:
    """Rule 3: every kept byte, plus the largest job's transient bytes (`concurrent`: all of them)."""
    kept = sum(n.bytes for n in needs if n.kept)
    per_job: dict[str, int] = {}
    for n in needs:
        if not n.kept:
            job = n.what.split(":", 1)[0]
            per_job[job] = per_job.get(job, 0) + n.bytes
    transient = sum(per_job.values()) if concurrent else max(per_job.values(), default=0)
    return kept + transient


def check_disk(needs: Sequence[DiskNeed], where: Path, *, what: str) -> None:
    """Raise DiskSpaceError, naming each need, when the disk holding `where` has less free than the plan needs."""
    need = plan_bytes(needs)
    if not need:
        return
    probe = Path(where)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    lines = "\n".join(f"  {n.bytes / GB:8.1f} GB  {n.what}{' (while it trains)' if not n.kept else ''}: {n.path}"
                      for n in needs)
    if free < need:
        raise DiskSpaceError(
            f"{what} needs {need / GB:.1f} GB of disk and {probe} has {free / GB:.1f} GB free "
            f"(kept outputs, plus the largest job's state and served copy while it trains):\n{lines}\n"
            "Free the disk, point results_dir at a larger one, or cut counts (seeds, runs, rl.checkpoint_every)."
        )
    log.info("disk: %s needs %.1f GB, %.1f GB free at %s\n%s", what, need / GB, free / GB, probe, lines)


def workflow_needs(config: StageSettings, results: Path) -> list[DiskNeed] | None:
    """Rule 1 for a whole run of the local backend (the workflow's typed object, `predict.stages.workflow_config`):
    the tiny base model it builds, every SFT and every RL/RFT run and seed whose outputs are not there yet. None where
    the model's size is not known here (a hub id) or prime-rl trains (its own checkpoints: docs/disk.md)."""
    from predict.runs import sft_runs

    if config.backend != "local":
        return None
    tiny = config.model.base == "tiny"
    base = results / "models" / "tiny" if tiny else Path(config.model.base)
    parameters = model_parameters(base, config.model.tiny or TinyModelSettings()) if tiny else model_parameters(base)
    if parameters is None:
        return None
    needs = []
    if tiny and not (base / "config.json").is_file():
        needs.append(DiskNeed("build_tiny_model: the base model", base, checkpoint_bytes(parameters), True))
    sft = config.sft  # its defaults where the config has no sft section
    sft_device = config.serving.device if sft.device == "auto" else sft.device
    for run in sft_runs(config):
        if not (results / "checkpoints" / run / "sft" / "config.json").is_file():
            needs += training_needs(f"SFT {run}", results / "checkpoints" / run, parameters=parameters,
                                    dtype=training_dtype(sft.dtype, sft_device),
                                    checkpoints=[results / "checkpoints" / run / "sft"],
                                    state_dir=results / "sft" / run / "state",
                                    state_saves=sft_state_saves(sft.max_steps, sft.save_every), keep_state=False)
    if config.rl is not None:
        needs += _rl_needs(config, results, parameters)
    return needs


def _rl_needs(config: StageSettings, results: Path, parameters: int) -> list[DiskNeed]:
    """`workflow_needs` of every RL and RFT run and seed whose metrics are not there yet."""
    from predict.runs import checkpoint_steps, resolve_run, study_runs

    rl = config.rl
    steps = checkpoint_steps(rl.steps, rl.checkpoint_every)
    dtype = training_dtype(rl.dtype, config.serving.device)
    needs = []
    for run in study_runs(config):
        if resolve_run(config, run).trainer not in ("rl", "rft"):
            continue
        for seed in config.seeds:
            out = results / "rl" / run / f"seed{seed}"
            if (out / "metrics.parquet").is_file():
                continue
            needs += training_needs(f"RL {run} seed {seed}", out, parameters=parameters, dtype=dtype,
                                    checkpoints=[out / ".work" / "checkpoints" / f"step{n}" for n in steps],
                                    state_dir=out / ".work" / "state",
                                    state_saves=rl_state_saves(rl.steps, 0, rl.state_every, steps),
                                    keep_state=rl.keep_state,
                                    state_links_checkpoint=rl_states_link_checkpoints(
                                        rl.steps, 0, rl.state_every, steps, dtype))
    return needs


def check_workflow_disk(config: StageSettings, results: Path) -> None:
    """Rule 4: the workflow's check before its first job (`check_disk` over `workflow_needs`)."""
    needs = workflow_needs(config, results)
    if needs is None:
        log.info("disk: not planned (backend %s, model %s)", config.backend, config.model.base)
        return
    check_disk(needs, results, what=f"run {config.run_name}")

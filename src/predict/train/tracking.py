"""Live training curves: every step's metrics row as TensorBoard scalars and, when asked, in a W&B run.

Rules this module follows:

1. **One log root per results folder**: ``{results_dir}/tensorboard``; one TensorBoard run per training job at
   ``<root>/<stage>/<run>[/seed<seed>]`` (``sft/A``, ``rl/B/seed1``, ``rft/rft_A/seed1``, ``prime_rl/B/seed1``,
   ``signal/...``), so ``tensorboard --logdir {results_dir}/tensorboard`` shows the whole study, SFT beside RL.
2. **Tags group the columns** (`scalar_tags`): ``rollout/``, ``loss/``, ``train/``, ``time/``, and the per-class
   counts as ``pred_class/<CLASS>`` and ``verified_class/<CLASS>``; a custom-scalars layout draws each group of
   classes in one chart. Identity columns (run, seed, step, backend) are the run's name and the x axis, not scalars.
3. **Live**: `RunTracker.log` writes a row as its step ends and flushes, so a run is watchable while it trains.
4. **Resume-safe**: a run resumed after step N opens its writer with ``purge_step = N + 1`` (TensorBoard hides the
   earlier attempt's points from N + 1 on, so a rewound step is there once); a run that starts from step 0 empties
   its folder first. W&B: one run per study run and seed, resumed by id: the id, (run_name, stage, run, seed) and
   the fresh start's time, is kept beside the job's resumable state (``id_file``), so a resumed job continues its
   W&B run and a job that starts afresh (new inputs, or asked for again) gets a run of its own.
5. **W&B only when asked**: ``tracking.wandb.mode`` disabled (default: wandb is never imported), offline (files
   under ``{results_dir}/wandb``, no network) or online. Grouped by ``run_name``; its config is the stage's slice.
6. **Fails before training**: a tracker that cannot start (package missing, bad credentials, no network in online
   mode) raises `TrackingError`, one line naming the setting; `RunTracker.start` is called before the first step.
7. **Cheap and lazy**: the writers are imported in `RunTracker.start` only; a step costs one scalar per column.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from predict.config import ConfigError
from predict.config.models import WandbSettings
from predict.stages import TRACKING_VIEW, StageSettings, stage_settings

log = logging.getLogger(__name__)

IDENTITY_COLUMNS = ("run", "seed", "step", "backend", "arm", "finished_at")
"""Columns that name the run or the step (the x axis), not curves."""
AFTERWARDS_COLUMNS = ("checkpoint_write_s", "state_write_s")
"""Known only steps later (a save is written in the background beside the next steps): in metrics.parquet, never a
live curve (W&B takes no point at a step it has passed)."""
LOSS_COLUMNS = ("loss", "rl_loss", "ce_loss", "kl", "clip_frac", "grad_norm")
ROLLOUT_COLUMNS = ("n_rollouts", "n_failed", "reward_mean", "pass_rate", "n_budget_exhausted",
                   "budget_exhausted_rate", "n_patches", "n_predictions", "n_revise", "revise_rate",
                   "prediction_accuracy", "n_input_tokens", "n_output_tokens")
CLASS_GROUPS = {"pred_": "pred_class", "verified_": "verified_class"}


class TrackingError(ConfigError):
    """A tracker cannot start (names the setting to change)."""


def column_tag(column: str) -> str:
    """The TensorBoard / W&B tag of a metrics column (rule 2)."""
    for prefix, group in CLASS_GROUPS.items():
        if column.startswith(prefix):
            return f"{group}/{column.removeprefix(prefix)}"
    if column in LOSS_COLUMNS:
        return f"loss/{column}"
    if column in ROLLOUT_COLUMNS:
        return f"rollout/{column}"
    if column.endswith("_s"):
        return f"time/{column}"
    return f"train/{column}"


def scalar_tags(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics row as {tag: value}: numbers and booleans only; unmeasured (None), identity and afterwards columns
    left out."""
    out: dict[str, float] = {}
    for column, value in row.items():
        if column in IDENTITY_COLUMNS or column in AFTERWARDS_COLUMNS or value is None or isinstance(value, str):
            continue
        if isinstance(value, bool | int | float):
            out[column_tag(column)] = float(value)
    return out


@dataclass(frozen=True)
class TrackingTargets:
    """Where a training job's curves go: the ``tracking`` section (predict.config.models.TrackingSettings) resolved
    against ``results_dir`` and ``run_name``."""

    tensorboard_root: Path | None
    """``{results_dir}/tensorboard``; None: TensorBoard off (``tracking.tensorboard: false``)."""
    wandb: WandbSettings = field(default_factory=WandbSettings)
    """``tracking.wandb`` (left out: the section's defaults, W&B disabled)."""
    wandb_dir: Path | None = None
    group: str = ""
    """The study (``run_name``): W&B's group of every run and seed."""
    prefix: str = ""
    """Put before every job's name (`predict.train.learning_signal`'s runs: ``signal/<its run>/``)."""

    @classmethod
    def from_config(cls, config: StageSettings | Mapping[str, Any]) -> TrackingTargets:
        """From a training stage's typed object (its row lists `predict.stages.TRACKING`: ``results_dir``,
        ``run_name`` and ``tracking``, whose defaults are predict.config.models.TrackingSettings: left out,
        TensorBoard on and W&B disabled), or a config mapping read through those keys."""
        if not isinstance(config, StageSettings):
            try:
                config = stage_settings(TRACKING_VIEW, config, source="tracking")
            except ConfigError as e:
                raise TrackingError(str(e).removeprefix("tracking: ")) from None
        results = Path(config.results_dir)
        return cls(
            tensorboard_root=results / "tensorboard" if config.tracking.tensorboard else None,
            wandb=config.tracking.wandb,
            wandb_dir=results / "wandb",
            group=config.run_name,
        )

    def under(self, name: str) -> TrackingTargets:
        """The same settings with every job's name under `name` (TensorBoard folder and W&B name and id)."""
        return replace(self, prefix=f"{self.prefix}{name}/")


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stage slice as plain JSON (W&B's run config)."""
    return json.loads(json.dumps(dict(config), default=str))


class RunTracker:
    """The trackers of one training job (stage, run, seed): `start` before the first step, `log` each row, `close`."""

    def __init__(self, settings: TrackingTargets | None, *, stage: str, run: str, seed: int | None = None,
                 config: Mapping[str, Any] | None = None, id_file: Path | None = None) -> None:
        self.settings = settings
        self.id_file = id_file
        """Where the W&B run's id lives beside the job's resumable state (rule 4); None: the fixed name only."""
        self.stage, self.run, self.seed = stage, run, seed
        self.config = _plain(config or {})
        prefix = settings.prefix if settings else ""
        self.name = prefix + "/".join([stage, run] + ([f"seed{seed}"] if seed is not None else []))
        self._tb: Any = None
        self._wandb: Any = None

    @property
    def log_dir(self) -> Path | None:
        """This job's TensorBoard run folder (None with TensorBoard off)."""
        root = self.settings.tensorboard_root if self.settings else None
        return root / self.name if root is not None else None

    @property
    def wandb_name_id(self) -> str:
        """The study run and seed as a W&B id: (run_name, stage, run, seed)."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join([self.settings.group if self.settings else "", self.name]))

    def wandb_id(self, done: int) -> str:
        """The W&B run to log to: the saved one when resuming (`done` > 0), else a new one saved for the resume."""
        if self.id_file is None:
            return self.wandb_name_id
        if done and self.id_file.is_file():
            return self.id_file.read_text().strip()
        from predict.outputs import write_text

        run_id = f"{self.wandb_name_id}-{time.time_ns() // 1_000_000:x}"
        write_text(run_id + "\n", self.id_file)
        return run_id

    def start(self, done: int) -> RunTracker:
        """Open the trackers for a job that has `done` steps behind it (0: a fresh start; rule 4)."""
        if self.settings is None:
            return self
        if self.settings.wandb.mode != "disabled":  # first: the one that can fail on credentials or the network
            self._wandb = self._open_wandb(done)
        if self.log_dir is not None:
            try:
                self._tb = self._open_tensorboard(self.log_dir, done)
            except TrackingError:
                self.close()
                raise
        return self

    def _open_tensorboard(self, log_dir: Path, done: int) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise TrackingError(f"tracking.tensorboard: the tensorboard package is missing ({e}); install the "
                                "'track' extra (envs/install.sh) or set tracking.tensorboard: false") from None
        if done == 0:
            shutil.rmtree(log_dir, ignore_errors=True)  # an earlier attempt's curves would overlap this one's
        try:
            writer = SummaryWriter(str(log_dir), purge_step=done + 1 if done else None, flush_secs=3600)
        except OSError as e:
            raise TrackingError(f"tracking.tensorboard: cannot write {log_dir} ({e})") from None
        if done == 0:
            writer.add_custom_scalars({"classes": {
                "predicted class": ["Multiline", [r"pred_class/.*"]],
                "verified class": ["Multiline", [r"verified_class/.*"]],
            }})
        return writer

    def _open_wandb(self, done: int) -> Any:
        """The W&B run, resumed by id when it exists (``done`` steps behind it: W&B keeps the steps it has)."""
        s = self.settings
        assert s is not None
        try:
            import wandb
        except ImportError as e:
            raise TrackingError(f"tracking.wandb.mode: {s.wandb.mode} but the wandb package is missing ({e}); "
                                "install the 'track' extra (envs/install.sh) or set mode: disabled") from None
        if s.wandb_dir is not None:
            s.wandb_dir.mkdir(parents=True, exist_ok=True)
        try:
            return wandb.init(
                mode=s.wandb.mode, project=s.wandb.project, entity=s.wandb.entity, group=s.group or None,
                name=self.name, job_type=self.stage, id=self.wandb_id(done), resume="allow", config=self.config,
                dir=str(s.wandb_dir) if s.wandb_dir else None, reinit="create_new",
                settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
            )
        except Exception as e:  # wandb raises its own errors (auth, network, usage): one line before training
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrackingError(f"tracking.wandb (mode {s.wandb.mode}, project {s.wandb.project!r}, entity "
                                f"{s.wandb.entity!r}): W&B did not start: {first}") from None

    def log(self, row: Mapping[str, Any], step: int) -> None:
        """One step's row, written and flushed as the step ends (rule 3)."""
        if self._tb is None and self._wandb is None:
            return
        scalars = scalar_tags(row)
        if self._tb is not None:
            for tag, value in scalars.items():
                self._tb.add_scalar(tag, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def log_rows(self, rows: list[Mapping[str, Any]]) -> None:
        """A whole table at once (prime-rl's converted metrics, mirrored at collection), in step order."""
        for row in sorted(rows, key=lambda r: int(r["step"])):
            self.log(row, int(row["step"]))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> RunTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The training-run driver: what every run of our trainer does around its steps (local RL and RFT alike).

Rules it follows:

1. **One run = one (run, seed)** of the study matrix (`predict.runs.resolve_run`), trained from its SFT
   checkpoint (``RLJob.init``: ``RunSpec.sft_run``'s, its arm's or its own) into ``results/rl/{run}/seed{seed}``.
   The run's trainer must be the caller's.
2. **Serving**: a vLLM server colocated with the trainer (`serve`), on the policy folder the caller names, with
   the config's ``serving`` section; a job with ``base_url`` rolls out against that endpoint instead (tests); a
   running server handed in (``shared``, `predict.train.learning_signal`) first gets the run's starting weights loaded in place.
   Rollouts use the run's arm, variant and test cost, the train client (token graph recorded), the rl split and
   ``rl.max_tokens`` (`rollout_settings`).
3. **Resume**: the trainer state (weights, optimizer, RNG) and the metrics so far are saved to ``.work/state``
   every ``rl.state_every`` steps, at checkpoint steps and at the last step; a killed run restarts from there,
   never from step 0 (`open_trainer`), and only when ``.work/fingerprint.json`` says the state was made from the
   same config slice, init checkpoint, task split and seed (`start`, `predict.fingerprint`); otherwise ``.work`` is
   emptied and the run starts fresh, as it does once a published run is asked for again.
4. **Checkpoints**: at `predict.runs.checkpoint_steps` the HF weights go to ``.work/checkpoints/step{N}`` and,
   once the run completes, are hard-linked to ``step{N}/`` (`publish`), so Snakemake's clean-up of an incomplete
   job's outputs never deletes them.
5. **Metrics**: one row per step in the schema of `predict.train.step_metrics` (``.work/metrics.parquet`` as it goes,
   ``metrics.parquet`` when published), and as each step ends the same row to the job's trackers
   (``job.tracking``, `predict.train.tracking`: TensorBoard under ``rl/{run}/seed{seed}``, W&B when asked),
   started in `start`, before any rollout or update, at the step the run resumes from.
6. **Disk**: a run checks at its start that its checkpoints, state and served copy fit its disk
   (`predict.train.disk`); once published, the resumable state (``.work/state``, ``.work/policy``, ``.work/checkpoints``) is
   deleted (about 50 GB per run at 4B); ``rl.keep_state: true`` keeps it. The step rollouts and logs stay.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predict.config import ConfigError
from predict.config.models import plain_data
from predict.fingerprint import mark_finished, run_fingerprint, start_or_resume
from predict.runs import RunSpec, checkpoint_steps, resolve_run
from predict.serving.server import SERVED_NAME
from predict.stages import StageSettings, stage_settings
from predict.train.step_metrics import write_metrics
from predict.train.tracking import RunTracker, TrackingTargets

log = logging.getLogger(__name__)

WORK = ".work"
# Where RL trains: the job's GPU when it has one, else the CPU (the job's resources decide; no config key).
RL_DEVICE = "auto"
STATE_PARTS = ("state", "policy", "checkpoints")
"""What `publish` deletes from .work/ unless ``rl.keep_state``: the resumable state and the duplicates."""


@dataclass(frozen=True)
class RLJob:
    run: str
    seed: int
    init: Path
    """The run's starting checkpoint (its SFT folder: `predict.runs.RunSpec.sft_run`)."""
    tasks: Path
    """The rl split parquet."""
    out_dir: Path
    """results/rl/{run}/seed{seed}: step{N}/ checkpoints, metrics.parquet, .work/."""
    base_url: str | None = None
    """Roll out against this running endpoint instead of starting vLLM (no weight sync then: tests only)."""
    tracking: TrackingTargets | None = None
    """Where each step's metrics row goes live (`predict.train.tracking`); None: nowhere but metrics.parquet."""


SLEEP_TAGS = ("weights", "kv_cache")
"""vLLM's memory tags, the parts a level 2 sleep gives back and `VLLMServer.wake_up` can wake one by one."""


@dataclass
class UpdateWindow:
    """The server's side of one update (`TrainingRun.update_window`): asleep through it, or not at all."""

    server: Any | None
    """The server that sleeps through the update; None where nothing slept."""
    asleep: tuple[str, ...] = SLEEP_TAGS
    """vLLM's memory tags still asleep (each wakes once: a second wake of a tag would map its memory twice)."""

    @property
    def slept(self) -> bool:
        return self.server is not None

    def wake(self, tags: tuple[str, ...]) -> None:
        """Wake the named parts that still sleep; what the update cached goes back to the driver first, or the server
        cannot take its memory back."""
        tags = tuple(t for t in tags if t in self.asleep)
        if self.server is None or not tags:
            return
        import torch

        torch.cuda.empty_cache()
        self.server.wake_up(None if set(tags) == set(SLEEP_TAGS) else tags)  # all of it: a plain wake-up
        self.asleep = tuple(t for t in self.asleep if t not in tags)

    def sync(self, push: Callable[[bool], Any]) -> Any:
        """Hand the update's weights over: ``push(drain)`` loads them (`VLLMServer.push_weights` or
        `reload_weights` with ``drain``). Into a sleeping server: its weights wake alone, the weights load with no
        pause, prefix-cache reset or resume (vLLM's sleep paused the scheduler and cleared that cache; nothing is
        scheduled until the KV cache is awake), then the KV cache wakes and scheduling resumes. That saves the
        pause's fixed 20 ms sleep and three HTTP calls of the 4B sync (benchmarks/log/gpu.md). Elsewhere:
        ``push(True)``."""
        if self.server is None:
            return push(True)
        self.wake(("weights",))
        result = push(False)
        self.wake(("kv_cache",))
        return result


def epoch_order(n: int, seed: str, step: int, per_step: int) -> list[int]:
    """Which of `n` items step `step` (1-based) takes, `per_step` a step: each epoch's own shuffle, seeded by
    ``f"{seed}:{epoch}"``, so a resumed run takes exactly what it would have taken."""
    out = []
    for k in range((step - 1) * per_step, step * per_step):
        epoch, i = divmod(k, n)
        perm = list(range(n))
        random.Random(f"{seed}:{epoch}").shuffle(perm)
        out.append(perm[i])
    return out


StepFn = Callable[[int, Any], dict[str, Any]]
"""One step: (step, trainer) -> its metrics row (rollout and update columns); the driver adds the rest."""


@dataclass
class TrainingRun:
    """One run of our trainer (``trainer`` = ``rl`` or ``rft``, also the metrics' ``backend``)."""

    job: RLJob
    config: StageSettings | Mapping[str, Any]
    """The stage's typed object (a config mapping, a test's or the learning-signal run's, is read through the
    trainer's row once, here); the fingerprint and W&B's run config take its plain data."""
    trainer: str
    spec: RunSpec = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, StageSettings):
            self.config = stage_settings(self.trainer, self.config)
        self.spec = resolve_run(self.config, self.job.run)
        if self.spec.trainer != self.trainer:
            raise ValueError(f"run {self.job.run}: trainer {self.spec.trainer}, not {self.trainer} "
                             f"(its stage is `predict {self.spec.trainer}`)")
        if self.config.rl is None:
            raise ConfigError(f"stage {self.trainer!r}: its config sets no 'rl'")
        self.rl = self.config.rl  # RLSettings
        self.steps = self.rl.steps
        self.ckpt_steps = set(checkpoint_steps(self.rl.steps, self.rl.checkpoint_every))
        self.work = self.job.out_dir / WORK
        self.state_dir = self.work / "state"
        self.step_key = f"{self.trainer}_step"  # in the saved state: steps done
        self.resumable = False  # set by `start`
        self.tracker = RunTracker(self.job.tracking, stage=self.trainer, run=self.job.run, seed=self.job.seed,
                                  config=plain_data(self.config), id_file=self.work / "wandb-id")

    def start(self) -> bool:
        """Whether ``.work`` holds state made from this run's inputs (resume it); else it is emptied (rule 3)."""
        fp = run_fingerprint(self.config, self.trainer, spec=self.spec, init=self.job.init, tasks=self.job.tasks,
                             seed=self.job.seed)
        what = f"{self.trainer.upper()} {self.job.run} seed {self.job.seed}"
        self.resumable = start_or_resume(self.work, fp, what=what)
        done = self.steps_saved()
        self.check_disk(done, what)
        self.tracker.start(done)  # a tracker that cannot start stops the run here (rule 5)
        return self.resumable

    def check_disk(self, done: int, what: str) -> None:
        """Rule 6's other side: a run whose checkpoints, state and served copy cannot fit its disk stops before its
        first step, naming each (`predict.train.disk`)."""
        import torch

        from predict.train import disk

        parameters = disk.model_parameters(self.job.init)
        if parameters is None:
            return
        dtype = disk.training_dtype(self.rl.dtype, "gpu" if RL_DEVICE == "auto" and torch.cuda.is_available() else "cpu")
        ckpts, every = sorted(self.ckpt_steps), self.rl.state_every
        needs = disk.training_needs(what, self.job.out_dir, parameters=parameters, dtype=dtype,
                                    checkpoints=[self.work / "checkpoints" / f"step{n}" for n in ckpts if n > done],
                                    state_dir=self.state_dir,
                                    state_saves=disk.rl_state_saves(self.steps, done, every, ckpts),
                                    keep_state=self.rl.keep_state,
                                    served_copy=self.work / "policy" if done else None,
                                    state_links_checkpoint=disk.rl_states_link_checkpoints(self.steps, done, every,
                                                                                           ckpts, dtype))
        check_disk = disk.check_disk
        check_disk(needs, self.job.out_dir, what=what)

    def steps_saved(self) -> int:
        """Steps done by the saved state `open_trainer` resumes (0 when it starts fresh)."""
        from predict.train.trainer import Trainer

        info = Trainer.read_state_info(self.state_dir) if self.resumable else None
        return int((info or {}).get("extra", {}).get(self.step_key, 0)) if info else 0

    # -- the trainer ---------------------------------------------------------------------------------------------
    def open_trainer(self, **overrides: Any) -> tuple[Any, int, list[dict[str, Any]]]:
        """(trainer, steps done, metrics so far): resumed from ``.work/state`` when there is one. Activation
        checkpointing and the optimizer's offload are not part of the state (they change memory, never the numbers):
        the config sets them either way; a resumed state's optimizer leaves the device before the first rollout."""
        trainer, done, metrics = self._resumed_or_new_trainer(overrides)
        if self.rl.activation_checkpointing:
            trainer.checkpoint_activations(self.rl.activation_checkpointing_layers)
        if self.rl.offload_optimizer:
            trainer.offload_optimizer_state()
        return trainer, done, metrics

    def _resumed_or_new_trainer(self, overrides: dict[str, Any]) -> tuple[Any, int, list[dict[str, Any]]]:
        from predict.train.trainer import Trainer

        if self.resumable and Trainer.read_state_info(self.state_dir) is not None:
            trainer = Trainer.resume(self.state_dir, device=RL_DEVICE)
            extra = trainer.state_extra
            done, metrics = int(extra.get(self.step_key, 0)), list(extra.get("metrics", []))
            log.info("resuming %s seed %d from step %d (%s)", self.job.run, self.job.seed, done, self.state_dir)
            return trainer, done, metrics
        rl = self.rl
        kwargs = {
            "lr": rl.lr,
            "weight_decay": rl.weight_decay,
            "grad_clip": rl.grad_clip,
            "device": RL_DEVICE,
            "dtype": rl.dtype,
            "micro_batch_tokens": rl.micro_batch_tokens,
            "seed": self.job.seed,
        }
        return Trainer(self.job.init, **(kwargs | overrides)), 0, []

    # -- serving and rollouts ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def serve(self, model_dir: Path, *, worker_extension: bool = False, shared: Any | None = None) -> Iterator[Any]:
        """The colocated vLLM server on `model_dir` (None with ``job.base_url``); weights reloadable in place
        with `worker_extension`. `shared`: a running server (worker extension on) to load `model_dir` into."""
        if shared is not None:
            shared.reload_weights(model_dir, version="0")  # it holds the previous run's weights
            yield shared
            return
        if self.job.base_url:
            yield None
            return
        from predict.serving.server import VLLMServer

        with VLLMServer.from_serving(
            model_dir,
            self.config.serving,
            sequences=self.config.env.concurrency,  # the run's env changes test_cost only (RunSpec.env)
            served_model_name=SERVED_NAME,
            worker_extension=worker_extension,
            log_path=self.work / "vllm.log",
        ) as server:
            yield server

    @staticmethod
    @contextlib.contextmanager
    def update_window(server: Any) -> Iterator[UpdateWindow]:
        """An update beside a GPU server in sleep mode: the server gives its weights and KV cache back for the
        update (level 2 sleep); the caller hands the new weights over with `UpdateWindow.sync` inside the window, and
        whatever still sleeps wakes when it closes (after a failed update too: the next lease or step needs the
        server). Elsewhere (the CPU, a server without sleep mode, no server) the window is a plain sync."""
        slept = bool(server is not None and getattr(server, "sleep_mode", False) and server.sleep(2))
        window = UpdateWindow(server if slept else None)
        try:
            yield window
        finally:
            window.wake(SLEEP_TAGS)

    def rollout_settings(self, server: Any, checkpoint: str) -> Any:
        """The training rollouts' settings against `server` (or ``job.base_url``)."""
        from predict.env.runner import RolloutSettings
        return RolloutSettings.from_study_config(
            self.spec.env(self.config),
            arm=self.spec.arm,
            seed=self.job.seed,
            checkpoint=checkpoint,
            base_url=self.job.base_url or server.base_url,
            model=SERVED_NAME if server is not None else str(self.job.init),
            variant=self.spec.variant,
            client="train",
            split="rl",
            tokenizer_dir=str(self.job.init),
            **({"max_tokens": self.rl.max_tokens} if self.rl.max_tokens else {}),
        )

    # -- the steps -----------------------------------------------------------------------------------------------
    def run_steps(
        self,
        trainer: Any,
        done: int,
        metrics: list[dict[str, Any]],
        step_fn: StepFn,
        *,
        stop_after: int | None = None,
    ) -> int | None:
        """Steps done+1..steps; returns the last step when `stop_after` steps of this call ran first (a
        simulated kill), else None."""
        try:
            stopped = self._run_steps(trainer, done, metrics, step_fn, stop_after)
            self._note_writes(trainer, metrics, trainer.wait_saves)  # the last state is whole before anything reads it
            return stopped
        finally:
            try:  # a failed step still leaves its last save whole (the writer finishes it), then fails
                trainer.wait_saves()
            finally:
                self.tracker.close()

    def _note_writes(self, trainer: Any, metrics: list[dict[str, Any]], wait: Callable[[], Any] | None = None) -> None:
        """The seconds each save's folders took to write, in the rows of the steps that saved them (written beside
        the later steps, they are known later; `wait` first waits for the one still being written)."""
        if wait is not None:
            wait()
        rows = {row["step"]: row for row in metrics}
        for step, took in trainer.take_written().items():
            if step in rows:
                rows[step] |= {"checkpoint_write_s": took.get("checkpoint"), "state_write_s": took.get("state")}
        write_metrics(metrics, self.work / "metrics.parquet")

    def _run_steps(
        self, trainer: Any, done: int, metrics: list[dict[str, Any]], step_fn: StepFn, stop_after: int | None
    ) -> int | None:
        state_every = self.rl.state_every
        for ran, step in enumerate(range(done + 1, self.steps + 1), start=1):
            t_step = time.perf_counter()
            row = {"run": self.job.run, "seed": self.job.seed, "step": step, "backend": self.trainer}
            row |= step_fn(step, trainer)
            row["step_s"] = time.perf_counter() - t_step  # the step without its saves (save_s)
            row["finished_at"] = time.time()
            metrics.append(row)
            # Live before the state is saved: a kill between the two reruns this step, whose point the resumed
            # writer purges; logged after it, a kill in between would lose the step's point for good.
            self.tracker.log(row, step)
            # The saves are written in the background while the next steps roll out (Trainer.save): the step waits
            # only for the copies off the device and for a previous save still being written. A kill before the
            # state's folder is renamed into place resumes from the previous state.
            keep_state = step % state_every == 0 or step in self.ckpt_steps or step == self.steps
            row["save_s"] = trainer.save(
                checkpoint=self.work / "checkpoints" / f"step{step}" if step in self.ckpt_steps else None,
                state=self.state_dir if keep_state else None,
                extra={self.step_key: step, "metrics": metrics, "run": self.job.run},
                background=True,
                tag=step,
            )
            self.tracker.log({"save_s": row["save_s"]}, step)
            self._note_writes(trainer, metrics)
            log.info("%s seed %d step %d/%d: reward %s, loss %s, %.1f s", self.job.run, self.job.seed, step,
                     self.steps, row.get("reward_mean"), row.get("loss"), row["step_s"])
            if stop_after is not None and ran >= stop_after:
                return step
        return None

    def publish(self, metrics: list[dict[str, Any]]) -> None:
        """A finished run's outputs: each kept step's checkpoint linked to step<N>/, then metrics.parquet; then
        the resumable state goes unless ``rl.keep_state``."""
        self.tracker.close()  # a run resumed after its last step logs nothing more
        for step in sorted(self.ckpt_steps):
            src = self.work / "checkpoints" / f"step{step}"
            if not src.is_dir():
                raise FileNotFoundError(f"{src}: checkpoint of step {step} missing; delete {self.work} to rerun")
            _link_tree(src, self.job.out_dir / f"step{step}")
        write_metrics(metrics, self.job.out_dir / "metrics.parquet")
        mark_finished(self.work)  # a later run of this job (--forcerun, outputs removed) starts fresh
        if not self.rl.keep_state:
            for part in STATE_PARTS:
                shutil.rmtree(self.work / part, ignore_errors=True)


def _link_tree(src: Path, dst: Path) -> None:
    """dst = src by hard links (copy where links fail), replacing dst atomically."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, tmp, copy_function=link)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)


def load_tokenizer(model_dir: Path) -> Any:
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json (the policy's tokenizer is needed for label spans)")
    return Tokenizer.from_file(str(path))


# `predict rl` and `predict rft` (train/rl.py, train/rft.py): one run and seed with the local trainer the run's config
# names; the two commands differ only in their trainer.
def job_arguments(p: argparse.ArgumentParser, run_help: str, init_help: str) -> None:
    p.add_argument("--run", required=True, help=run_help)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--init", required=True, help=init_help)
    p.add_argument("--tasks-file", required=True, help="the rl split parquet")
    p.add_argument("--out-dir", required=True, help="results/rl/<run>/seed<seed>")
    p.add_argument("--base-url", default=None, help="roll out against this endpoint (no weight sync; tests)")


def job_main(args: argparse.Namespace, config: StageSettings, train: Callable[[RLJob, Any], dict[str, Any]]) -> int:
    from predict.outputs import print_summary

    if config.rl is None:
        raise ConfigError("config: no rl section" + (" (RFT takes its steps and checkpoints from it)"
                                                     if args.stage == "rft" else ""))
    if (trainer := resolve_run(config, args.run).trainer) != args.stage:
        raise ConfigError(f"run {args.run}: trainer {trainer}; run it with `predict {trainer}`")
    job = RLJob(run=args.run, seed=args.seed, init=Path(args.init), tasks=Path(args.tasks_file),
                out_dir=Path(args.out_dir), base_url=args.base_url,
                tracking=TrackingTargets.from_config(config))
    if not job.init.is_dir():
        raise FileNotFoundError(f"--init {job.init}: not a checkpoint folder")
    summary = train(job, config)
    print_summary(f"{args.stage.upper()}: {job.run}, seed {job.seed}", summary)
    return 0

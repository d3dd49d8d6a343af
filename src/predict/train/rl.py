"""`predict rl`: the local RL backend (CPU or one GPU). GRPO on rollouts from a running vLLM, weights synced in place.

One run = one (run, seed): ``run`` is an arm (``A``, ``B``) or an ablation of the predictive arm (config
``ablations:``, e.g. ``alpha0: {alpha: 0.0}``, ``forced_keep: {variant: forced_keep}``,
``budget_neutral: {variant: budget_neutral}``), each changing one factor of Arm B, or an RL extension (config
``extensions:`` with trainer ``rl``: ``test_cost``, ``variant: edit_on_revise``, ``mask_decision``; the run's
`predict.runs.RunSpec` carries them into the rollouts and the samples). Each step:

1. **rollout**: ``rl.tasks_per_step`` tasks of the rl split (a seeded shuffle per epoch), each ``rl.group_size``
   times, through the coding environment with the train client against the running vLLM server (token graph
   recorded); the step's records go to ``.work/rollouts/step{N}.parquet``;
2. **samples**: `predict.train.from_rollouts.build_samples` (GRPO advantages per task group; Arm B: sampled labels out of
   RL credit, CE-only samples with weight alpha on the verified labels);
3. **update**: one `Trainer.step` (the SFT trainer: packed micro-batches, chunked fused lm_head + `predict_loss`);
4. **sync**: the new weights loaded into the *running* server in place (pause, load, reset the prefix cache,
   resume; no restart), by the path ``rl.weight_sync`` picks (`predict.serving.weight_sync.resolve_mode`): ``memory`` (the
   default) hands them over without files (`VLLMServer.push_weights`: shared memory on the CPU, CUDA IPC on a
   GPU); ``folder`` writes them as an HF folder (``.work/policy``) and the server reloads it
   (`VLLMServer.reload_weights`). Either way the HF checkpoints are written only at ``rl.checkpoint_every`` steps
   (`predict.train.driver`), and a resumed run starts by writing ``.work/policy`` from its saved state and serving
   that (a fresh one serves its SFT folder), so a kill after a handoff and before the step's state is saved loses nothing: the resumed run's server
   holds the last saved weights again.

Around the steps (serving, resume, checkpoints, publishing, the metrics log, deleting the state once published)
the run follows `predict.train.driver`; the rollouts are kept in ``.work/rollouts/step{N}.parquet``. Metrics: one
row per step in the schema of `predict.train.step_metrics` (rollout counts and class counts from the step's records,
the update's loss terms and token counts, the RL and CE terms' gradient norms and cosine every
``rl.grad_terms_every`` steps (`predict.train.grad_terms`), sample building, the time split ``rollout_s``,
``samples_s``, ``update_s``, ``sync_s``).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predict.serving.weight_sync import WeightHandoff, resolve_mode
from predict.train.driver import SERVED_NAME, RLJob, TrainingRun, epoch_order, job_arguments, job_main, load_tokenizer
from predict.train.grad_terms import probe_step
from predict.train.step_metrics import GRAD_TERM_COLUMNS, METRIC_COLUMNS, rollout_metrics

if TYPE_CHECKING:
    from predict.stages import StageSettings

__all__ = ["SERVED_NAME", "RLJob", "run_rl", "step_tasks"]

log = logging.getLogger(__name__)


def step_tasks(rows: Sequence[Mapping[str, Any]], seed: int, step: int, per_step: int, group: int) -> list[dict]:
    """The task rows of step `step` (1-based), each repeated `group` times with sample 0..group-1. Tasks are taken in
    a per-epoch shuffle seeded by (seed, epoch), so a resumed run sees exactly the tasks it would have seen."""
    ordered = sorted(rows, key=lambda r: r["task_id"])
    if not ordered:
        raise ValueError("the rl split has no tasks")
    chosen = [dict(ordered[i]) for i in epoch_order(len(ordered), str(seed), step, per_step)]
    return [{**row, "sample": s} for row in chosen for s in range(group)]


@dataclass(frozen=True)
class WeightPush:
    """How a step's new weights reach the running server (``rl.weight_sync``, the module docstring's step 4): in
    memory through `handoff`, or written as an HF folder (`policy_dir`) that the server reloads."""

    handoff: WeightHandoff
    policy_dir: Path
    in_memory: bool

    def __call__(self, server: Any, trainer: Any, step: int, drain: bool) -> float:
        """The trainer's weights into the server as version `step` (draining its requests or not); the seconds it
        took."""
        t = time.perf_counter()
        if self.in_memory:
            server.push_weights(self.handoff.write(trainer.handoff_state()), version=str(step), drain=drain)
        else:
            trainer.save_checkpoint(self.policy_dir)
            server.reload_weights(self.policy_dir, version=str(step), drain=drain)
        return time.perf_counter() - t


def update_and_sync(run: TrainingRun, server: Any, trainer: Any, samples: Sequence[Any], step: int, *,
                    grad_terms_every: int, push: WeightPush) -> dict[str, Any]:
    """A step's update (one `Trainer.step`; a GPU server sleeps through it) and the new weights' sync into the
    server: the metric columns of its timings and loss terms. No samples: no update, and the server keeps its
    weights."""
    row: dict[str, Any] = {"sync_s": 0.0}
    t = time.perf_counter()
    if not samples:
        return row | {"update_s": time.perf_counter() - t, "updated": False}

    def sync(drain: bool) -> None:  # UpdateWindow.sync: drain the server's requests or not
        row["sync_s"] = push(server, trainer, step, drain)

    with run.update_window(server) as window:
        t_update = time.perf_counter()
        m = trainer.step(samples, grad_terms=probe_step(grad_terms_every, step))  # brings an offloaded state back
        row["update_s"] = time.perf_counter() - t_update
        if run.rl.offload_optimizer:  # off the device before the server wakes for the next rollout
            t_offload = time.perf_counter()
            trainer.offload_optimizer_state()
            row["offload_s"] = time.perf_counter() - t_offload
        if server is not None:
            window.sync(sync)
    if window.slept:  # the server's sleep and wake-ups (the sync and the offload inside the window are not theirs)
        row["sleep_s"] = time.perf_counter() - t - row["update_s"] - row["sync_s"] - row.get("offload_s", 0.0)
    row |= {k: m.get(k) for k in ("loss", "rl_loss", "ce_loss", "clip_frac", "grad_norm", "lr", *GRAD_TERM_COLUMNS)}
    row |= {k: int(m[k]) for k in ("n_rl_tokens", "n_ce_tokens", "n_samples", "n_tokens")}
    return row | {"updated": True}


def run_rl(
    job: RLJob, config: StageSettings | Mapping[str, Any], *, stop_after: int | None = None, server: Any | None = None
) -> dict[str, Any]:
    """Run (or resume) one RL run; returns a summary. `stop_after`: return after that many steps of *this call*
    (tests simulate a kill with it). `server`: a running `VLLMServer` (served as ``SERVED_NAME``, worker extension
    on) to share instead of starting one (`predict.train.driver`, rule 2; as `predict.train.learning_signal`'s runs do)."""
    from predict.data import load_split
    from predict.env.records import write_records
    from predict.env.runner import run_rollouts_sync
    from predict.train.from_rollouts import SampleSettings, build_samples
    from predict.train.loss import LossConfig

    run = TrainingRun(job, config, "rl")
    run.start()
    rl, spec = run.rl, run.spec
    group, per_step = rl.group_size, rl.tasks_per_step
    settings = SampleSettings(
        predictive=spec.predictive,
        alpha=spec.alpha,
        mask_decision=spec.mask_decision,
        skip_zero_advantage=rl.skip_zero_advantage,
    )
    loss = LossConfig(eps_low=rl.eps_low, eps_high=rl.eps_high, kl_coef=rl.kl_coef)
    trainer, done, metrics = run.open_trainer(loss_config=loss)
    tokenizer = load_tokenizer(job.init)
    rows = load_split(job.tasks)
    policy_dir = run.work / "policy"
    handoff = WeightHandoff(f"{job.run}-seed{job.seed}")
    push = WeightPush(handoff, policy_dir, in_memory=resolve_mode(rl.weight_sync) == "memory")

    def step_fn(step: int, trainer: Any) -> dict[str, Any]:
        row: dict[str, Any] = {}
        t = time.perf_counter()
        records = run_rollouts_sync(step_tasks(rows, job.seed, step, per_step, group),
                                    run.rollout_settings(srv, f"rl-{job.run}-step{step - 1}"))
        row["rollout_s"] = time.perf_counter() - t
        write_records(records, run.work / "rollouts" / f"step{step}.parquet")
        row |= rollout_metrics(records)

        t = time.perf_counter()
        samples, counts, _ = build_samples(records, tokenizer, settings)
        row["samples_s"] = time.perf_counter() - t
        row |= {k: v for k, v in asdict(counts).items() if k in METRIC_COLUMNS}  # the counts the schema declares
        row["n_ce_samples"] = sum(s.kind == "ce" for s in samples)
        return row | update_and_sync(run, srv, trainer, samples, step, grad_terms_every=rl.grad_terms_every, push=push)

    t0 = time.perf_counter()
    stopped, srv = None, None  # srv: the server step_fn rolls out against, set by run.serve below
    if done < run.steps:
        # A fresh run serves its SFT folder itself (the trainer's weights are those); a resumed one writes its saved
        # weights for the server first (the served copy: 8 GB and about 8 s at 4B that a fresh run need not spend).
        served = policy_dir if done else job.init
        if done:
            trainer.save_checkpoint(policy_dir)
        with handoff, run.serve(served, worker_extension=True, shared=server) as srv:
            stopped = run.run_steps(trainer, done, metrics, step_fn, stop_after=stop_after)
    if stopped is not None:
        return {"run": job.run, "seed": job.seed, "steps_done": stopped, "ran": stopped - done, "complete": False}
    run.publish(metrics)
    return {"run": job.run, "seed": job.seed, "steps_done": run.steps, "ran": run.steps - done,
            "resumed_from": done, "complete": True, "wall_s": time.perf_counter() - t0}


# `predict rl`
def arguments(p: argparse.ArgumentParser) -> None:
    job_arguments(p, run_help="an arm (A, B) or an ablation (alpha0, forced_keep, ...)",
                  init_help="starting checkpoint: the run's SFT folder")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    return job_main(args, config, run_rl)

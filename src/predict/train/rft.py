"""`predict rft`: rejection-sampling fine-tuning (RFT), the Self-RFT baseline of the extensions (issue #11, 4).

One run = one (run, seed) whose `predict.runs.RunSpec` has trainer ``rft`` (config ``extensions:``, e.g.
``rft_A: {base_arm: A, trainer: rft}``). It answers: does RL's gain over SFT need RL at all?

Rules:

1. **sample**: from the run's arm's SFT checkpoint (served by vLLM, never updated), roll out ``rft.group_size``
   (default ``rl.group_size``, G) rollouts of each of ``rft.tasks`` rl-split tasks (null = every task; a seeded
   choice otherwise), with the train client (token graph recorded) and the training rollouts' settings
   (``env.temperature``, ``rl.max_tokens``, the run's arm, variant and test cost). The records go to
   ``.work/rollouts.parquet.partial/`` as each finishes, then ``.work/rollouts.parquet`` (a killed run samples only
   the rollouts it had not persisted, and only when the run's fingerprint matches: `predict.train.driver`, rule 3).
2. **keep**: the rollouts with verified reward 1 (`predict.train.from_rollouts.rft_samples`): CE weight 1 on the tokens
   the model sampled, rl weight 0, token ids from the token graph (no re-tokenising). Nothing else (no advantage,
   no Arm B verified-label CE samples).
3. **fine-tune**: ``rl.steps`` optimizer steps (the RL run's number), each one `Trainer.step` on ``rft.batch_rollouts``
   kept rollouts (default ``rl.tasks_per_step * rl.group_size``: the RL step's batch), taken in a per-epoch shuffle
   seeded by the seed, at ``rft.lr`` (default ``rl.lr``). With no kept rollout a step does not update
   (``updated`` False) and the checkpoints equal the SFT weights.
4. **outputs**: exactly an RL run's: ``step{N}/`` HF checkpoints at `predict.runs.checkpoint_steps` and
   ``metrics.parquet`` (one row per step, the schema of `predict.train.step_metrics`), so evaluation, statistics and
   the report treat it like any run. Serving, resume, checkpoints, publishing and the state's deletion follow
   `predict.train.driver`, as `predict rl` does.

Metrics (per step): ``n_sampled``, ``n_kept`` (reward-1 rollouts), ``sample_pass_rate`` (= pass@G's per-rollout
pass rate of the SFT policy), ``n_batch_rollouts``, the update's ``loss``, ``ce_loss``, ``n_ce_tokens``,
``n_samples``, ``updated``, ``sample_s`` (once, on step 1), ``update_s``; the rollout columns (reward, class
counts) of the sampled rollouts on step 1 only, so a sum over steps counts each rollout once.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from predict.stages import StageSettings, stage_settings
from predict.train.driver import RLJob, TrainingRun, epoch_order, job_arguments, job_main
from predict.train.step_metrics import rollout_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EffectiveRFT:
    """The ``rft`` section as a run uses it: each key left null taken from ``rl`` (`rft_settings`)."""

    group_size: int
    tasks: int | None
    batch_rollouts: int
    lr: float


def rft_settings(config: StageSettings | Mapping[str, Any]) -> EffectiveRFT:
    """The effective ``rft`` section: G, tasks, batch (in rollouts) and lr, with the RL defaults filled in (a config
    without an ``rft`` section takes them all from ``rl``). `config`: the rft stage's typed object (a mapping is
    read through its row)."""
    view = config if isinstance(config, StageSettings) else stage_settings("rft", config)
    rl, rft = view.rl, view.rft
    return EffectiveRFT(
        group_size=(rft and rft.group_size) or rl.group_size,
        tasks=rft and rft.tasks,
        batch_rollouts=(rft and rft.batch_rollouts) or rl.tasks_per_step * rl.group_size,
        lr=(rft and rft.lr) or rl.lr,
    )


def rft_tasks(rows: Sequence[Mapping[str, Any]], seed: int, n_tasks: int | None, group: int) -> list[dict]:
    """The sampled task rows: `n_tasks` of the split (all when None; a seeded choice otherwise), each `group`
    times with sample 0..group-1."""
    ordered = sorted(rows, key=lambda r: r["task_id"])
    if not ordered:
        raise ValueError("the rl split has no tasks")
    if n_tasks is not None and n_tasks < len(ordered):
        ordered = sorted(random.Random(f"rft:{seed}").sample(ordered, n_tasks), key=lambda r: r["task_id"])
    return [{**row, "sample": s} for row in ordered for s in range(group)]


def step_batch(n_kept: int, seed: int, step: int, batch: int) -> list[int]:
    """Indices of the kept rollouts trained on at `step` (1-based): a per-epoch shuffle seeded by (seed, epoch)."""
    return epoch_order(n_kept, f"rft:{seed}", step, batch) if n_kept else []


def run_rft(job: RLJob, config: StageSettings | Mapping[str, Any], *, stop_after: int | None = None) -> dict[str, Any]:
    """Run (or resume) one RFT run; returns a summary."""
    from predict.data import load_split
    from predict.env.records import RECORD_SCHEMA, read_records
    from predict.env.runner import run_rollouts_sync
    from predict.outputs import ResumableParquet
    from predict.train.from_rollouts import rft_samples

    run = TrainingRun(job, config, "rft")
    run.start()
    rft = rft_settings(run.config)
    rollouts_path = run.work / "rollouts.parquet"
    sample_s = 0.0
    if not rollouts_path.exists():
        t = time.perf_counter()
        sink = ResumableParquet(rollouts_path, RECORD_SCHEMA, key=("task_id", "sample"))
        tasks = rft_tasks(load_split(job.tasks), job.seed, rft.tasks, rft.group_size)
        todo = [task for task in tasks if (task["task_id"], task["sample"]) not in sink.done()]
        if len(todo) < len(tasks):
            log.info("%s seed %d: %d of %d rollouts already sampled", job.run, job.seed, len(tasks) - len(todo),
                     len(tasks))
        if todo:  # each rollout is persisted as it finishes, so a killed run samples only the rest
            with run.serve(job.init) as srv:
                run_rollouts_sync(todo, run.rollout_settings(srv, f"rft-{job.run}-sft"),
                                  on_record=lambda record: sink.append([record]))
        sink.finish()
        sample_s = time.perf_counter() - t
    records = read_records(rollouts_path)
    kept = [s for s in map(rft_samples, records) if s]
    sampled = rollout_metrics(records)
    scored = [r for r in records if r.get("ok", True) and r.get("reward") is not None]
    pass_rate = sum(float(r["reward"]) == 1.0 for r in scored) / len(scored) if scored else None
    log.info("%s seed %d: %d of %d sampled rollouts kept (reward 1)", job.run, job.seed, len(kept), len(records))

    def step_fn(step: int, trainer: Any) -> dict[str, Any]:
        chosen = step_batch(len(kept), job.seed, step, rft.batch_rollouts)
        batch = [s for i in chosen for s in kept[i]]
        row: dict[str, Any] = {"n_sampled": len(records), "n_kept": len(kept), "sample_pass_rate": pass_rate,
                               "n_batch_rollouts": len(chosen), "sample_s": sample_s if step == 1 else 0.0}
        if step == 1:
            row |= sampled
        t = time.perf_counter()
        if batch:
            m = trainer.step(batch)
            row |= {k: m.get(k) for k in ("loss", "ce_loss", "grad_norm", "lr")}
            row |= {k: int(m[k]) for k in ("n_ce_tokens", "n_samples", "n_tokens")}
        row["updated"] = bool(batch)
        row["update_s"] = time.perf_counter() - t
        return row

    trainer, done, metrics = run.open_trainer(lr=rft.lr)
    stopped = run.run_steps(trainer, done, metrics, step_fn, stop_after=stop_after)
    if stopped is not None:
        return {"run": job.run, "seed": job.seed, "steps_done": stopped, "ran": stopped - done, "complete": False}
    run.publish(metrics)
    return {"run": job.run, "seed": job.seed, "steps_done": run.steps, "ran": run.steps - done, "complete": True,
            "n_sampled": len(records), "n_kept": len(kept)}


# `predict rft`
def arguments(p: argparse.ArgumentParser) -> None:
    job_arguments(p, run_help="an extension with trainer rft (rft_A, rft_B)",
                  init_help="the run's SFT folder (sampled from, fine-tuned)")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    return job_main(args, config, run_rft)

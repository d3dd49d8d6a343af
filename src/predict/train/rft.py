"""`predict rft`: rejection-sampling fine-tuning (RFT), the Self-RFT baseline of the extensions (issue #11, 4).

One run = one (run, seed) whose `predict.runs.RunSpec` has trainer ``rft`` (config ``extensions:``, e.g.
``rft_A: {base_arm: A, trainer: rft}``). It answers: does RL's gain over SFT need RL at all?

Rules:

1. **sample**: from the run's arm's SFT checkpoint (served by vLLM, never updated), roll out ``rft.group_size``
   (default ``rl.group_size``, G) rollouts of each of ``rft.tasks`` rl-split tasks (null = every task; a seeded
   choice otherwise), with the train client (token graph recorded) and the training rollouts' settings
   (``env.temperature``, ``rl.max_tokens``, the run's arm, variant and test cost). The records go to
   ``.work/rollouts.parquet.partial/`` as each finishes, then ``.work/rollouts.parquet`` (a killed run samples only
   the rollouts it had not persisted).
2. **keep**: the rollouts with verified reward 1 (`predict.train.samples.rft_samples`): CE weight 1 on the tokens
   the model sampled, rl weight 0, token ids from the token graph (no re-tokenising). Nothing else (no advantage,
   no Arm B verified-label CE samples).
3. **fine-tune**: ``rl.steps`` optimizer steps (the RL run's number), each one `Trainer.step` on ``rft.batch_rollouts``
   kept rollouts (default ``rl.tasks_per_step * rl.group_size``: the RL step's batch), taken in a per-epoch shuffle
   seeded by the seed, at ``rft.lr`` (default ``rl.lr``). With no kept rollout a step does not update
   (``updated`` False) and the checkpoints equal the SFT weights.
4. **outputs**: exactly an RL run's: ``step{N}/`` HF checkpoints at `predict.train.rl.checkpoint_steps` and
   ``metrics.parquet`` (one row per step), so evaluation, statistics and the report treat it like any run.

Resume: after each step the trainer state and metrics are saved to ``.work/state`` (as `predict rl` does). The
sampled rollouts and the state are resumed only when ``.work/fingerprint.json`` matches the run's config slice, init
checkpoint, task split and seed (`predict.fingerprint`); otherwise, or once the run was published, it starts fresh.

Metrics (per step): ``n_sampled``, ``n_kept`` (reward-1 rollouts), ``sample_pass_rate`` (= pass@G's per-rollout
pass rate of the SFT policy), ``n_batch_rollouts``, ``loss``, ``ce_loss``, ``n_ce_tokens``, ``n_samples``,
``updated``, ``sample_s`` (once, on step 1), ``update_s``, ``step_s``, ``finished_at``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from predict.fingerprint import mark_finished, run_fingerprint, start_or_resume
from predict.io import ResumableParquet, write_table
from predict.runs import resolve_run
from predict.train.rl import SERVED_NAME, WORK, RLJob, _metrics_table, checkpoint_steps, publish_run

log = logging.getLogger(__name__)


def rft_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The effective ``rft`` section: G, tasks, batch (in rollouts) and lr, with the RL defaults filled in."""
    rl, rft = dict(config["rl"]), dict(config.get("rft") or {})
    return {
        "group_size": int(rft.get("group_size") or rl["group_size"]),
        "tasks": rft.get("tasks"),
        "batch_rollouts": int(rft.get("batch_rollouts") or int(rl["tasks_per_step"]) * int(rl["group_size"])),
        "lr": float(rft.get("lr") or rl["lr"]),
    }


def rft_tasks(rows: Sequence[Mapping[str, Any]], seed: int, n_tasks: int | None, group: int) -> list[dict]:
    """The sampled task rows: `n_tasks` of the split (all when None; a seeded choice otherwise), each `group`
    times with sample 0..group-1."""
    ordered = sorted(rows, key=lambda r: r["task_id"])
    if not ordered:
        raise ValueError("the rl split has no tasks")
    if n_tasks is not None and n_tasks < len(ordered):
        ordered = sorted(random.Random(f"rft:{seed}").sample(ordered, n_tasks), key=lambda r: r["task_id"])
    return [{**dict(row), "sample": s} for row in ordered for s in range(group)]


def step_batch(n_kept: int, seed: int, step: int, batch: int) -> list[int]:
    """Indices of the kept rollouts trained on at `step` (1-based): a per-epoch shuffle seeded by (seed, epoch)."""
    if n_kept == 0:
        return []
    out = []
    for k in range((step - 1) * batch, step * batch):
        epoch, i = divmod(k, n_kept)
        perm = list(range(n_kept))
        random.Random(f"rft:{seed}:{epoch}").shuffle(perm)
        out.append(perm[i])
    return out


def run_rft(job: RLJob, config: Mapping[str, Any], *, stop_after: int | None = None) -> dict[str, Any]:
    """Run (or resume) one RFT run; returns a summary."""
    import contextlib

    import pyarrow.parquet as pq

    from predict.data import load_split
    from predict.env.records import RECORD_SCHEMA
    from predict.env.rollout import RolloutSettings, run_rollouts_sync
    from predict.serve import VLLMServer
    from predict.train.samples import SampleCounts, rft_samples
    from predict.train.trainer import Trainer

    spec = resolve_run(config, job.run)
    if spec.trainer != "rft":
        raise ValueError(f"run {job.run}: trainer {spec.trainer}, not rft (its stage is `predict {spec.trainer}`)")
    rl, rft = dict(config["rl"]), rft_settings(config)
    steps, ckpt_steps = int(rl["steps"]), set(checkpoint_steps(rl))
    work = job.out_dir / WORK
    state_dir, rollouts_path = work / "state", work / "rollouts.parquet"

    fp = run_fingerprint(config, "rft", spec=spec, init=job.init, tasks=job.tasks, seed=job.seed)
    resumable = start_or_resume(work, fp, what=f"RFT {job.run} seed {job.seed}")  # else .work is emptied
    sample_s = 0.0
    if not rollouts_path.exists():
        sink = ResumableParquet(rollouts_path, RECORD_SCHEMA, key=("task_id", "sample"))
        tasks = rft_tasks(load_split(job.tasks), job.seed, rft["tasks"], rft["group_size"])
        todo = [t for t in tasks if (t["task_id"], t["sample"]) not in sink.done()]
        if len(todo) < len(tasks):
            log.info("%s seed %d: %d of %d rollouts already sampled", job.run, job.seed, len(tasks) - len(todo),
                     len(tasks))  # fmt: skip
        serving = config["serving"]
        server = (
            contextlib.nullcontext(None)
            if job.base_url
            else VLLMServer(
                job.init,
                python=serving.get("python"),
                device=serving["device"],
                served_model_name=SERVED_NAME,
                max_model_len=serving.get("max_model_len", 4096),
                startup_timeout_s=serving.get("startup_timeout_s", 300),
                log_path=work / "vllm.log",
            )
        )
        t = time.perf_counter()
        with server if todo else contextlib.nullcontext(None) as srv:
            rollout = RolloutSettings.from_study_config(
                spec.env(config),
                arm=spec.arm,
                seed=job.seed,
                checkpoint=f"rft-{job.run}-sft",
                base_url=job.base_url or (srv.base_url if srv is not None else ""),
                model=SERVED_NAME if srv is not None else str(job.init),
                variant=spec.variant,
                client="train",
                split="rl",
                tokenizer_dir=str(job.init),
                **({"max_tokens": int(rl["max_tokens"])} if rl.get("max_tokens") else {}),
            )
            if todo:  # each rollout is persisted as it finishes, so a killed run samples only the rest
                run_rollouts_sync(todo, rollout, on_record=lambda record: sink.append([record]))
        sink.finish()
        sample_s = time.perf_counter() - t
    records = pq.read_table(rollouts_path).to_pylist()
    counts = SampleCounts()
    kept = [s for s in (rft_samples(r, counts) for r in records) if s]
    n_sampled = len(records)
    scored = [r for r in records if r.get("ok", True) and r.get("reward") is not None]
    pass_rate = sum(float(r["reward"]) == 1.0 for r in scored) / len(scored) if scored else None
    log.info("%s seed %d: %d of %d sampled rollouts kept (reward 1)", job.run, job.seed, len(kept), n_sampled)

    kwargs: dict[str, Any] = {
        "lr": rft["lr"],
        "weight_decay": float(rl.get("weight_decay", 0.0)),
        "grad_clip": float(rl.get("grad_clip", 1.0)),
        "dtype": rl.get("dtype", "auto"),
        "micro_batch_tokens": int(rl.get("micro_batch_tokens", 8192)),
        "seed": job.seed,
    }
    if resumable and Trainer.read_state_info(state_dir) is not None:
        trainer = Trainer.resume(state_dir)
        extra = dict(getattr(trainer, "state_extra", {}) or {})
        done, metrics = int(extra.get("rft_step", 0)), list(extra.get("metrics", []))
    else:
        trainer, done, metrics = Trainer(job.init, **kwargs), 0, []
    ran = 0
    for step in range(done + 1, steps + 1):
        t_step = time.perf_counter()
        chosen = step_batch(len(kept), job.seed, step, rft["batch_rollouts"])
        batch = [s for i in chosen for s in kept[i]]
        row: dict[str, Any] = {
            "run": job.run, "seed": job.seed, "step": step, "n_sampled": n_sampled, "n_kept": len(kept),
            "sample_pass_rate": pass_rate, "n_batch_rollouts": len(chosen),
            "sample_s": sample_s if step == 1 else 0.0,
        }  # fmt: skip
        t = time.perf_counter()
        if batch:
            m = trainer.step(batch)
            row |= {k: m.get(k) for k in ("loss", "ce_loss", "grad_norm", "lr")}
            row |= {k: int(m[k]) for k in ("n_ce_tokens", "n_samples", "n_tokens")}
        row["updated"] = bool(batch)
        row["update_s"] = time.perf_counter() - t
        if step in ckpt_steps:
            trainer.save_checkpoint(work / "checkpoints" / f"step{step}")
        row["step_s"] = time.perf_counter() - t_step
        row["finished_at"] = time.time()
        metrics.append(row)
        trainer.save_state(state_dir, extra={"rft_step": step, "metrics": metrics, "run": job.run})
        write_table(_metrics_table(metrics), work / "metrics.parquet")
        ran += 1
        if stop_after is not None and ran >= stop_after:
            return {"run": job.run, "seed": job.seed, "steps_done": step, "ran": ran, "complete": False}
    publish_run(work, job.out_dir, ckpt_steps, metrics)
    mark_finished(work)  # a later run of this job (--forcerun, outputs removed) samples and trains again
    return {"run": job.run, "seed": job.seed, "steps_done": steps, "ran": ran, "complete": True,
            "n_sampled": n_sampled, "n_kept": len(kept)}  # fmt: skip

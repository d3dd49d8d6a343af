"""`predict rl`: the local RL backend (CPU or one GPU). GRPO on rollouts from a running vLLM, weights synced in place.

One run = one (run, seed): ``run`` is an arm (``A``, ``B``) or an ablation of the predictive arm (config
``ablations:``, e.g. ``alpha0: {alpha: 0.0}``, ``forced_keep: {variant: forced_keep}``,
``budget_neutral: {variant: budget_neutral}``), each changing one factor of Arm B, or an RL extension (config
``extensions:`` with trainer ``rl``: ``test_cost``, ``variant: edit_on_revise``, ``mask_decision``; the run's
`predict.runs.RunSpec` carries them into the rollouts and the samples). Each step:

1. **rollout**: ``rl.tasks_per_step`` tasks of the rl split (a seeded shuffle per epoch), each ``rl.group_size``
   times, through the coding environment with the train client against the running vLLM server (token graph
   recorded); the step's records go to ``.work/rollouts/step{N}.parquet``;
2. **samples**: `predict.train.samples.build_samples` (GRPO advantages per task group; Arm B: sampled labels out of
   RL credit, CE-only samples with weight alpha on the verified labels);
3. **update**: one `Trainer.step` (the SFT trainer: packed micro-batches, chunked fused lm_head + `predict_loss`);
4. **sync**: the new weights as an HF folder (``.work/policy``) loaded into the *running* server
   (`VLLMServer.reload_weights`: pause, reload in place, reset the prefix cache, resume); no restart.

State and resume: after every ``rl.state_every`` steps (and at checkpoint steps) the trainer state (weights,
AdamW, RNG) and the metrics so far are saved atomically to ``.work/state``; a killed run restarts from there,
never from step 0, and only when ``.work/fingerprint.json`` says the state was made from the same config slice,
init checkpoint, task split and seed (`predict.fingerprint`; otherwise ``.work`` is emptied and the run starts
fresh, as it does once a published run is asked for again). Step checkpoints (HF) are written to
``.work/checkpoints/step{N}`` as they come and hard-linked to ``step{N}/`` when the run completes, so Snakemake's
clean-up of an incomplete job's outputs never deletes them.

Metrics (`metrics.parquet`, one row per step) and what they answer:

* reward / pass rate: ``reward_mean``, ``pass_rate`` (rollouts with a reward), ``n_rollouts``, ``n_failed``;
* loss terms: ``loss``, ``rl_loss``, ``ce_loss``, ``clip_frac``, ``grad_norm``, ``n_rl_tokens``, ``n_ce_tokens``,
  ``n_samples``, ``n_ce_samples`` (``updated`` is False when a step had no sample to learn from);
* calibration: ``pred_freq_<CLASS>`` (share of predicted patches predicted CLASS, MALFORMED included) next to
  ``verified_freq_<CLASS>`` (share of applied patches whose verified outcome, seen or shadow, is CLASS);
  ``prediction_accuracy``; ``revise_rate`` (effective REVISE per prediction); ``budget_exhausted_rate``;
* sample building: ``unaligned``, ``malformed_no_label``, ``masked_labels``, ``merged_calls`` ...;
* time split: ``rollout_s``, ``samples_s``, ``update_s``, ``sync_s``, ``save_s``, ``step_s``; ``finished_at`` (unix
  time; a resumed run's earlier rows keep theirs).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from predict.env.protocol import MALFORMED, PREDICTION_CLASSES
from predict.fingerprint import mark_finished, run_fingerprint, start_or_resume
from predict.io import write_table
from predict.outcomes import OUTCOMES
from predict.runs import resolve_run

log = logging.getLogger(__name__)

WORK = ".work"
SERVED_NAME = "policy"


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------
def checkpoint_steps(rl: Mapping[str, Any]) -> list[int]:
    """Steps whose weights are kept as HF checkpoints: every ``checkpoint_every`` steps and the last one."""
    steps, every = int(rl["steps"]), int(rl["checkpoint_every"])
    return sorted({*range(every, steps + 1, every), steps})


def step_tasks(rows: Sequence[Mapping[str, Any]], seed: int, step: int, per_step: int, group: int) -> list[dict]:
    """The task rows of step `step` (1-based), each repeated `group` times with sample 0..group-1. Tasks are taken in
    a per-epoch shuffle seeded by (seed, epoch), so a resumed run sees exactly the tasks it would have seen."""
    ordered = sorted(rows, key=lambda r: r["task_id"])
    n = len(ordered)
    if n == 0:
        raise ValueError("the rl split has no tasks")
    chosen: list[dict] = []
    for k in range((step - 1) * per_step, step * per_step):
        epoch, i = divmod(k, n)
        perm = list(range(n))
        random.Random(f"{seed}:{epoch}").shuffle(perm)
        chosen.append(dict(ordered[perm[i]]))
    return [{**row, "sample": s} for row in chosen for s in range(group)]


# ---------------------------------------------------------------------------------------------------------------
# Metrics of one step's rollouts
# ---------------------------------------------------------------------------------------------------------------
def _share(values: Sequence[Any], value: Any) -> float | None:
    return sum(v == value for v in values) / len(values) if values else None


def rollout_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Reward, pass rate, predicted vs verified class frequencies, REVISE rate, budget exhaustion."""
    scored = [r for r in records if r.get("ok") and r.get("reward") is not None]
    patches = [s for r in scored for s in r.get("steps") or [] if s["action"] == "apply_patch" and s["applied"]]
    predicted = [s for s in patches if s.get("prediction") is not None]
    verified = [s["outcome"] for s in patches if s.get("outcome") is not None]
    out: dict[str, Any] = {
        "n_rollouts": len(records),
        "n_failed": len(records) - len(scored),
        "reward_mean": sum(r["reward"] for r in scored) / len(scored) if scored else None,
        "pass_rate": _share([bool(r.get("final_pass")) for r in scored], True),
        "budget_exhausted_rate": _share([bool(r.get("budget_exhausted")) for r in scored], True),
        "n_patches": len(patches),
        "n_predictions": len(predicted),
        "revise_rate": _share([s.get("decision") for s in predicted], "REVISE"),
        "prediction_accuracy": _share([s["prediction"] == s.get("outcome") for s in predicted], True),
    }
    for cls in (*PREDICTION_CLASSES, MALFORMED):
        out[f"pred_freq_{cls}"] = _share([s["prediction"] for s in predicted], cls)
    for cls in OUTCOMES:
        out[f"verified_freq_{cls}"] = _share(verified, cls)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RLJob:
    run: str
    seed: int
    init: Path
    """The run's starting checkpoint (its arm's SFT folder)."""
    tasks: Path
    """The rl split parquet."""
    out_dir: Path
    """results/rl/{run}/seed{seed}: step{N}/ checkpoints, metrics.parquet, .work/."""
    base_url: str | None = None
    """Roll out against this running endpoint instead of starting vLLM (no weight sync then: tests only)."""


def publish_run(work: Path, out_dir: Path, ckpt_steps: set[int] | Sequence[int], metrics: list[dict]) -> None:
    """A finished run's outputs: each kept step's checkpoint linked from the work folder to step<N>/, then
    metrics.parquet (RL and RFT alike)."""
    for step in sorted(ckpt_steps):
        src = work / "checkpoints" / f"step{step}"
        if not src.is_dir():
            raise FileNotFoundError(f"{src}: checkpoint of step {step} missing; delete {work} to rerun from step 0")
        _link_tree(src, out_dir / f"step{step}")
    write_table(_metrics_table(metrics), out_dir / "metrics.parquet")


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


def _load_tokenizer(model_dir: Path) -> Any:
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json (the policy's tokenizer is needed for label spans)")
    return Tokenizer.from_file(str(path))


def _metrics_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    if not rows:
        return pa.table({"step": pa.array([], pa.int64())})
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows])


def run_rl(
    job: RLJob, config: Mapping[str, Any], *, stop_after: int | None = None, server: Any | None = None
) -> dict[str, Any]:
    """Run (or resume) one RL run; returns a summary. `stop_after`: return after that many steps of *this call*
    (tests simulate a kill with it). `server`: a running `VLLMServer` (served as ``SERVED_NAME``, worker extension
    on) to use instead of starting one; the run first loads its own starting weights into it, then syncs as usual,
    so several runs can share one server one after another (`predict.signal` does: a start-up per run would cost
    more than the runs)."""
    import contextlib

    from predict.data import load_split
    from predict.env.records import write_records
    from predict.env.rollout import RolloutSettings, run_rollouts_sync
    from predict.serve import VLLMServer
    from predict.train.loss import LossConfig
    from predict.train.samples import SampleSettings, build_samples
    from predict.train.trainer import Trainer

    spec = resolve_run(config, job.run)
    if spec.trainer != "rl":
        raise ValueError(f"run {job.run}: trainer {spec.trainer}, not rl (its stage is `predict {spec.trainer}`)")
    rl = dict(config["rl"])
    steps, group, per_step = int(rl["steps"]), int(rl["group_size"]), int(rl["tasks_per_step"])
    ckpt_steps = set(checkpoint_steps(rl))
    state_every = int(rl.get("state_every", 1))
    work = job.out_dir / WORK
    state_dir, policy_dir = work / "state", work / "policy"
    settings = SampleSettings(
        predictive=spec.predictive,
        alpha=spec.alpha,
        mask_decision=spec.mask_decision,
        skip_zero_advantage=bool(rl.get("skip_zero_advantage", False)),
    )
    trainer_kwargs: dict[str, Any] = {
        "lr": float(rl["lr"]),
        "weight_decay": float(rl.get("weight_decay", 0.0)),
        "grad_clip": float(rl.get("grad_clip", 1.0)),
        "dtype": rl.get("dtype", "auto"),
        "micro_batch_tokens": int(rl.get("micro_batch_tokens", 8192)),
        "seed": job.seed,
        "loss_config": LossConfig(
            eps_low=float(rl.get("eps_low", 0.2)),
            eps_high=float(rl.get("eps_high", 0.2)),
            kl_coef=float(rl.get("kl_coef", 0.0)),
        ),
    }
    fp = run_fingerprint(config, "rl", spec=spec, init=job.init, tasks=job.tasks, seed=job.seed)
    resumable = start_or_resume(work, fp, what=f"RL {job.run} seed {job.seed}")  # else .work is emptied
    if resumable and Trainer.read_state_info(state_dir) is not None:
        trainer = Trainer.resume(state_dir)
        extra = dict(getattr(trainer, "state_extra", {}) or {})
        done, metrics = int(extra.get("rl_step", 0)), list(extra.get("metrics", []))
        log.info("resuming %s seed %d from step %d (%s)", job.run, job.seed, done, state_dir)
    else:
        trainer = Trainer(job.init, **trainer_kwargs)
        done, metrics = 0, []
    tokenizer = _load_tokenizer(job.init)
    rows = load_split(job.tasks)
    serving = config["serving"]

    t0 = time.perf_counter()
    ran = 0
    if done < steps:
        trainer.save_checkpoint(policy_dir)
        extra_args: list[str] = []
        if serving["device"] == "gpu" and rl.get("server_gpu_memory_utilization"):
            extra_args += ["--gpu-memory-utilization", str(rl["server_gpu_memory_utilization"])]
        if server is not None:
            server.reload_weights(policy_dir, version="0")  # the shared server holds the previous run's weights
        serving_ctx = (
            contextlib.nullcontext(server)
            if server is not None
            else contextlib.nullcontext(None)
            if job.base_url
            else VLLMServer(
                policy_dir,
                python=serving.get("python"),
                device=serving["device"],
                served_model_name=SERVED_NAME,
                max_model_len=serving.get("max_model_len", 4096),
                startup_timeout_s=serving.get("startup_timeout_s", 300),
                worker_extension=True,
                extra_args=extra_args,
                log_path=work / "vllm.log",
            )
        )
        with serving_ctx as srv:
            base_url = job.base_url or srv.base_url
            for step in range(done + 1, steps + 1):
                row: dict[str, Any] = {"run": job.run, "seed": job.seed, "step": step}
                t_step = time.perf_counter()
                rollout = RolloutSettings.from_study_config(
                    spec.env(config),
                    arm=spec.arm,
                    seed=job.seed,
                    checkpoint=f"rl-{job.run}-step{step - 1}",
                    base_url=base_url,
                    model=SERVED_NAME if srv is not None else str(job.init),
                    variant=spec.variant,
                    client="train",
                    split="rl",
                    tokenizer_dir=str(job.init),
                    **({"max_tokens": int(rl["max_tokens"])} if rl.get("max_tokens") else {}),
                )
                t = time.perf_counter()
                records = run_rollouts_sync(step_tasks(rows, job.seed, step, per_step, group), rollout)
                row["rollout_s"] = time.perf_counter() - t
                write_records(records, work / "rollouts" / f"step{step}.parquet")
                row |= rollout_metrics(records)

                t = time.perf_counter()
                samples, counts, _ = build_samples(records, tokenizer, settings)
                row["samples_s"] = time.perf_counter() - t
                row |= counts.to_dict()
                row["n_ce_samples"] = sum(s.kind == "ce" for s in samples)

                t = time.perf_counter()
                if samples:
                    m = trainer.step(samples)
                    row |= {k: m.get(k) for k in ("loss", "rl_loss", "ce_loss", "clip_frac", "grad_norm", "lr")}
                    row |= {k: int(m[k]) for k in ("n_rl_tokens", "n_ce_tokens", "n_samples", "n_tokens")}
                row["updated"] = bool(samples)
                row["update_s"] = time.perf_counter() - t

                t = time.perf_counter()
                if samples and srv is not None:
                    trainer.save_checkpoint(policy_dir)
                    srv.reload_weights(policy_dir, version=str(step))
                row["sync_s"] = time.perf_counter() - t

                t = time.perf_counter()
                if step in ckpt_steps:
                    trainer.save_checkpoint(work / "checkpoints" / f"step{step}")
                row["step_s"] = time.perf_counter() - t_step
                row["finished_at"] = time.time()
                metrics.append(row)
                if step % state_every == 0 or step in ckpt_steps or step == steps:
                    trainer.save_state(state_dir, extra={"rl_step": step, "metrics": metrics, "run": job.run})
                row["save_s"] = time.perf_counter() - t
                write_table(_metrics_table(metrics), work / "metrics.parquet")
                log.info(
                    "%s seed %d step %d/%d: reward %.3f, loss %s, %.1f s (rollout %.1f, update %.1f, sync %.1f)",
                    job.run, job.seed, step, steps, row["reward_mean"] or 0.0, row.get("loss"), row["step_s"],
                    row["rollout_s"], row["update_s"], row["sync_s"],
                )  # fmt: skip
                ran += 1
                if stop_after is not None and ran >= stop_after:
                    return {"run": job.run, "seed": job.seed, "steps_done": step, "ran": ran, "complete": False}
    publish_run(work, job.out_dir, ckpt_steps, metrics)
    mark_finished(work)  # a later run of this job (--forcerun, outputs removed) trains again
    return {
        "run": job.run,
        "seed": job.seed,
        "steps_done": steps,
        "ran": ran,
        "resumed_from": done,
        "complete": True,
        "wall_s": time.perf_counter() - t0,
    }

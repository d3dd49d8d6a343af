"""SFT: render traces through the real Qwen3 chat template, then train the base model on assistant tokens only.

Rendering (`render_messages`), the rules:

* A trace is a list of messages: system, user (task), assistant, user (tool result), ..., assistant (FINAL).
* Loss only on what the model writes: each assistant turn's content tokens + its ``<|im_end|>``. The system prompt,
  the task, the tool results and every template token (``<|im_start|>assistant\\n``, the ``\\n`` after
  ``<|im_end|>``) carry no loss.
* Every trained assistant turn sits after exactly the prompt the model sees at inference: the ids are built
  incrementally, ``apply_chat_template(messages[:i], add_generation_prompt=True)`` then the turn's content +
  ``<|im_end|>``; each such prompt must extend the ids so far (checked), so the whole sample is one sequence. This
  sidesteps the Qwen3 template quirk that renders the last assistant turn after the last user message with a
  ``<think>\\n\\n</think>\\n\\n`` prefix when the whole conversation is rendered at once, which the model never sees
  at generation time (``enable_thinking`` true: the generation prompt is ``<|im_start|>assistant\\n``; see model.enable_thinking in config/schema.yaml).
* The content is tokenized on its own (``tokenizer.encode``), which is what the model emits after the generation
  prompt; for every non-final turn the ids equal the whole-conversation rendering (tested).

Training (`run_sft`): epochs over the rendered samples, shuffled per epoch with ``(seed, epoch)``, grouped into
optimizer steps of at most ``batch_tokens`` tokens; linear warm-up then cosine (or constant) learning rate; one
`Trainer.step` per step. The trainer state is saved every ``save_every`` steps (``state_dir/trainer``, and the
per-step metrics with it), so a killed run resumes from its last saved state, and only from state made from the
same traces, base model and ``sft`` settings (``state_dir/fingerprint.json``, `predict.fingerprint`); at the end
the HF checkpoint is written atomically, the metrics parquet next to it, and the state folder removed.

Metrics parquet: `METRICS_SCHEMA`, a row per step (loss = ce_loss for SFT); each row also goes to the job's
trackers as its step ends (``tracking``, `predict.train.tracking`: TensorBoard under ``sft/{arm}``), started before
the first step at the step the run resumes from.
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from predict.config import config_default
from predict.config.models import SFTSettings
from predict.fingerprint import RESUME_KEYS, fingerprint, start_or_resume
from predict.outputs import write_rows
from predict.train.sample import TrainSample
from predict.train.tracking import RunTracker, TrackingTargets

if TYPE_CHECKING:
    from predict.stages import StageSettings
    from predict.train.trainer import Trainer

log = logging.getLogger(__name__)

IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant")

METRICS_SCHEMA = pa.schema(
    [
        ("arm", pa.string()),
        ("step", pa.int64()),
        ("epoch", pa.int64()),
        ("loss", pa.float64()),
        ("ce_loss", pa.float64()),
        ("lr", pa.float64()),
        ("grad_norm", pa.float64()),
        ("n_samples", pa.int64()),
        ("n_tokens", pa.int64()),
        ("n_ce_tokens", pa.int64()),
        ("time_s", pa.float64()),
        ("tokens_per_s", pa.float64()),
    ]
)


class TraceError(ValueError):
    """A trace cannot be rendered (bad roles or order, or a template that does not extend the previous prompt)."""


def _ids(x: Any) -> list[int]:
    if isinstance(x, Mapping):
        x = x["input_ids"]
    return list(x)


def render_messages(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    enable_thinking: bool,
    task_id: int | None = None,
    source: str | None = None,
) -> TrainSample:
    """One SFT `TrainSample` (ce weight 1.0 on assistant content + <|im_end|>) from one trace's messages."""
    where = source or (f"task {task_id}" if task_id is not None else "trace")
    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    if not msgs or msgs[0]["role"] != "system":
        raise TraceError(f"{where}: the first message must be the system prompt")
    bad = [i for i, m in enumerate(msgs) if m["role"] not in ROLES]
    if bad:
        raise TraceError(f"{where}: message {bad[0]} has role {msgs[bad[0]]['role']!r} (expected one of {ROLES})")
    if msgs[-1]["role"] != "assistant":
        raise TraceError(f"{where}: the last message must be the assistant's (FINAL)")
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    ids: list[int] = []
    weights: list[float] = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if msgs[i - 1]["role"] != "user":
            raise TraceError(f"{where}: assistant message {i} does not follow a user message")
        prompt = _ids(
            tokenizer.apply_chat_template(
                msgs[:i], add_generation_prompt=True, tokenize=True, enable_thinking=enable_thinking, return_dict=False
            )
        )
        if prompt[: len(ids)] != ids:
            raise TraceError(f"{where}: the prompt before message {i} does not extend the rendering so far")
        new = prompt[len(ids) :]
        ids += new
        weights += [0.0] * len(new)
        content = tokenizer.encode(m["content"], add_special_tokens=False) + [im_end]
        ids += content
        weights += [1.0] * len(content)
    return TrainSample.ce_only(ids, weights, "sft", task_id=task_id, source=source)


def load_tokenizer(model_dir: str | Path | None = None) -> Any:
    from transformers import AutoTokenizer

    if model_dir is None:
        from predict.tiny_model import tokenizer_dir

        model_dir = tokenizer_dir()
    return AutoTokenizer.from_pretrained(str(model_dir))


def render_traces(path: str | Path, tokenizer: Any, *, enable_thinking: bool) -> list[TrainSample]:
    """Every row of a traces parquet (``messages`` + ``task_id``) rendered into an SFT sample."""
    table = pq.read_table(path)
    if "messages" not in table.column_names:
        raise TraceError(f"{path}: no 'messages' column (has {', '.join(table.column_names)})")
    rows = table.to_pylist()
    out = []
    for r, row in enumerate(rows):
        tid = row.get("task_id")
        try:
            out.append(
                render_messages(
                    row["messages"], tokenizer, enable_thinking=enable_thinking, task_id=tid, source=f"{path} row {r}"
                )
            )
        except (KeyError, TypeError) as e:
            raise TraceError(f"{path} row {r} (task {tid}): malformed messages: {e}") from None
    return out


# --------------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SFTConfig:
    """The `sft` section as the trainer uses it; a key a caller leaves out takes its config default (the model)."""

    lr: float
    epochs: int
    batch_tokens: int
    warmup_steps: int = config_default(SFTSettings, "warmup_steps")
    lr_schedule: str = config_default(SFTSettings, "lr_schedule")
    min_lr_ratio: float = config_default(SFTSettings, "min_lr_ratio")
    weight_decay: float = config_default(SFTSettings, "weight_decay")
    grad_clip: float = config_default(SFTSettings, "grad_clip")
    save_every: int = config_default(SFTSettings, "save_every")
    seed: int = config_default(SFTSettings, "seed")
    device: str = config_default(SFTSettings, "device")
    dtype: str = config_default(SFTSettings, "dtype")
    micro_batch_tokens: int = config_default(SFTSettings, "micro_batch_tokens")
    max_seq_len: int | None = config_default(SFTSettings, "max_seq_len")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> SFTConfig:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in section.items() if k in names})


def plan_steps(lengths: Sequence[int], cfg: SFTConfig) -> list[tuple[int, list[int]]]:
    """(epoch, sample indices) of every optimizer step: a seeded shuffle per epoch, steps of <= batch_tokens."""
    from predict.train.trainer import pack_micro_batches

    steps: list[tuple[int, list[int]]] = []
    for epoch in range(cfg.epochs):
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(lengths)).tolist()
        batches = pack_micro_batches([lengths[i] for i in order], cfg.batch_tokens)
        steps += [(epoch, [order[j] for j in batch]) for batch in batches]
    return steps


def lr_at(step: int, total: int, cfg: SFTConfig) -> float:
    """Learning rate of 0-based step ``step`` of ``total``: linear warm-up, then cosine to min_lr_ratio * lr."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(total - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def run_sft(
    *,
    traces: str | Path,
    base_model: str | Path,
    out_dir: str | Path,
    metrics_out: str | Path,
    state_dir: str | Path,
    cfg: SFTConfig,
    arm: str,
    enable_thinking: bool,
    max_steps: int | None = None,
    progress: bool = True,
    threads: int | None = None,
    tracking: TrackingTargets | None = None,
    tracking_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train, resuming from ``state_dir`` when it holds a saved state; write the checkpoint and metrics.

    ``threads``: torch's intra-op threads, the cores the job was given (the rule's ``threads:``); torch's default
    (every core of the machine) oversubscribes the cores when both arms train side by side. ``tracking``: where
    each step's row goes live (None: only the metrics parquet), ``tracking_config`` the W&B run's config.
    """
    import torch

    from predict.train.trainer import Trainer

    if threads:
        torch.set_num_threads(threads)

    tokenizer = load_tokenizer(base_model)
    samples = _training_samples(traces, tokenizer, cfg, enable_thinking=enable_thinking)
    steps = plan_steps([len(s.token_ids) for s in samples], cfg)
    total = len(steps) if max_steps is None else min(len(steps), max_steps)
    state_dir = Path(state_dir)
    trainer_dir = state_dir / "trainer"
    fp = fingerprint({"sft": asdict(cfg), "model": {"enable_thinking": enable_thinking}}, RESUME_KEYS["sft"],
                     inputs={"traces": traces, "base_model": base_model}, seed=cfg.seed,
                     extra={"arm": arm, "max_steps": max_steps})
    saved = Trainer.read_state_info(trainer_dir) if start_or_resume(state_dir, fp, what=f"SFT arm {arm}") else None
    _check_disk(base_model, out_dir, trainer_dir, cfg, total, saved["step"] if saved else 0, arm)
    trainer, rows = _start_trainer(base_model, state_dir, cfg, resume=saved is not None)
    if saved is not None:
        log.info("resuming SFT from %s at step %d of %d", state_dir, trainer.step_count, total)

    tracker = RunTracker(tracking, stage="sft", run=arm, config=tracking_config,
                         id_file=state_dir / "wandb-id").start(trainer.step_count)

    def save_state() -> None:  # written beside the next steps (Trainer.save); a resume drops rows past its step
        trainer.save(state=trainer_dir, background=True)
        write_rows(rows, METRICS_SCHEMA, state_dir / "metrics.parquet")

    with _progress(progress) as bar, tracker:
        task = bar.add_task(f"SFT arm {arm}", total=total, completed=trainer.step_count)
        while trainer.step_count < total:
            k = trainer.step_count
            epoch, idx = steps[k]
            m = trainer.step([samples[i] for i in idx], lr=lr_at(k, total, cfg))
            rows.append(_step_row(arm, trainer.step_count, epoch, m))
            tracker.log(rows[-1], trainer.step_count)
            bar.update(task, completed=trainer.step_count, description=f"SFT arm {arm} loss {m['loss']:.3f}")
            if not bar.console.is_terminal:  # a log file: one line per step instead of a bar
                r = rows[-1]
                log.info("step %d/%d epoch %d loss %.4f lr %.2e grad_norm %.3f %.0f tok/s", r["step"], total, epoch,
                         r["loss"], r["lr"], r["grad_norm"], r["tokens_per_s"])
            if cfg.save_every and trainer.step_count % cfg.save_every == 0 and trainer.step_count < total:
                save_state()
    trainer.save_checkpoint(out_dir)
    write_rows(rows, METRICS_SCHEMA, metrics_out)
    shutil.rmtree(state_dir, ignore_errors=True)
    return _summary(samples, rows, total, cfg)


def _training_samples(traces: str | Path, tokenizer: Any, cfg: SFTConfig, *, enable_thinking: bool) -> list[TrainSample]:
    """The traces rendered for training, those longer than ``max_seq_len`` dropped (with a warning); an error when
    none is left."""
    samples = render_traces(traces, tokenizer, enable_thinking=enable_thinking)
    if cfg.max_seq_len:
        long = [s for s in samples if len(s.token_ids) > cfg.max_seq_len]
        if long:
            log.warning("dropping %d traces longer than max_seq_len %d tokens", len(long), cfg.max_seq_len)
        samples = [s for s in samples if len(s.token_ids) <= cfg.max_seq_len]
    if not samples:
        raise ValueError(f"{traces}: no trace to train on")
    return samples


def _start_trainer(base_model: str | Path, state_dir: Path, cfg: SFTConfig, *,
                   resume: bool) -> tuple[Trainer, list[dict[str, Any]]]:
    """The trainer and the metric rows so far: resumed from ``state_dir`` (its rows up to the saved step) or fresh
    from the base model with the `sft` section's optimizer settings."""
    from predict.train.trainer import Trainer

    if not resume:
        return Trainer(base_model, lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                       device=cfg.device, dtype=cfg.dtype, micro_batch_tokens=cfg.micro_batch_tokens,
                       seed=cfg.seed), []
    trainer = Trainer.resume(state_dir / "trainer", device=cfg.device)
    saved_rows = state_dir / "metrics.parquet"
    rows = pq.read_table(saved_rows).to_pylist() if saved_rows.is_file() else []
    return trainer, [r for r in rows if r["step"] <= trainer.step_count]


def _step_row(arm: str, step: int, epoch: int, m: Mapping[str, Any]) -> dict[str, Any]:
    """One optimizer step's metrics row (`METRICS_SCHEMA`) from the trainer's step metrics."""
    row = {"arm": arm, "step": step, "epoch": epoch}
    row |= {k: m[k] for k in ("loss", "ce_loss", "lr", "grad_norm", "time_s")}
    row |= {k: int(m[k]) for k in ("n_samples", "n_tokens", "n_ce_tokens")}
    return row | {"tokens_per_s": m["n_tokens"] / max(m["time_s"], 1e-9)}


def _summary(samples: Sequence[TrainSample], rows: Sequence[Mapping[str, Any]], total: int, cfg: SFTConfig
             ) -> dict[str, Any]:
    """What `predict sft` prints: the traces, steps, tokens, first and last loss and training time."""
    first, last = rows[0] if rows else {}, rows[-1] if rows else {}
    return {
        "traces": len(samples),
        "steps": total,
        "epochs": cfg.epochs,
        "tokens": sum(len(s.token_ids) for s in samples),
        "assistant_tokens": sum(s.n_ce_tokens for s in samples),
        "first_loss": first.get("loss", float("nan")),
        "last_loss": last.get("loss", float("nan")),
        "train_time_s": sum(r["time_s"] for r in rows),
    }


def _check_disk(base_model: str, out_dir: Path, trainer_dir: Path, cfg: SFTConfig, total: int, done: int,
                arm: str) -> None:
    """The checkpoint and the state this SFT will write fit its disk, or it stops before its first step, naming
    both (`predict.train.disk`)."""
    import torch

    from predict.train.disk import check_disk, model_parameters, sft_state_saves, training_dtype, training_needs

    parameters = model_parameters(base_model)
    if parameters is None:
        return
    device = cfg.device if cfg.device != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    needs = training_needs(f"SFT {arm}", out_dir.parent, parameters=parameters,
                           dtype=training_dtype(cfg.dtype, device), checkpoints=[out_dir], state_dir=trainer_dir,
                           state_saves=sft_state_saves(total, cfg.save_every, done), keep_state=False)
    check_disk(needs, out_dir.parent, what=f"SFT arm {arm}")


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


# `predict sft`
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arm", required=True)
    p.add_argument("--traces", required=True, help="traces parquet with a messages column")
    p.add_argument("--base-model", required=True, help="checkpoint folder or HF id to start from")
    p.add_argument("--out-dir", required=True, help="the HF checkpoint folder written at the end")
    p.add_argument("--metrics-out", required=True, help="per-step loss log (parquet)")
    p.add_argument("--state-dir", required=True, help="resumable trainer state (removed when done)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps (smoke tests)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (the rule's threads:); default all")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.config import ConfigError
    from predict.config.models import plain_data
    from predict.outputs import print_summary

    if config.sft is None:
        raise ConfigError("stage 'sft': its config sets no 'sft'")
    # SFTConfig from the section's plain data: its fields are the resumable state's fingerprint (a YAML `lr: 1`
    # hashes as 1, the model's value would be 1.0 and make every saved state stale).
    cfg = SFTConfig.from_config(plain_data(config.sft))
    summary = run_sft(
        traces=Path(args.traces),
        base_model=args.base_model,
        out_dir=Path(args.out_dir),
        metrics_out=Path(args.metrics_out),
        state_dir=Path(args.state_dir),
        cfg=cfg,
        arm=args.arm,
        enable_thinking=config.model.enable_thinking,
        max_steps=args.max_steps if args.max_steps is not None else config.sft.max_steps,
        threads=args.threads,
        tracking=TrackingTargets.from_config(config),
        tracking_config=plain_data(config),  # W&B's run config: the slice as written
    )
    print_summary(f"SFT arm {args.arm}: {args.out_dir}", summary, float_format=".4g")
    return 0

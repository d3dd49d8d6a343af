"""What crosses between our files and a prime-rl run besides its TOML (`predict.train.prime_rl.configs`): the SFT
traces written as prime-rl's dataset before an ``sft`` run, and after a run what we read back and collect.

* `write_sft_dataset`: the traces' ``messages`` column as prime-rl's SFT dataset (``train.parquet``).
* metrics: prime-rl's metrics.jsonl files (`METRIC_SOURCES`) as one long table (`metrics_table`, `write_metrics`),
  converted to the per-step schema every backend writes (`schema_rows`, `write_rl_metrics`,
  `predict.train.step_metrics`) and mirrored into TensorBoard (`mirror_metrics`).
* failed rollouts: `check_failed_rollouts` stops a run once a step has more failed rollouts than
  ``prime_rl.rl.max_failed_share`` allows (`predict.train.prime_rl.cluster.run_watched` calls it while it runs).
* checkpoints: each finished step (``weights/step_N/STABLE``) moved to the path every backend uses
  (`collect_rl_checkpoints`, `collect_sft_checkpoint`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.train.prime_rl.configs import PrimeRLConfigError
from predict.train.step_metrics import share
from predict.train.step_metrics import write_metrics as write_schema

STABLE = "STABLE"  # prime-rl's marker of a finished checkpoint step

MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def write_sft_dataset(traces: str | Path, out_dir: str | Path) -> Path:
    """The traces' ``messages`` column as prime-rl's SFT dataset: ``<out_dir>/train.parquet`` with one column
    ``messages`` (list of {role, content}), loadable by ``datasets.load_dataset(out_dir, split="train")``."""
    from predict.outputs import write_table

    table = pq.read_table(traces)
    if "messages" not in table.column_names:
        raise PrimeRLConfigError(f"{traces}: no 'messages' column (have {', '.join(table.column_names)})")
    rows = table.column("messages").to_pylist()
    for i, messages in enumerate(rows):
        if not messages:
            raise PrimeRLConfigError(f"{traces}: row {i} has no messages")
        for m in messages:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PrimeRLConfigError(f"{traces}: row {i}: every message needs string role and content")
        if not any(m["role"] == "assistant" for m in messages):
            raise PrimeRLConfigError(f"{traces}: row {i} has no assistant turn (nothing to train on)")
    clean = [[{"role": m["role"], "content": m["content"]} for m in messages] for messages in rows]
    out = Path(out_dir) / "train.parquet"
    write_table(pa.table({"messages": pa.array(clean, type=MESSAGES_TYPE)}), out)
    return out


METRICS_SCHEMA = pa.schema(
    [("source", pa.string()), ("step", pa.int64()), ("metric", pa.string()), ("value", pa.float64())]
)
METRIC_SOURCES = {"trainer": "metrics.jsonl", "orchestrator": "run_default/metrics.jsonl"}
"""prime-rl's file monitors: the trainer's under output_dir, the orchestrator's under output_dir/run_default."""


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}/{k}" if prefix else str(k), v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


def metrics_table(output_dir: str | Path) -> pa.Table:
    """prime-rl's metrics.jsonl files as one long table (source, step, metric, value); nested keys joined by "/".
    A torn last line (a killed run) is skipped. The raw record beside the per-step schema (`schema_rows`)."""
    rows: list[dict[str, Any]] = []
    for source, name in METRIC_SOURCES.items():
        path = Path(output_dir) / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            step = record.pop("step", None)
            record.pop("time", None)
            flat: dict[str, float] = {}
            _flatten("", record, flat)
            rows += [{"source": source, "step": step, "metric": k, "value": v} for k, v in flat.items()]
    return pa.Table.from_pylist(rows, schema=METRICS_SCHEMA)


def write_metrics(output_dir: str | Path, out: str | Path) -> int:
    """Write `metrics_table` to parquet (empty when prime-rl logged nothing); returns the row count."""
    from predict.outputs import write_table

    table = metrics_table(output_dir)
    write_table(table, out)
    return table.num_rows


_ROLLOUT_METRIC = re.compile(r"^train/agg/all/[^/]+/metrics/predict_(?P<name>[^/]+)/mean$")
_REWARD = re.compile(r"^train/agg/all/[^/]+/reward/mean$")
_ERRORS = re.compile(r"^train/agg/all/[^/]+/error/[^/]+$")

CANCELLED = "Cancelled"
"""prime-rl's error type for a rollout its orchestrator cancelled itself (off-policy): no failure of the rollout."""


class FailedRolloutsError(RuntimeError):
    """Too many of one RL step's rollouts failed (names the step, the counts by error type and the config key)."""


def step_failures(step_metrics: Mapping[str, float]) -> dict[str, int]:
    """One orchestrator step's failed rollouts by error type: prime-rl's per-step counts
    (``train/agg/all/<agent>/error/<type>``: its train sink dropped each from its group), its own cancels aside."""
    out: dict[str, int] = {}
    for key, value in step_metrics.items():
        if _ERRORS.match(key) and (kind := key.rsplit("/", 1)[1]) != CANCELLED:
            out[kind] = out.get(kind, 0) + int(value)
    return out


def orchestrator_steps(output_dir: str | Path, start: int = 0) -> dict[int, dict[str, float]]:
    """Each step's flattened metrics in prime-rl's orchestrator metrics.jsonl from byte `start` on (a torn last line,
    a write in progress, is skipped)."""
    path = Path(output_dir) / METRIC_SOURCES["orchestrator"]
    values: dict[int, dict[str, float]] = {}
    if path.exists():
        with open(path, "rb") as f:
            f.seek(start)
            for line in f.read().decode(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                step = record.pop("step", None)
                if step is not None:
                    _flatten("", record, values.setdefault(int(step), {}))
    return values


def check_failed_rollouts(output_dir: str | Path, max_failed_share: float, start: int = 0) -> None:
    """Raise `FailedRolloutsError` for the first step prime-rl logged (its orchestrator's metrics.jsonl, from byte
    `start`: where the current attempt's records begin) in which more than `max_failed_share` of the rollouts
    failed: the group baselines of such a step rest on a few rollouts, and a failing server is no finding. Each
    failed rollout has been dropped and counted either way. A torn last line (a write in progress) is skipped."""
    for step, m in sorted(orchestrator_steps(output_dir, start).items()):
        n_all = int(m.get("progress/rollouts") or 0)
        failures = step_failures(m)
        if n_all and sum(failures.values()) / n_all > max_failed_share:
            raise FailedRolloutsError(
                f"step {step}: {sum(failures.values())} of {n_all} rollouts failed ({failures}), more than "
                f"prime_rl.rl.max_failed_share {max_failed_share:g}; the run is stopped (each failure is in "
                f"{Path(output_dir) / METRIC_SOURCES['orchestrator']} and prime-rl's rollout files)"
            )


ORCHESTRATOR_LOG = "logs/orchestrator.log"
"""prime-rl's orchestrator log under output_dir: it names each failed rollout as it happens (a step's metrics count
them only once the step is done)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FAILED_LINE = re.compile(r"Rollout (?:task )?failed in group \S+ \([^)]*\)(?: — |: )(?P<error>.*)$")


def logged_failures(output_dir: str | Path, start: int = 0) -> list[str]:
    """The errors of the failed rollouts prime-rl's orchestrator logged (its dispatcher's "Rollout failed in group
    ..." and "Rollout task failed in group ..." warnings) from byte `start` of its log on; from the beginning when the
    log is shorter than `start` (a new log)."""
    path = Path(output_dir) / ORCHESTRATOR_LOG
    if not path.exists():
        return []
    with open(path, "rb") as f:
        if path.stat().st_size >= start:
            f.seek(start)
        text = f.read().decode(errors="replace")
    return [m["error"].strip() for line in text.splitlines() if (m := _FAILED_LINE.search(_ANSI.sub("", line)))]


def check_open_step(output_dir: str | Path, max_failed_share: float, batch_size: int, metrics_start: int = 0,
                    log_start: int = 0) -> None:
    """Raise `FailedRolloutsError` when the rollouts that failed since the attempt began, beyond those its finished
    steps counted, already exceed what the step in progress may hold: more than ``max_failed_share / (1 -
    max_failed_share) * batch_size``, so that even if every rollout it still needs succeeded, its failed share would
    pass the threshold (`check_failed_rollouts`' rule, the failures counted in the step's rollouts or not). prime-rl
    resamples a failed rollout without end, so a run whose every rollout fails (a broken server, harness or
    install: on the H200, HTTP 502 for each, issue 39) would otherwise finish no step and wait for its job's time
    limit; the error quotes the first failure."""
    errors = logged_failures(output_dir, log_start)
    counted = sum(sum(step_failures(m).values()) for m in orchestrator_steps(output_dir, metrics_start).values())
    pending = len(errors) - counted
    allowed = max_failed_share / (1 - max_failed_share) * batch_size if max_failed_share < 1 else float("inf")
    if pending > allowed:
        raise FailedRolloutsError(
            f"{pending} rollouts failed in the step in progress (no step of this attempt finished with them): more "
            f"than a step of {batch_size} rollouts can hold under prime_rl.rl.max_failed_share {max_failed_share:g} "
            f"({allowed:.1f}); the run is stopped. The first: {errors[counted] if counted < len(errors) else '?'} "
            f"(every one: {Path(output_dir) / ORCHESTRATOR_LOG})"
        )

def schema_rows(long: pa.Table, run: str, seed: int) -> list[dict[str, Any]]:
    """prime-rl's long metrics as rows of the per-step schema (`predict.train.step_metrics`), one per orchestrator step.
    A step logged twice (a retried attempt) keeps its last value.

    * ``n_rollouts`` = ``progress/rollouts``; ``n_failed`` = the errored ones (``.../error/<type>`` counts); the
      other rollouts reach `PredictAlgorithm.score_rollout` and carry its ``predict_<name>`` trace metrics, whose
      logged per-step mean times their number gives the step's counts (``pred_<CLASS>``, ``verified_<CLASS>``,
      ``n_patches``, ...), and whose means are the rates (``reward_mean``, ``pass_rate``, ``budget_exhausted_rate``).
    * A run logged without ``predict_`` metrics (an algorithm that records none): ``reward_mean`` is the logged mean
      reward, and ``pass_rate`` equals it (the reward is the final pass, 0 or 1); no class counts.
    * ``loss`` = the trainer's ``loss/mean``, ``grad_norm``, ``lr`` = ``optim/*``; ``n_input_tokens``,
      ``n_output_tokens`` = ``progress/*_tokens``; the time split of the local trainer's columns: ``step_s`` = the
      orchestrator's ``time/step``, ``sync_s`` = the trainer's ``time/broadcast_weights``, ``update_s`` = its
      ``time/forward_backward``; no ``rollout_s`` (prime-rl rolls out beside the trainer, not inside its step)."""
    values: dict[tuple[str, int], dict[str, float]] = {}
    for r in long.to_pylist():
        if r["step"] is not None:
            values.setdefault((r["source"], int(r["step"])), {})[r["metric"]] = r["value"]
    rows = []
    for (source, step), m in sorted(values.items()):
        if source != "orchestrator" or "progress/rollouts" not in m:
            continue
        trainer = values.get(("trainer", step), {})
        n_all = int(m["progress/rollouts"])
        n_failed = int(sum(v for k, v in m.items() if _ERRORS.match(k)))
        n_scored = n_all - n_failed
        means = {g["name"]: v for k, v in m.items() if (g := _ROLLOUT_METRIC.match(k))}
        reward = next((v for k, v in m.items() if _REWARD.match(k)), None)
        row: dict[str, Any] = {
            "run": run, "seed": int(seed), "step": step, "backend": "prime_rl", "n_rollouts": n_all,
            "n_failed": n_failed, "loss": trainer.get("loss/mean"), "grad_norm": trainer.get("optim/grad_norm"),
            "lr": trainer.get("optim/lr"), "n_input_tokens": _int(m.get("progress/input_tokens")),
            "n_output_tokens": _int(m.get("progress/output_tokens")), "step_s": m.get("time/step"),
            "sync_s": trainer.get("time/broadcast_weights"), "update_s": trainer.get("time/forward_backward"),
        }
        if means:
            counts = {k: round(v * n_scored) for k, v in means.items() if k not in ("reward", "pass", "budget_exhausted")}
            row |= {k: v for k, v in counts.items() if k.startswith(("pred_", "verified_", "n_")) and k != "n_correct"}
            row |= {"reward_mean": means.get("reward"), "pass_rate": means.get("pass"),
                    "budget_exhausted_rate": means.get("budget_exhausted"),
                    "n_budget_exhausted": round(means.get("budget_exhausted", 0.0) * n_scored),
                    "revise_rate": share(counts.get("n_revise"), counts.get("n_predictions")),
                    "prediction_accuracy": share(counts.get("n_correct"), counts.get("n_predictions"))}
        else:
            row |= {"reward_mean": reward, "pass_rate": reward}
        rows.append(row)
    return rows


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def mirror_metrics(metrics: str | Path, tensorboard_root: Path, *, run: str, seed: int) -> Path | None:
    """The collected per-step table as TensorBoard scalars under ``<root>/rl/{run}/seed{seed}``, the folder a local
    RL run writes (`predict.train.tracking`); W&B is left to prime-rl's own monitor (`wandb_tables`)."""
    from predict.config.models import WandbSettings
    from predict.train.step_metrics import read_metrics
    from predict.train.tracking import RunTracker, TrackingTargets

    targets = TrackingTargets(tensorboard_root, wandb=WandbSettings(mode="disabled"))  # TensorBoard alone
    with RunTracker(targets, stage="rl", run=run, seed=seed).start(0) as tracker:
        tracker.log_rows(read_metrics(metrics))
    return tracker.log_dir


def write_rl_metrics(output_dir: str | Path, out: str | Path, raw_out: str | Path, *, run: str, seed: int) -> int:
    """An RL run's metrics: the per-step schema to `out` and prime-rl's raw long table to `raw_out`; returns the
    number of steps."""
    from predict.outputs import write_table

    long = metrics_table(output_dir)
    write_table(long, raw_out)
    rows = schema_rows(long, run, seed)
    write_schema(rows, out)
    return len(rows)


def step_folders(parent: str | Path) -> dict[int, Path]:
    """{step: folder} of prime-rl's ``<parent>/step_<N>`` folders (weights, checkpoints, broadcasts)."""
    return {int(d.name[5:]): d for d in Path(parent).glob("step_*") if d.name[5:].isdigit()}


def finished_steps(output_dir: str | Path) -> list[int]:
    """Steps whose HF weights prime-rl finished writing (``weights/step_N/STABLE``)."""
    return sorted(s for s, d in step_folders(Path(output_dir) / "weights").items() if (d / STABLE).exists())


def _move(source: Path, dest: Path) -> None:
    """Move a finished step folder into place (a rename on one filesystem); an existing folder is replaced."""
    import shutil

    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(source), str(dest))


def collect_rl_checkpoints(output_dir: str | Path, run_dir: str | Path, out_json: str | Path) -> dict[str, Any]:
    """Move every finished RL step to ``<run_dir>/step{N}`` (after the run: prime-rl no longer reads them) and
    list them in `out_json`. Re-running after a resume only adds the new steps."""
    from predict.outputs import write_json

    for step in finished_steps(output_dir):
        _move(Path(output_dir) / "weights" / f"step_{step}", Path(run_dir) / f"step{step}")
    steps = sorted(int(d.name[4:]) for d in Path(run_dir).glob("step*") if d.name[4:].isdigit() and d.is_dir())
    if not steps:
        raise PrimeRLConfigError(f"{output_dir}: prime-rl wrote no finished checkpoint (weights/step_N/STABLE)")
    summary = {"output_dir": str(output_dir), "steps": steps, "last": steps[-1]}
    write_json(summary, out_json)
    return summary


def collect_sft_checkpoint(output_dir: str | Path, checkpoint: str | Path) -> int:
    """Move the last finished SFT step to the arm's SFT checkpoint folder; returns the step."""
    steps = finished_steps(output_dir)
    if not steps:
        raise PrimeRLConfigError(f"{output_dir}: prime-rl sft wrote no finished checkpoint (weights/step_N/STABLE)")
    _move(Path(output_dir) / "weights" / f"step_{steps[-1]}", Path(checkpoint))
    return steps[-1]

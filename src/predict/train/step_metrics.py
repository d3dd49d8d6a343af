"""The per-step training metrics table: one schema that every trainer writes and every reader reads.

One row per optimizer step of one run and seed (``results/rl/{run}/seed{seed}/metrics.parquet``). Our RL
(`predict.train.rl`), RFT (`predict.train.rft`) and prime-rl (through `predict.train.prime_rl.collect.
metrics_table`) all write it with `write_metrics`, which refuses a column the schema does not declare (naming it)
and leaves a column a trainer cannot measure null. Pure: pyarrow only, no torch, so statistics and the report
import it.

How the study's figures come out of the columns:

* reward curve: ``reward_mean`` (mean reward of the step's scored rollouts) and ``pass_rate`` (share of them whose
  final solution passed) against ``step``; ``n_rollouts`` of which ``n_failed`` were infrastructure failures.
* REVISE rate: ``n_revise`` / ``n_predictions`` (``revise_rate``): effective REVISE decisions per predicted patch.
* budget exhaustion: ``n_budget_exhausted`` / scored rollouts (``budget_exhausted_rate``).
* loss terms: ``loss``, ``rl_loss``, ``ce_loss`` (prime-rl logs only ``loss``), ``clip_frac``, ``grad_norm``, ``lr``;
  gradient interference (local trainer only, `predict.train.grad_terms`): ``rl_grad_norm``, ``ce_grad_norm`` (each
  term's gradient norm before clipping, the step's whole batch) and ``rl_ce_grad_cosine``, null when not measured;
  token counts trained on: ``n_tokens``, ``n_rl_tokens``, ``n_ce_tokens``; rollout tokens ``n_input_tokens``,
  ``n_output_tokens``.
* training-outcome table (the writeup's "15,122 verified outcomes"): summed over a run's steps, ``verified_<CLASS>``
  (patches whose verified outcome, seen or shadow, was CLASS) next to ``pred_<CLASS>`` (patches predicted CLASS;
  ``pred_MALFORMED`` for an unparseable prediction line), CLASS in `OUTCOMES`. The ``training-outcomes`` stage builds it (`predict.stats.training_outcomes`).
  A patch is every applied patch of `predict.env.records.patch_steps` (edit-on-REVISE replacements included),
  counted the same way on every backend.
* the trainer's own bookkeeping: sample building (``prediction_points``, ``masked_labels``, ``unaligned``, ...),
  RFT's sampling (``n_sampled``, ``n_kept``, ``sample_pass_rate``), time split (``*_s``: ``save_s`` is what the step waited for its saves, ``checkpoint_write_s`` and
  ``state_write_s`` their folders' writing, in the background beside the next steps), ``finished_at``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from predict.env.protocol import MALFORMED
from predict.vocabulary import OUTCOMES

PRED_CLASSES: tuple[str, ...] = (*OUTCOMES, MALFORMED)
"""What a prediction can be: a class, or a malformed line."""

GRAD_TERM_COLUMNS: tuple[str, ...] = ("rl_grad_norm", "ce_grad_norm", "rl_ce_grad_cosine")
"""The RL and CE terms' gradient norms and their cosine (`predict.train.grad_terms`), also `Trainer.step`'s keys."""

_I, _F, _S, _B = pa.int64(), pa.float64(), pa.string(), pa.bool_()
METRICS_SCHEMA = pa.schema(
    [
        ("run", _S), ("seed", _I), ("step", _I), ("backend", _S),
        # rollouts
        ("n_rollouts", _I), ("n_failed", _I), ("reward_mean", _F), ("pass_rate", _F),
        ("n_budget_exhausted", _I), ("budget_exhausted_rate", _F),
        ("n_patches", _I), ("n_predictions", _I), ("n_revise", _I), ("revise_rate", _F), ("prediction_accuracy", _F),
        *((f"pred_{c}", _I) for c in PRED_CLASSES),
        *((f"verified_{c}", _I) for c in OUTCOMES),
        ("n_input_tokens", _I), ("n_output_tokens", _I),
        # the update
        ("updated", _B), ("loss", _F), ("rl_loss", _F), ("ce_loss", _F), ("clip_frac", _F), ("grad_norm", _F),
        ("lr", _F), ("n_tokens", _I), ("n_rl_tokens", _I), ("n_ce_tokens", _I), ("n_samples", _I), ("n_ce_samples", _I),
        *((c, _F) for c in GRAD_TERM_COLUMNS),
        # sample building (our trainer)
        ("prediction_points", _I), ("masked_labels", _I), ("malformed_no_label", _I), ("unaligned", _I),
        ("no_reward", _I), ("zero_advantage_skipped", _I), ("merged_calls", _I), ("calls", _I),
        # RFT
        ("n_sampled", _I), ("n_kept", _I), ("sample_pass_rate", _F), ("n_batch_rollouts", _I),
        # time
        ("rollout_s", _F), ("samples_s", _F), ("sample_s", _F), ("update_s", _F), ("sleep_s", _F), ("sync_s", _F),
        ("offload_s", _F),
        ("save_s", _F), ("checkpoint_write_s", _F), ("state_write_s", _F),
        ("step_s", _F), ("finished_at", _F),
    ]
)
METRIC_COLUMNS: tuple[str, ...] = tuple(METRICS_SCHEMA.names)
BACKENDS = ("rl", "rft", "prime_rl")


class MetricsSchemaError(ValueError):
    """A metrics row does not fit the schema (names the row and the column)."""


def metrics_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """The rows as a table of exactly `METRICS_SCHEMA`, sorted by step; an undeclared column is an error."""
    for i, row in enumerate(rows):
        unknown = sorted(set(row) - set(METRIC_COLUMNS))
        if unknown:
            raise MetricsSchemaError(f"metrics row {i} (step {row.get('step')}): undeclared column(s) {unknown}; "
                                     "declare them in predict.train.step_metrics.METRICS_SCHEMA")
        if row.get("backend") not in BACKENDS:
            raise MetricsSchemaError(f"metrics row {i}: backend {row.get('backend')!r} not one of {BACKENDS}")
    ordered = sorted(rows, key=lambda r: int(r["step"]))
    return pa.Table.from_pylist([{k: r.get(k) for k in METRIC_COLUMNS} for r in ordered], schema=METRICS_SCHEMA)


def write_metrics(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write the per-step table atomically (an empty run gives an empty table of the same schema)."""
    from predict.outputs import write_table

    return write_table(metrics_table(rows), path)


# ---------------------------------------------------------------------------------------------------------------
# From rollout records (our trainers; prime-rl's PredictAlgorithm counts one rollout with `patch_counts`)
# ---------------------------------------------------------------------------------------------------------------
def share(hits: int | None, n: int | None) -> float | None:
    """hits / n; None when either is unknown or n is 0."""
    return hits / n if hits is not None and n else None


def patch_counts(steps: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """One rollout's patches: ``n_patches``, ``n_predictions``, ``n_revise``, ``n_correct`` and the per-class
    counts ``pred_<CLASS>`` / ``verified_<CLASS>`` (every class present, zeros included)."""
    from predict.env.records import patch_steps

    patches = patch_steps(steps)
    predicted = [s for s in patches if s.get("prediction") is not None]
    out = {
        "n_patches": len(patches),
        "n_predictions": len(predicted),
        "n_revise": sum(s.get("decision") == "REVISE" for s in predicted),
        "n_correct": sum(s["prediction"] == s.get("outcome") for s in predicted),
    }
    out |= {f"pred_{c}": sum(s["prediction"] == c for s in predicted) for c in PRED_CLASSES}
    out |= {f"verified_{c}": sum(s.get("outcome") == c for s in patches) for c in OUTCOMES}
    return out


def rollout_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The rollout columns of one step from its records (infrastructure failures counted in ``n_failed`` only)."""
    scored = [r for r in records if r.get("ok", True) and r.get("reward") is not None]
    totals: dict[str, int] = {}
    for r in scored:
        for k, v in patch_counts(r.get("steps") or []).items():
            totals[k] = totals.get(k, 0) + v
    correct = totals.pop("n_correct", 0)
    n_exhausted = sum(bool(r.get("budget_exhausted")) for r in scored)
    tokens = [r.get("n_input_tokens") for r in scored], [r.get("n_output_tokens") for r in scored]
    return {
        "n_rollouts": len(records),
        "n_failed": len(records) - len(scored),
        "reward_mean": sum(float(r["reward"]) for r in scored) / len(scored) if scored else None,
        "pass_rate": share(sum(bool(r.get("final_pass")) for r in scored), len(scored)),
        "n_budget_exhausted": n_exhausted,
        "budget_exhausted_rate": share(n_exhausted, len(scored)),
        **{k: totals.get(k, 0) for k in ("n_patches", "n_predictions", "n_revise")},
        "revise_rate": share(totals.get("n_revise", 0), totals.get("n_predictions", 0)),
        "prediction_accuracy": share(correct, totals.get("n_predictions", 0)),
        **{k: v for k, v in totals.items() if k.startswith(("pred_", "verified_"))},
        **{k: sum(t for t in ts if t is not None) if any(t is not None for t in ts) else None
           for k, ts in zip(("n_input_tokens", "n_output_tokens"), tokens, strict=True)},
    }


# ---------------------------------------------------------------------------------------------------------------
# prime-rl: per-rollout metrics logged by PredictAlgorithm, summed back per step by the converter
# ---------------------------------------------------------------------------------------------------------------
ROLLOUT_METRIC_PREFIX = "predict_"
"""PredictAlgorithm records each rollout's counts as trace metrics ``predict_<name>``; prime-rl's orchestrator logs
their per-step mean over the rollouts that carry them (``train/agg/all/<agent>/metrics/predict_<name>/mean``), and
`predict.train.prime_rl.collect.schema_rows` multiplies back by the number of those rollouts."""


def rollout_trace_metrics(info: Mapping[str, Any], reward: float | None) -> dict[str, float]:
    """One prime-rl rollout's counts (``info``: the trace's info, carrying the program's ``agent_result`` and the
    ``final_verdict``), as the trace metrics PredictAlgorithm records: every key present, zeros included."""
    result = dict(info.get("agent_result") or {})
    summary = dict(result.get("summary") or {})
    final = (info.get("final_verdict") or {}).get("outcome")
    counts: dict[str, float] = {k: float(v) for k, v in patch_counts(result.get("steps") or []).items()}
    counts |= {"reward": float(reward or 0.0), "pass": float(final == "PASS"),
               "budget_exhausted": float(bool(summary.get("budget_exhausted")))}
    return {ROLLOUT_METRIC_PREFIX + k: v for k, v in counts.items()}


# ---------------------------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------------------------
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of one per-step table; a file that is not of this schema is an error naming it and the column."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in ("run", "seed", "step") if c not in table.column_names]
    unknown = sorted(set(table.column_names) - set(METRIC_COLUMNS))
    if missing or unknown:
        raise MetricsSchemaError(f"{path}: not a per-step metrics table (missing {missing}, undeclared {unknown}); "
                                 "every trainer writes it through predict.train.step_metrics.write_metrics")
    return table.to_pylist()


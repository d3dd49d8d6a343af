"""Per-trajectory records: one finished trace -> one row; the parquet schema and its atomic writer.

One row per rollout. ``steps`` holds every assistant reply in order (see `protocol.Step`; the struct fields are
`STEP_FIELDS`). How the study's figures come out of the columns:

* pass rate: mean ``final_pass`` (or ``reward``) by arm/seed/checkpoint/split; never-revised vs revised rollouts:
  group by ``ever_revised``; budget use: ``calls_used``, ``budget_exhausted``; stops: ``stop_reason``.
* per patch: the steps with ``applied`` (`patch_steps`): ``action == "apply_patch"``, and under edit_on_revise
  also the REVISE replies that applied a replacement (``edited_from`` set). Each carries the verified ``outcome``
  of the patched code (``outcome_seen``: shown to the model by a python_test on that exact state, else a hidden
  shadow execution), and in the predictive arm its ``prediction``, ``decision_sampled``, ``decision``, ``forced``
  and ``reverted``. Prediction accuracy / confusion matrix: ``prediction`` vs ``outcome`` over those patch steps
  (``prediction == "MALFORMED"`` marks a malformed line). Prediction steps (``action == "prediction"``) repeat
  the same prediction fields next to the raw reply, except one that carries a replacement (its fields are the
  replacement's; its own prediction is on ``steps[patch_step]``): count patches, not prediction steps.
* expensive tests (``test_cost`` k > 1; ``budget`` is the scaled one, base + k - 1): runs at k > 1 are compared
  between arms at the same k. Calls saved per solved task: mean ``calls_used`` over rollouts with ``final_pass``,
  Arm A minus Arm B (paired by ``task_id`` where both solved); ``n_test_calls`` (calls spent on tests),
  ``n_tests_refused`` (tests refused for lack of budget) and ``budget_exhausted`` say where calls went. REVISE
  precision: over Arm B's patch steps with ``decision == "REVISE"`` and an ``outcome``, the share whose
  ``outcome != "PASS"`` (a REVISE that saved a failing patch's test); its recall: the same over non-PASS patches.
* edit on REVISE (``variant == "edit_on_revise"``): pass rate of rollouts with an edited REVISE (``ever_edited``)
  vs never-revised ones (``not ever_revised``); ``n_edit_revisions`` (replacements applied), ``n_edit_errors``
  (REVISE replies whose replacement was missing, failed or refused at the cap, step field ``edit_error``),
  ``max_revision_depth`` (longest chain; per patch ``revision_depth``, 0 = a tool call's patch). A replacement's
  REVISEd patch is ``steps[edited_from]`` (its shadow outcome stays the label of that prediction).
* irreversible and blind (``variant``; both protocols, paired by ``variant`` and ``test_cost`` across arms): the
  record is graded like any other (``final_outcome``/``reward``: the task's check of solution.py as the episode
  left it). Irreversible: a rollout whose python_test ran ends on it (``stop_reason == "final_test"``), graded on
  the state it tested (``final_solution`` is the code that test ran on); that test and its patch have
  ``outcome_seen`` false. Blind: ``n_tests`` is 0 (a python_test call is an ``invalid`` step with ``tool ==
  "python_test"`` and ``error == "test_unavailable"``) and every patch outcome is a hidden shadow
  (``outcome_seen`` false), so Arm B's confusion matrix and REVISE precision read as in the study.
* recovery: ``recovered`` is null unless the first applied patch's verified outcome was not PASS; then it is
  ``final_pass``. Recovery rate = mean of the non-null values.
* rows with ``stop_reason == "error"`` or ``ok == False`` are infrastructure failures (``error`` says what): their
  ``reward``/``final_outcome`` may be null; exclude or re-run them.
  ``stop_reason == "context"`` is no failure: the conversation outgrew the server's context and was graded then
  (`predict.env.protocol`'s Context rule); ``error`` holds the server's refusal.
* sampling seeds: ``request_seeds`` is the seed sent with each model call in order (null: the run sent none), each
  `predict.env.seeds.request_seed(request_seed_key, call)`; ``request_seed_key`` is the rollout's ``rollout_key``
  (run, seed, step as checkpoint, task, sample), so the same run on the same machine samples the same rollouts.
* ``tokens`` (train client only, else null): the trace's message graph, one struct per node (``parent`` index,
  ``role``, ``sampled``, ``token_ids``, ``mask``, ``logprobs``). A sampled node is one model call: its prompt is
  the concatenated ``token_ids`` of its ancestors, its completion tokens are where ``mask`` is true, and
  ``logprobs`` are aligned to those sampled tokens.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.env.protocol import ProtocolConfig, Step
from predict.outputs import write_rows
from predict.vocabulary import Outcome

# The struct of one step is `protocol.Step`'s fields in order (its annotations are strings here: int, str, bool,
# each maybe "| None"), so the two can never differ.
_ARROW_TYPES: dict[str, pa.DataType] = {"int": pa.int32(), "str": pa.string(), "bool": pa.bool_()}
STEP_FIELDS: tuple[tuple[str, pa.DataType], ...] = tuple(
    (f.name, _ARROW_TYPES[str(f.type).removesuffix(" | None")]) for f in dataclasses.fields(Step)
)
STEP_TYPE = pa.struct(list(STEP_FIELDS))

TOKEN_NODE_TYPE = pa.struct(
    [
        ("parent", pa.int32()),
        ("role", pa.string()),
        ("sampled", pa.bool_()),
        ("token_ids", pa.list_(pa.int32())),
        ("mask", pa.list_(pa.bool_())),
        ("logprobs", pa.list_(pa.float32())),
    ]
)

RECORD_SCHEMA = pa.schema(
    [
        ("rollout_key", pa.string()),
        ("trace_id", pa.string()),
        ("task_id", pa.int64()),
        ("sample", pa.int32()),
        ("split", pa.string()),
        ("arm", pa.string()),
        ("protocol", pa.string()),
        ("variant", pa.string()),
        ("seed", pa.int64()),
        ("checkpoint", pa.string()),
        ("model", pa.string()),
        ("client", pa.string()),
        ("budget", pa.int32()),
        ("revise_costs_call", pa.bool_()),
        ("test_cost", pa.int32()),
        ("max_chained_revisions", pa.int32()),
        ("steps", pa.list_(STEP_TYPE)),
        ("calls_used", pa.int32()),
        ("budget_exhausted", pa.bool_()),
        ("n_model_calls", pa.int32()),
        ("n_patches", pa.int32()),
        ("n_tests", pa.int32()),
        ("n_test_calls", pa.int32()),
        ("n_tests_refused", pa.int32()),
        ("n_errors", pa.int32()),
        ("n_predictions", pa.int32()),
        ("n_malformed_predictions", pa.int32()),
        ("n_forced", pa.int32()),
        ("ever_revised", pa.bool_()),
        ("n_revised", pa.int32()),
        ("ever_edited", pa.bool_()),
        ("n_edit_revisions", pa.int32()),
        ("n_edit_errors", pa.int32()),
        ("max_revision_depth", pa.int32()),
        ("first_patch_outcome", pa.string()),
        ("recovered", pa.bool_()),
        ("final_outcome", pa.string()),
        ("final_pass", pa.bool_()),
        ("reward", pa.float64()),
        ("stop_reason", pa.string()),
        ("ok", pa.bool_()),
        ("error", pa.string()),
        ("final_solution", pa.string()),
        ("n_input_tokens", pa.int64()),
        ("n_output_tokens", pa.int64()),
        ("wall_s", pa.float64()),
        ("model_s", pa.float64()),
        ("env_s", pa.float64()),
        ("program_s", pa.float64()),
        ("created_at", pa.float64()),
        ("request_seed_key", pa.string()),
        ("request_seeds", pa.list_(pa.int64())),
        ("tokens", pa.list_(TOKEN_NODE_TYPE)),
    ]
)
RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_SCHEMA.names)
PER_RUN_COLUMNS: tuple[str, ...] = ("wall_s", "model_s", "env_s", "program_s", "created_at", "trace_id")
"""The columns in which two runs of one rollout differ by nature (times and a random id): a rollout repeats when every
other column does."""


# `Episode.summary` counts and flags copied into the record (0 / False when the program left no summary)
_SUMMARY_COUNTS: tuple[str, ...] = (
    "calls_used", "n_patches", "n_tests", "n_test_calls", "n_tests_refused", "n_errors", "n_predictions",
    "n_malformed_predictions", "n_forced", "n_revised", "n_edit_revisions", "n_edit_errors", "max_revision_depth",
)
_SUMMARY_FLAGS: tuple[str, ...] = ("budget_exhausted", "ever_revised", "ever_edited")


def rollout_key(arm: str, seed: int, checkpoint: str, task_id: int, sample: int = 0) -> str:
    """Identity of one rollout, for resume: the same key is never rolled out twice."""
    return f"{arm}|{seed}|{checkpoint}|{task_id}|{sample}"


def patch_steps(steps: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The patch steps of one record's ``steps`` (every applied patch, replacements included), in order."""
    return [s for s in steps if s.get("applied")]


def step_labels(step: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What one step did, as short labels each with its kind ("pass", "fail", "revise" or ""): its action and status,
    and its prediction, decision (forced or not) and, on an apply_patch step, the verified outcome (``seen`` by the
    model or a hidden ``shadow``). The report's example rollout and the Inspect logs (predict.inspect_logs) label a
    step with these."""
    labels = [(step.get("action") or "?", "")]
    if status := step.get("status"):
        labels.append((status, {"success": "pass", "error": "fail", "failed": "fail"}.get(status, "")))
    if step.get("prediction"):
        labels.append((f"predicted {step['prediction']}", ""))
    if decision := step.get("decision"):
        labels.append((f"{decision}{' (forced)' if step.get('forced') else ''}", "revise" if decision == "REVISE" else ""))
    if step.get("outcome") and step.get("action") == "apply_patch":
        seen = "seen" if step.get("outcome_seen") else "shadow"
        labels.append((f"verified {step['outcome']} ({seen})", "pass" if step["outcome"] == "PASS" else "fail"))
    return labels


def _tokens(trace: Any) -> list[dict[str, Any]] | None:
    nodes = list(getattr(trace, "nodes", None) or [])
    if not any(n.token_ids for n in nodes):
        return None  # eval client: no token ids recorded
    return [
        {
            "parent": n.parent,
            "role": n.message.role,
            "sampled": n.sampled,
            "token_ids": list(n.token_ids),
            "mask": list(n.mask),
            "logprobs": list(n.logprobs),
        }
        for n in nodes
    ]


def build_record(
    *,
    meta: Mapping[str, Any],
    task: Mapping[str, Any],
    agent_result: Mapping[str, Any] | None,
    final_verdict: Mapping[str, Any] | None,
    reward: float | None,
    ok: bool,
    error: str | None,
    wall_s: float,
    trace_id: str | None = None,
    n_input_tokens: int | None = None,
    n_output_tokens: int | None = None,
    tokens: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The row, from plain pieces (so it is testable without a trace). `meta`: arm, seed, checkpoint, protocol,
    variant, model, client, budget, revise_costs_call, test_cost, max_chained_revisions, split (fallback). `task`:
    task_id, sample, split."""
    result = dict(agent_result or {})
    summary = dict(result.get("summary") or {})
    steps = list(result.get("steps") or [])
    final_outcome = (final_verdict or {}).get("outcome")
    final_pass = None if final_outcome is None else final_outcome == Outcome.PASS.value
    first = summary.get("first_patch_outcome")
    recovered = None if first is None or first == Outcome.PASS.value or final_pass is None else final_pass
    stop_reason = summary.get("stop_reason") or "error"
    errors = [e for e in (summary.get("error"), result.get("missing"), error) if e]
    task_id, sample = int(task["task_id"]), int(task.get("sample") or 0)
    # the knobs the program enforced (its result's ProtocolConfig), else the ones the job asked for (`meta`)
    enforced = ProtocolConfig(**result["config"]) if result.get("config") else None
    timing = dict(result.get("timing") or {})
    return {
        "rollout_key": rollout_key(meta["arm"], meta["seed"], meta["checkpoint"], task_id, sample),
        "trace_id": trace_id,
        "task_id": task_id,
        "sample": sample,
        "split": task.get("split") or meta.get("split"),
        "arm": meta["arm"],
        "protocol": meta["protocol"],
        "variant": meta["variant"],
        "seed": meta["seed"],
        "checkpoint": meta["checkpoint"],
        "model": meta.get("model"),
        "client": meta.get("client"),
        "budget": enforced.budget if enforced else meta.get("budget"),
        "revise_costs_call": enforced.revise_costs_call if enforced else meta.get("revise_costs_call"),
        "test_cost": enforced.test_cost if enforced else meta.get("test_cost", 1),
        "max_chained_revisions": enforced.max_chained_revisions if enforced else meta.get("max_chained_revisions", 2),
        "steps": steps,
        **{k: summary.get(k, 0) for k in _SUMMARY_COUNTS},
        **{k: bool(summary.get(k, False)) for k in _SUMMARY_FLAGS},
        "n_model_calls": summary.get("n_model_calls", len(steps)),
        "first_patch_outcome": first,
        "recovered": recovered,
        "final_outcome": final_outcome,
        "final_pass": final_pass,
        "reward": reward,
        "stop_reason": stop_reason,
        "ok": ok,
        "error": "\n".join(errors)[-4000:] or None,
        "final_solution": summary.get("final_solution"),
        "n_input_tokens": n_input_tokens,
        "n_output_tokens": n_output_tokens,
        "wall_s": wall_s,
        # inside the program: waiting for the model, and the environment's own work (mostly sandbox runs);
        # wall_s - program_s is verifiers' set-up, grading and clean-up (and the program's start-up when it runs as
        # a process: predict.env.harness)
        "model_s": timing.get("model_s"),
        "env_s": timing.get("env_s"),
        "program_s": timing.get("program_s"),
        "created_at": time.time(),
        "request_seed_key": result.get("request_seed_key"),
        "request_seeds": result.get("request_seeds"),
        "tokens": tokens,
    }


def trace_to_record(trace: Any, meta: Mapping[str, Any], task: Mapping[str, Any], wall_s: float) -> dict[str, Any]:
    """The row for one finished verifiers trace (`trace.info` carries the program result and the final verdict).
    A failed trace (``ok`` false: e.g. model calls that kept failing, the program's exit 97) has no reward even if
    something scored it: a failed model call must never become a reward of 0 that training learns from."""
    scored = (trace.rewards or {}).get("tests_pass") is not None and bool(trace.ok)
    return build_record(
        meta=meta,
        task=task,
        agent_result=trace.info.get("agent_result"),
        final_verdict=trace.info.get("final_verdict"),
        reward=float(trace.reward) if scored else None,
        ok=bool(trace.ok),
        error="\n".join(f"{e.type}: {e.message}" for e in getattr(trace, "errors", None) or []) or None,
        wall_s=wall_s,
        trace_id=trace.id,
        n_input_tokens=trace.num_input_tokens,
        n_output_tokens=trace.num_output_tokens,
        tokens=_tokens(trace),
    )


# ---------------------------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------------------------
def write_records(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows to one parquet file atomically (tmp file in the same folder, then rename)."""
    return write_rows(rows, RECORD_SCHEMA, path)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of one records parquet, with the record schema."""
    return pq.read_table(path, schema=RECORD_SCHEMA).to_pylist()

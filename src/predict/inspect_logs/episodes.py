"""One episode (a parquet row of `predict.env.records`) as an Inspect sample, and one evaluation or RL step as an
Inspect eval log: the rules are predict.inspect_logs'."""

from __future__ import annotations

import datetime
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from inspect_ai.log import (
    EvalConfig,
    EvalDataset,
    EvalError,
    EvalLog,
    EvalMetric,
    EvalResults,
    EvalSample,
    EvalScore,
    EvalSpec,
    EvalStats,
)
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.scorer import CORRECT, INCORRECT, Score
from inspect_ai.viewer import TaskSamplesColumn, TaskSamplesView, ViewerConfig

from predict.env.protocol import ProtocolConfig, task_prompt
from predict.env.records import patch_steps, step_labels
from predict.inspect_logs.sources import Pair, Source

# What one patch carries into the sample's ``patches`` metadata (protocol.Step's fields of the same names).
PATCH_FIELDS = ("index", "prediction", "decision_sampled", "decision", "forced", "reverted", "outcome", "outcome_seen",
                "edited_from", "revision_depth")
# The sample list's columns in the viewer, after the id and epoch: the scores a reader sorts and filters on.
LIST_SCORES = ("final_pass", "pair", "first_patch", "recovered", "forced_revises", "calls_used", "stop_reason")
PAIR_VALUES = ("both pass", "both fail")  # and "only <run> passes"


def protocol_config(row: Mapping[str, Any]) -> ProtocolConfig:
    """The episode's protocol as the row records it (its budget is the resolved one: already scaled; a knob the row
    leaves null takes the protocol's own default)."""
    knobs = ("protocol", "variant", "budget", "revise_costs_call", "test_cost", "max_chained_revisions")
    return ProtocolConfig(**{k: row[k] for k in knobs if row.get(k) is not None})


def served_model(row: Mapping[str, Any]) -> str:
    """The model name the row records (the name it was served under); Inspect needs one where a row has none."""
    return str(row["model"]) if row.get("model") is not None else "(no model recorded)"


def sample_id(row: Mapping[str, Any]) -> tuple[int, int]:
    """(Inspect sample id, epoch) of a row: the task id, its sample index + 1."""
    return int(row["task_id"]), int(row.get("sample") or 0) + 1


def message_texts(row: Mapping[str, Any], task: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of every message the episode's model was sent and said, in order (the module rules)."""
    out = [("system", protocol_config(row).system_prompt()), ("user", task_prompt(task["text"], task["test_list"]))]
    for step in row.get("steps") or []:
        out.append(("assistant", step.get("reply") or ""))
        if step.get("result") is not None and step.get("result_sent", True):
            out.append(("user", step["result"]))
    return out


def _step_metadata(step: Mapping[str, Any]) -> dict[str, Any]:
    meta = {"step": step.get("index"), "labels": " · ".join(text for text, _ in step_labels(step)),
            "calls_used": step.get("calls_used")}
    if step.get("result") is not None and not step.get("result_sent", True):
        meta["answer_not_sent"] = step["result"]  # the episode ended on this step: the model never saw it
    return meta


def messages(row: Mapping[str, Any], task: Mapping[str, Any]) -> list[ChatMessage]:
    """The sample's messages (`message_texts`), each reply carrying its step's labels as metadata."""
    key = row["rollout_key"]
    texts = message_texts(row, task)
    steps = list(row.get("steps") or [])
    out: list[ChatMessage] = [ChatMessageSystem(id=f"{key}#0", content=texts[0][1], source="input"),
                              ChatMessageUser(id=f"{key}#1", content=texts[1][1], source="input")]
    n, i = 2, 2
    for step in steps:
        out.append(ChatMessageAssistant(id=f"{key}#{n}", content=texts[i][1], model=row.get("model"),
                                        source="generate", metadata=_step_metadata(step)))
        n, i = n + 1, i + 1
        if i < len(texts) and texts[i][0] == "user":
            out.append(ChatMessageUser(id=f"{key}#{n}", content=texts[i][1], metadata={"step": step.get("index")}))
            n, i = n + 1, i + 1
    return out


def _pass_score(value: bool, answer: str | None, explanation: str) -> Score:
    return Score(value=CORRECT if value else INCORRECT, answer=answer, explanation=explanation)


def pair_value(reactive: Mapping[str, Any] | None, predictive: Mapping[str, Any] | None, pair: Pair) -> str | None:
    """The ``pair`` score of one task: both pass, both fail, only <run> passes; None when a side has no verdict."""
    if reactive is None or predictive is None:
        return None
    a, b = reactive.get("final_pass"), predictive.get("final_pass")
    if a is None or b is None:
        return None
    if a == b:
        return PAIR_VALUES[0] if a else PAIR_VALUES[1]
    return f"only {pair.reactive if a else pair.predictive} passes"


def _pair_summary(other: Mapping[str, Any], pair: Pair, run: str) -> dict[str, Any]:
    return {"run": pair.predictive if run == pair.reactive else pair.reactive, "log": pair.log,
            **{k: other.get(k) for k in ("checkpoint", "final_pass", "final_outcome", "first_patch_outcome",
                                         "calls_used", "stop_reason", "ever_revised", "rollout_key")}}


def scores(row: Mapping[str, Any], pair: Pair | None = None, run: str = "") -> dict[str, Score]:
    """The sample's scores (the module rules); `pair` and `run` (this log's run) add the ``pair`` score."""
    out: dict[str, Score] = {}
    if row.get("final_pass") is not None:
        out["final_pass"] = _pass_score(bool(row["final_pass"]), row.get("final_outcome"),
                                        f"final solution.py: {row.get('final_outcome')}")
    first = row.get("first_patch_outcome")
    out["first_patch"] = Score(value=first or "no patch", explanation="the first applied patch's verified outcome")
    if row.get("recovered") is not None:
        out["recovered"] = _pass_score(bool(row["recovered"]), row.get("final_outcome"),
                                       f"first patch {first}, final {row.get('final_outcome')}")
    out["calls_used"] = Score(value=int(row.get("calls_used") or 0), explanation=f"of a budget of {row.get('budget')}")
    out["stop_reason"] = Score(value=str(row.get("stop_reason")))
    if row.get("protocol") == "predictive":
        out["forced_revises"] = Score(value=int(row.get("n_forced") or 0),
                                      explanation="REVISEs forced by a non-PASS prediction")
    if pair is not None:
        sides = (row, pair.other(row)) if run == pair.reactive else (pair.other(row), row)
        if (value := pair_value(*sides, pair)) is not None:
            out["pair"] = Score(value=value, explanation=f"{pair.reactive} vs {pair.predictive}: {pair.log}")
    return out


def sample_metadata(row: Mapping[str, Any], source: Source, index: int, pair: Pair | None = None) -> dict[str, Any]:
    """What leads a sample back to its parquet row, what the scores leave out, and the other run's episode of the
    task in brief (its log, where it has the same sample id)."""
    patches = [{k: s.get(k) for k in PATCH_FIELDS} for s in patch_steps(row.get("steps") or [])]
    keys = ("rollout_key", "trace_id", "arm", "protocol", "variant", "checkpoint", "seed", "split", "sample", "model",
            "client", "budget", "test_cost", "revise_costs_call", "calls_used", "budget_exhausted", "n_patches",
            "n_tests", "n_predictions", "n_malformed_predictions", "n_forced", "n_revised", "ever_revised",
            "first_patch_outcome", "recovered", "final_outcome", "final_pass", "reward", "stop_reason", "ok", "error",
            "request_seed_key", "request_seeds", "final_solution")
    other = pair.other(row) if pair is not None else None
    return {"run": source.run, **{k: row.get(k) for k in keys}, "patches": patches,
            "parquet": source.path, "parquet_row": index,
            **({"pair": _pair_summary(other, pair, source.run)} if other is not None else {})}


def _time(seconds: float | None) -> str | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()


def episode_sample(row: Mapping[str, Any], task: Mapping[str, Any], source: Source, index: int,
                   pair: Pair | None = None) -> EvalSample:
    """One row as one sample (the module rules)."""
    ident, epoch = sample_id(row)
    msgs = messages(row, task)
    model = served_model(row)
    last = next((m.text for m in reversed(msgs) if m.role == "assistant"), "")
    usage = ({model: ModelUsage(input_tokens=int(row["n_input_tokens"]), output_tokens=int(row["n_output_tokens"]),
                                total_tokens=int(row["n_input_tokens"]) + int(row["n_output_tokens"]))}
             if row.get("n_input_tokens") is not None and row.get("n_output_tokens") is not None else {})
    unscored = not row.get("ok", True) or row.get("final_pass") is None
    error = (EvalError(message=row.get("error") or f"no verdict (stop reason {row.get('stop_reason')})",
                       traceback=row.get("error") or "", traceback_ansi=row.get("error") or "")
             if unscored else None)
    created = row.get("created_at")
    return EvalSample(
        id=ident, epoch=epoch, input=msgs[1].text, target="\n".join(task["test_list"]), messages=msgs,
        output=ModelOutput.from_content(model, last), scores=scores(row, pair, source.run),
        metadata=sample_metadata(row, source, index, pair), model_usage=usage, error=error,
        started_at=_time(created - (row.get("wall_s") or 0.0)) if created else None, completed_at=_time(created),
        total_time=row.get("wall_s"), working_time=row.get("model_s"), uuid=f"{source.sha256[:16]}-{index}",
        completed=True,
    )


def _viewer() -> ViewerConfig:
    """The sample list a reader starts from: id, epoch, then the scores to sort and filter on. Model output is shown as
    plain text (trust_content False): it is a policy's raw reply, never markup to render."""
    columns = [TaskSamplesColumn(id="sampleId"), TaskSamplesColumn(id="epoch"),
               *(TaskSamplesColumn.score(name) for name in LIST_SCORES), TaskSamplesColumn(id="tokens")]
    return ViewerConfig(trust_content=False, task_samples_view=TaskSamplesView(name="episodes", columns=columns))


def _rate(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")


def results(rows: Sequence[Mapping[str, Any]], samples: Sequence[EvalSample]) -> EvalResults:
    """The log's headline: pass@1 over the scored rows (as `predict stats` counts it), the recovery rate, and the
    pair counts; each with its n."""
    scored = [bool(r["final_pass"]) for r in rows if r.get("ok", True) and r.get("final_pass") is not None]
    recovered = [bool(r["recovered"]) for r in rows if r.get("ok", True) and r.get("recovered") is not None]
    out = [EvalScore(name="final_pass", scorer="final_pass", scored_samples=len(scored),
                     unscored_samples=len(rows) - len(scored),
                     metrics={"pass@1": EvalMetric(name="pass@1", value=_rate(scored)),
                              "n_pass": EvalMetric(name="n_pass", value=sum(scored))}),
           EvalScore(name="recovered", scorer="recovered", scored_samples=len(recovered),
                     unscored_samples=len(rows) - len(recovered),
                     metrics={"recovery": EvalMetric(name="recovery", value=_rate(recovered))})]
    pairs = [s.scores["pair"].value for s in samples if s.scores and "pair" in s.scores]
    if pairs:
        values = sorted(set(pairs), key=lambda v: (v not in PAIR_VALUES, v))
        out.append(EvalScore(name="pair", scorer="pair", scored_samples=len(pairs),
                             unscored_samples=len(samples) - len(pairs),
                             metrics={v: EvalMetric(name=v, value=pairs.count(v)) for v in values}))
    return EvalResults(total_samples=len(rows), completed_samples=len(rows), scores=out)


def eval_log(rows: Sequence[Mapping[str, Any]], tasks: Mapping[int, Mapping[str, Any]], source: Source,
             pair: Pair | None = None) -> EvalLog:
    """The Inspect log of one evaluation or RL step (`rows`: its parquet's rows in file order; `tasks`: task_id ->
    the split row its prompt is rendered from)."""
    samples = [episode_sample(row, tasks[int(row["task_id"])], source, i, pair) for i, row in enumerate(rows)]
    first = rows[0] if rows else {}
    created = [r["created_at"] for r in rows if r.get("created_at") is not None]
    started = min((c - (r.get("wall_s") or 0.0) for r, c in zip(rows, created, strict=False)), default=None)
    digest = hashlib.sha256(source.sha256.encode()).hexdigest()
    ids = sorted({int(r["task_id"]) for r in rows})
    metadata = {"run": source.run, "arm": first.get("arm"), "protocol": first.get("protocol"),
                "variant": first.get("variant"), "checkpoint": source.checkpoint, "split": source.split,
                "seed": source.seed, "kind": source.kind, "parquet": source.path, "parquet_sha256": source.sha256,
                "paired_with": pair.log if pair else None}
    spec = EvalSpec(
        eval_id=digest[:22], run_id=digest[22:44], created=_time(min(created, default=0.0)) or _time(0.0),
        task=f"predict/{source.run}", task_id=digest[:22], task_display_name=source.label,
        task_args={"run": source.run, "checkpoint": source.checkpoint, "split": source.split, "seed": source.seed},
        dataset=EvalDataset(name=f"mbpp {source.split}", location=source.path, samples=len(ids), sample_ids=ids),
        model=served_model(first), config=EvalConfig(epochs=max((sample_id(r)[1] for r in rows), default=1)),
        metadata=metadata, viewer=_viewer(),
    )
    return EvalLog(status="success", eval=spec, results=results(rows, samples), samples=samples,
                   stats=EvalStats(started_at=_time(started) or "", completed_at=_time(max(created, default=None)) or ""),
                   metadata=metadata)

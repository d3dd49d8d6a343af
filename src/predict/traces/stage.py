"""`predict traces`: the SFT traces of both arms, from the sft split's gold solutions and verified mutants.

Rules:

* Gold first: every task's gold (normalized by ``ast.unparse``, written over the stub) goes through the sandbox.
  Only gold that PASSes in at most ``SLOW_FRACTION`` of the verifier timeout is used (a slow gold, like task 123's
  2.7 s under a 3 s limit, could flip to TIMEOUT on a busy machine, and the traces must replay exactly); the
  others are recorded in ``tasks.parquet`` with the reason.
* Roles are seeded: usable tasks are ordered by ``sha256("{seed}:traces:{task_id}")``; recovery tasks are taken
  from the front of that order, direct tasks are the next ``n_direct`` of the rest.
* Recovery classes follow the mix (`mix_counts`): ``study`` = the writeup's ASSERTION_FAILURE 37 : RUNTIME_ERROR 8
  (never SYNTAX_ERROR or TIMEOUT), scaled to ``n_recovery`` by largest remainder; ``balanced`` = equal shares of
  every class an operator can reach (`mutations.REACHABLE`); or an explicit ``{class: weight}`` mapping. The
  classes are dealt to the recovery tasks in a seeded order. Each task tries its seeded list of mutants
  (`mutations.candidates`) in rounds, one batch of sandbox checks per round; a mutant is kept only when the sandbox
  gives exactly the target class (and, except for TIMEOUT, runs in at most ``SLOW_FRACTION`` of the timeout). A
  task that runs out of candidates hands its class to the next task in the order and may still be a direct trace.
* Rendering steps the real `Episode` for each arm, answering python_test and shadow runs from the verdicts already
  computed (an unverified solution is an error), so what the parquet holds is what the environment says.
  Everything is a function of the config, the seed and the sandbox's verdicts: the same inputs give a
  byte-identical parquet (no durations or times in it).
* A run with its own SFT (`predict.runs`: ``RunSpec.sft_run`` is the run; the environment variants irreversible
  and blind) gets ``{run}.parquet`` from `run_traces`: its base arm's traces (the same tasks, gold, mutants and
  verified classes) re-rendered through the run's own `Episode` (its variant and test cost), answering python_test
  and shadow runs from the verdicts the base arm's file records (gold PASS, the mutant its verified class), so no
  sandbox runs and the run's traces differ from its arm's only where the variant's rules do. Its ``arm`` column is
  the run (the file's SFT), ``protocol`` the arm's.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TaskID

from predict.config import allowed_values
from predict.config.models import TraceMix, TracesSettings
from predict.env.protocol import ProtocolConfig, task_prompt
from predict.outputs import write_rows
from predict.runs import resolve_run
from predict.stages import StageSettings, stage_settings
from predict.traces import mutations
from predict.traces.render import RECOVERY_STYLES, Trace, TraceError, render, solution_text
from predict.vocabulary import Outcome

log = logging.getLogger("predict.traces")

SLOW_FRACTION = 0.5
MAX_CANDIDATES = 12  # natural mutants tried per recovery task (plus `FALLBACKS` fallback ones)
FALLBACKS = 2
CHUNK = 32  # sandbox checks per batch handed to the verifier (a progress step)
STUDY_MIX: dict[str, int] = {"ASSERTION_FAILURE": 37, "RUNTIME_ERROR": 8}
"""The writeup's recovery classes (counts of its 70 recovery traces' faulty patches; scaled to n_recovery)."""
MIXES: tuple[str, ...] = allowed_values(TracesSettings, "mix")  # the presets: study, balanced

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])

TRACE_SCHEMA = pa.schema(
    [
        ("task_id", pa.int64()),
        ("arm", pa.string()),
        ("protocol", pa.string()),
        ("role", pa.string()),
        ("operator", pa.string()),
        ("mutation", pa.string()),
        ("verified_class", pa.string()),
        ("recovery_style", pa.string()),
        ("seed", pa.int64()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("n_messages", pa.int32()),
        ("n_tool_calls", pa.int32()),
        ("faulty_message", pa.int32()),
        ("gold_code", pa.string()),
        ("faulty_code", pa.string()),
    ]
)
"""``results/sft/traces/{arm}.parquet``, one row per trace (the SFT trainer reads ``messages``).

* ``messages``: ``[system, user task, assistant, user result, ..., assistant FINAL]`` (role, content), as the
  rollout program sends them; ``faulty_message``: index in ``messages`` of the assistant turn that writes the faulty
  patch (recovery only; a trainer that should not teach writing bugs masks it), ``n_tool_calls``: budget used.
* The mix table (traces by role and class): count rows by ``role`` and ``verified_class`` (null for direct: the
  gold patch PASSes); by operator: ``operator`` (with ``mutation``, the site); the same in every arm's file.
* Arm A / Arm B of one task share ``task_id``, ``gold_code``, ``faulty_code``, ``operator`` and ``verified_class``.
"""

TASKS_SCHEMA = pa.schema(
    [
        ("task_id", pa.int64()),
        ("role", pa.string()),  # direct | recovery | unused | skipped
        ("reason", pa.string()),  # why skipped, or why a recovery attempt failed
        ("gold_outcome", pa.string()),
        ("target_class", pa.string()),
        ("operator", pa.string()),
        ("verified_class", pa.string()),
        ("candidates_tried", pa.int32()),
    ]
)
"""``results/sft/traces/tasks.parquet``: every sft task's fate (provenance of the role assignment)."""


class TracesConfigError(ValueError):
    """A bad traces setting (the message names the key)."""


def mix_counts(mix: str | Mapping[str, int] | TraceMix, n: int) -> dict[str, int]:
    """Recovery traces per class for `mix` (a preset or {class: weight}, as a mapping or the config's typed
    `TraceMix`), summing to `n` (largest remainder, ties to the class order of `Outcome`)."""
    if isinstance(mix, TraceMix):
        # the typed section holds every class, the ones the config leaves out as None: the mapping the config wrote
        mix = mix.model_dump(exclude_none=True)
    if isinstance(mix, str):
        if mix == "study":
            weights: Mapping[str, int] = STUDY_MIX
        elif mix == "balanced":
            weights = dict.fromkeys(mutations.REACHABLE, 1)
        else:
            raise TracesConfigError(f"traces.mix: unknown mix {mix!r} (presets: {', '.join(MIXES)}, or a mapping)")
    else:
        weights = dict(mix)
    for cls, w in weights.items():
        if cls not in mutations.REACHABLE:
            raise TracesConfigError(f"traces.mix: no operator reaches {cls!r} (reachable: {mutations.REACHABLE})")
        if not isinstance(w, int) or w < 0:
            raise TracesConfigError(f"traces.mix: weight of {cls} must be a non-negative integer, got {w!r}")
    total = sum(weights.values())
    if total == 0:
        raise TracesConfigError("traces.mix: all weights are zero")
    order = [c for c in mutations.REACHABLE if c in weights]
    counts = {c: n * weights[c] // total for c in order}
    rest = sorted(order, key=lambda c: (-(n * weights[c] % total), order.index(c)))
    for c in rest[: n - sum(counts.values())]:
        counts[c] += 1
    return counts


def trace_order(task_ids: Sequence[int], seed: int) -> list[int]:
    return sorted(task_ids, key=lambda t: hashlib.sha256(f"{seed}:traces:{t}".encode()).hexdigest())


def function_name(code: str, tests: Sequence[str]) -> str:
    """The function the tests call (the first top-level def they mention; else the first def)."""
    names = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    for name in names:
        if any(f"{name}(" in t for t in tests):
            return name
    return names[0] if names else "the function"


@dataclass
class _Attempt:
    task_id: int
    target: str
    candidates: list[mutations.Mutant]
    tried: int = 0
    found: mutations.Mutant | None = None


@dataclass
class Synthesis:
    traces: list[Trace]
    tasks: list[dict[str, Any]]
    outcomes: dict[tuple[int, str], Outcome] = field(default_factory=dict)  # (task, solution) -> verified class
    n_checks: int = 0

    def run_tests(self, task_id: int) -> Callable[[str], Outcome]:
        """The episode's run_tests for one task: the sandbox's verdicts, already computed."""

        def run_tests(solution: str) -> Outcome:
            try:
                return self.outcomes[(task_id, solution)]
            except KeyError:
                raise TraceError(f"task {task_id}: unverified solution reached the tests:\n{solution[:200]}") from None

        return run_tests


Check = Callable[[list[tuple[str, Sequence[str], str]]], list[Any]]
"""A batch of (solution, test_list, test_setup_code) -> sandbox verdicts (`Verifier.check_many`)."""


def synthesize(
    tasks: Sequence[Mapping[str, Any]],
    check: Check,
    *,
    n_direct: int,
    n_recovery: int,
    mix: str | Mapping[str, int] | TraceMix,
    seed: int,
    timeout_s: float,
    progress: Progress | None = None,
) -> Synthesis:
    """Pick roles, find verified mutants, return the underlying traces (both arms render from them)."""
    by_id = {int(t["task_id"]): t for t in tasks}
    slow_s = SLOW_FRACTION * timeout_s
    fate: dict[int, dict[str, Any]] = {
        t: {**dict.fromkeys(TASKS_SCHEMA.names), "task_id": t, "role": "unused", "candidates_tried": 0}
        for t in sorted(by_id)
    }
    synthesis = Synthesis([], [])

    def run(items: list[tuple[int, str]]) -> list[Any]:
        synthesis.n_checks += len(items)
        return check([(s, by_id[t]["test_list"], by_id[t]["test_setup_code"] or "") for t, s in items])

    def verify(items: list[tuple[int, str, str]], bar: TaskID | None = None) -> list[Any]:
        """Verdicts of (task, solution, wanted class) items. A verdict that looks like a starved check (TIMEOUT,
        OTHER, or slower than the slow limit; a TIMEOUT that was wanted excepted) is checked once more and the
        second one counts when it is not starved: a busy machine must not change which mutants the traces use."""
        verdicts: list[Any] = []
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            got = run([(t, s) for t, s, _ in chunk])
            again = [i for i, ((_, _, wanted), v) in enumerate(zip(chunk, got, strict=True))
                     if starved(v) and not (v.outcome is Outcome.TIMEOUT and wanted == Outcome.TIMEOUT.value)]
            for i, v in zip(again, run([chunk[i][:2] for i in again]), strict=True):
                if not starved(v):
                    got[i] = v
            verdicts += got
            if progress is not None and bar is not None:
                progress.advance(bar, len(chunk))
        return verdicts

    def starved(v: Any) -> bool:
        return v.outcome in (Outcome.TIMEOUT, Outcome.OTHER) or v.duration_s > slow_s

    gold: dict[int, str] = {}
    for t in sorted(by_id):
        try:
            gold[t] = mutations.normalize(by_id[t]["code"])
        except SyntaxError as e:
            fate[t].update(role="skipped", reason=f"gold does not parse: {e.msg}")
    usable: list[int] = []
    gold_items = [(t, solution_text(g), Outcome.PASS.value) for t, g in gold.items()]
    gold_bar = progress.add_task("gold solutions", total=len(gold_items)) if progress else None
    for (t, text, _), v in zip(gold_items, verify(gold_items, gold_bar), strict=True):
        fate[t]["gold_outcome"] = v.outcome.value
        if v.outcome is not Outcome.PASS:
            fate[t].update(role="skipped", reason=f"gold is {v.outcome.value}: {v.detail}"[:300])
        elif v.duration_s > slow_s:
            log.warning("task %s: gold took %.2f s (limit %.2f s): skipped", t, v.duration_s, slow_s)
            fate[t].update(role="skipped", reason=f"gold is slow (over {slow_s:.2f} s)")
        else:
            synthesis.outcomes[(t, text)] = Outcome.PASS
            usable.append(t)
    order = trace_order(usable, seed)

    counts = mix_counts(mix, n_recovery)
    targets = [c for c, k in counts.items() for _ in range(k)]
    random.Random(seed).shuffle(targets)
    queue, pointer, attempts, recovery = list(targets), 0, [], {}
    found_bar = progress.add_task("verified mutants", total=len(targets)) if progress else None
    while True:
        while queue and pointer < len(order):
            t = order[pointer]
            pointer += 1
            target = queue.pop(0)
            cands = mutations.candidates(gold[t], target, seed, limit=MAX_CANDIDATES, fallbacks=FALLBACKS)
            attempts.append(_Attempt(t, target, cands))
        batch = []
        for a in list(attempts):
            if a.tried >= len(a.candidates):
                attempts.remove(a)
                fate[a.task_id].update(reason=f"no verified {a.target} mutant in {a.tried} candidates",
                                       target_class=a.target, candidates_tried=a.tried)
                queue.insert(0, a.target)
            else:
                batch.append(a)
        if not batch:
            if queue and pointer < len(order):
                continue
            break
        verdicts = verify([(a.task_id, solution_text(a.candidates[a.tried].code), a.target) for a in batch])
        for a, v in zip(batch, verdicts, strict=True):
            mutant = a.candidates[a.tried]
            a.tried += 1
            if v.outcome.value == a.target and (v.outcome is Outcome.TIMEOUT or v.duration_s <= slow_s):
                a.found = mutant
                synthesis.outcomes[(a.task_id, solution_text(mutant.code))] = v.outcome
                attempts.remove(a)
                recovery[a.task_id] = a
                if progress is not None and found_bar is not None:
                    progress.advance(found_bar)
    if queue:
        log.warning("only %d of %d recovery traces: no verified mutant for %s",
                    len(recovery), n_recovery, Counter(queue))

    direct = [t for t in order if t not in recovery][:n_direct]
    if len(direct) < n_direct:
        log.warning("only %d of %d direct traces: %d usable tasks", len(direct), n_direct, len(usable))
    for t in sorted([*recovery, *direct]):
        row = by_id[t]
        base = {"task_id": t, "prompt": task_prompt(row["text"], row["test_list"]),
                "function": function_name(gold[t], row["test_list"]), "gold": gold[t]}
        if t in recovery:
            a = recovery[t]
            assert a.found is not None
            synthesis.traces.append(Trace(**base, role="recovery", faulty=a.found.code, operator=a.found.operator,
                                          mutation=a.found.description, verified_class=a.target))
            fate[t].update(role="recovery", reason=None, target_class=a.target, operator=a.found.operator,
                           verified_class=a.target, candidates_tried=a.tried)
        else:
            synthesis.traces.append(Trace(**base, role="direct"))
            fate[t]["role"] = "direct"
    synthesis.tasks = [fate[t] for t in sorted(fate)]
    return synthesis


def render_arm(
    synthesis: Synthesis, arm: str, config: ProtocolConfig, *, recovery_style: str, seed: int
) -> list[dict[str, Any]]:
    """One arm's parquet rows (in task_id order)."""
    rows = []
    for trace in synthesis.traces:
        messages, episode = render(trace, config, synthesis.run_tests(trace.task_id), recovery_style)
        faulty = None
        if trace.role == "recovery":
            faulty = next(i for i, m in enumerate(messages) if m["role"] == "assistant"
                          and "apply_patch" in m["content"])
        rows.append({
            "task_id": trace.task_id,
            "arm": arm,
            "protocol": config.protocol,
            "role": trace.role,
            "operator": trace.operator,
            "mutation": trace.mutation,
            "verified_class": trace.verified_class,
            "recovery_style": recovery_style,
            "seed": seed,
            "messages": messages,
            "n_messages": len(messages),
            "n_tool_calls": episode.calls_used,
            "faulty_message": faulty,
            "gold_code": trace.gold,
            "faulty_code": trace.faulty,
        })
    return rows


def mix_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Traces by role and verified class (direct: PASS), every reachable class listed: the mix table."""
    counts = Counter((r["role"], r["verified_class"] or "PASS") for r in rows)
    out = [{"role": "direct", "verified_class": "PASS", "count": counts[("direct", "PASS")]}]
    out += [{"role": "recovery", "verified_class": c, "count": counts[("recovery", c)]} for c in mutations.REACHABLE]
    return out


def stage_object(config: StageSettings | Mapping[str, Any], stage: str) -> StageSettings:
    """The typed config the traces read: a stage's own typed object (the traces', the learning-signal run's) as it
    is, a mapping (tests) through `stage`'s row."""
    return config if isinstance(config, StageSettings) else stage_settings(stage, config)


def traces_settings(view: StageSettings) -> TracesSettings:
    """The `traces` section (every key required: config/schema.yaml), checked. The model has already refused a
    bad type or preset; the mix is checked here too because a valid mapping can still name a class no operator
    reaches or weigh every class zero."""
    settings: TracesSettings | None = view.traces
    if settings is None:
        raise TracesConfigError("traces: missing (the SFT traces' settings)")
    if settings.recovery_style not in RECOVERY_STYLES:
        raise TracesConfigError(f"traces.recovery_style: must be one of {RECOVERY_STYLES}")
    mix_counts(settings.mix, settings.n_recovery)  # validates the mix
    return settings


def run_stage(
    tasks: Sequence[Mapping[str, Any]], config: StageSettings | Mapping[str, Any], out_dir: str | Path, *,
    progress: bool = True,
) -> dict[str, Any]:
    """Synthesize, render every arm of the config, write ``{arm}.parquet`` and ``tasks.parquet`` under out_dir.
    `config`: the stage's typed object, the learning-signal run's view, or any config mapping (tests), read through
    ``traces``' row."""
    from predict.sandbox import Verifier

    view = stage_object(config, "traces")
    settings = traces_settings(view)
    verifier, env = view.verifier, view.env
    bars = Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=Console(stderr=True),
                    disable=not progress)
    with bars, Verifier(timeout_s=verifier.timeout_s, memory_mb=verifier.memory_mb,
                        workers=verifier.workers, outcome_labels=verifier.outcome_labels) as v:
        synthesis = synthesize(
            tasks,
            v.check_many,
            n_direct=settings.n_direct,
            n_recovery=settings.n_recovery,
            mix=settings.mix,
            seed=settings.seed,
            timeout_s=verifier.timeout_s,
            progress=bars,
        )
    out_dir = Path(out_dir)
    summary: dict[str, Any] = {"n_checks": synthesis.n_checks, "arms": {}}
    for arm, spec in sorted(view.arms.items()):
        protocol = ProtocolConfig.resolve(spec.protocol, budget=env.budget, revise_costs_call=env.revise_costs_call)
        rows = render_arm(synthesis, arm, protocol, recovery_style=settings.recovery_style, seed=settings.seed)
        write_rows(rows, TRACE_SCHEMA, out_dir / f"{arm}.parquet")
        summary["arms"][arm] = mix_table(rows)
    write_rows(synthesis.tasks, TASKS_SCHEMA, out_dir / "tasks.parquet")
    summary["tasks"] = Counter(t["role"] for t in synthesis.tasks)
    return summary


def trace_of_row(row: Mapping[str, Any], task: Mapping[str, Any]) -> Trace:
    """The underlying trace of one arm's parquet row (every arm's row of a task holds the same one)."""
    prompt = task_prompt(task["text"], task["test_list"])
    if row["messages"][1]["content"] != prompt:
        raise TraceError(f"task {row['task_id']}: the trace's task prompt is not the sft split's")
    return Trace(task_id=int(row["task_id"]), role=row["role"], prompt=prompt,
                 function=function_name(row["gold_code"], task["test_list"]), gold=row["gold_code"],
                 faulty=row["faulty_code"], operator=row["operator"], mutation=row["mutation"],
                 verified_class=row["verified_class"])


def run_traces(
    config: StageSettings | Mapping[str, Any], run: str, arm_rows: Sequence[Mapping[str, Any]],
    tasks: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The parquet rows of a run with its own SFT: its base arm's traces (`arm_rows`, that arm's parquet) rendered
    under the run's protocol (see the module docstring). `tasks`: the sft split. `config`: the stage's typed object,
    or any config mapping (tests), read through ``run-traces``' row."""
    view = stage_object(config, "run-traces")
    spec = resolve_run(view, run)
    if not spec.own_sft:
        raise TracesConfigError(f"run {run}: it trains from {spec.sft_run}'s SFT, so it has no traces of its own")
    settings = traces_settings(view)
    by_id = {int(t["task_id"]): t for t in tasks}
    traces, outcomes = [], {}
    for row in arm_rows:
        if row["arm"] != spec.arm or (row["recovery_style"], row["seed"]) != (settings.recovery_style, settings.seed):
            raise TraceError(f"task {row['task_id']}: a trace of arm {row['arm']} ({row['recovery_style']}, seed "
                             f"{row['seed']}), not of {spec.arm} under the traces settings: rerun `predict traces`")
        if int(row["task_id"]) not in by_id:
            raise TraceError(f"task {row['task_id']}: not in the sft split")
        trace = trace_of_row(row, by_id[int(row["task_id"])])
        traces.append(trace)
        outcomes[(trace.task_id, solution_text(trace.gold))] = Outcome.PASS
        if trace.faulty is not None and trace.verified_class is not None:
            outcomes[(trace.task_id, solution_text(trace.faulty))] = Outcome(trace.verified_class)
    protocol = ProtocolConfig.from_env(spec.env(view).env, spec.protocol, variant=spec.variant)
    return render_arm(Synthesis(traces, [], outcomes), run, protocol, recovery_style=settings.recovery_style,
                      seed=settings.seed)


def run_traces_stage(
    config: StageSettings | Mapping[str, Any], run: str, arm_traces: str | Path, tasks: Sequence[Mapping[str, Any]],
    out: str | Path,
) -> list[dict[str, Any]]:
    """`run_traces` from the base arm's parquet, written to `out`; returns the run's mix table."""
    import pyarrow.parquet as pq

    rows = run_traces(config, run, pq.read_table(arm_traces).to_pylist(), tasks)
    write_rows(rows, TRACE_SCHEMA, out)
    return mix_table(rows)


# `predict traces`: both arms' traces.
def traces_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks-file", required=True, help="the sft split parquet from `predict split`")
    p.add_argument("--out-dir", required=True, help="writes {arm}.parquet for every arm and tasks.parquet")


def traces_main(args: argparse.Namespace, config: StageSettings) -> int:
    import time

    from predict.data import load_split
    from predict.outputs import console, print_table

    started = time.perf_counter()
    summary = run_stage(load_split(args.tasks_file), config, args.out_dir)
    for arm, mix in summary["arms"].items():
        print_table(f"SFT traces, arm {arm}: the mix", ("role", "verified class", "traces"),
                    [(e["role"], e["verified_class"], e["count"]) for e in mix])
    tasks = ", ".join(f"{role} {n}" for role, n in sorted(summary["tasks"].items()))
    console.print(f"sft tasks: {tasks}; {summary['n_checks']} sandbox checks in {time.perf_counter() - started:.1f} s")
    return 0


# `predict run-traces`: a run's own traces.
def run_traces_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="a run whose SFT is its own (RunSpec.sft_run)")
    p.add_argument("--arm-traces", required=True, help="its base arm's traces, results/sft/traces/{arm}.parquet")
    p.add_argument("--tasks-file", required=True, help="the sft split parquet from `predict split`")
    p.add_argument("--out", required=True)


def run_traces_main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.data import load_split
    from predict.outputs import print_table

    mix = run_traces_stage(config, args.run, args.arm_traces, load_split(args.tasks_file), args.out)
    print_table(f"SFT traces, run {args.run}: the mix", ("role", "verified class", "traces"),
                [(e["role"], e["verified_class"], e["count"]) for e in mix])
    return 0

"""Roll a checkpoint out over a split: serve it with vLLM, run the environment, persist the records.

This is the `predict rollout` stage. Finished rollouts are persisted one by one (`ResumableParquet`),
so an interrupted run resumes where it stopped and never redoes a finished rollout. The test split is
*touched once*: a job whose tasks include a test task runs only as an evaluation its campaign admitted
(`predict.campaign.seal.guard_tasks`, by task id), and its ``started`` and ``done`` lines go to the campaign's ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from predict.campaign import SplitGuardError, TestLedger, guard_tasks
from predict.config import config_default
from predict.config.models import EvaluationSettings, ExtensionSettings
from predict.data import load_split
from predict.outputs import ResumableParquet
from predict.stages import StageSettings, stage_settings

__all__ = ["RolloutJob", "SplitGuardError", "roll_out", "run_job"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutJob:
    """One `predict rollout` invocation: which tasks, which model, where the rows go."""

    tasks_path: Path
    split: str
    out: Path
    model: str  # checkpoint folder or HF id
    checkpoint: str  # the name records carry, e.g. "base", "sft", "rl-step-200"
    arm: str
    seed: int
    n_tasks: int | None = None  # first N tasks by task_id; None = all
    samples: int = config_default(EvaluationSettings, "samples")  # rollouts per task
    variant: str = config_default(ExtensionSettings, "variant")
    protocol: str | None = None  # None = the arm's protocol from the config
    client: str = "eval"
    base_url: str | None = None  # an already running endpoint; None = start vLLM here
    test_ledger: Path | None = None  # the campaign's ledger: required when a task is a test task
    sampling: Mapping[str, Any] | None = None  # e.g. evaluation's greedy {temperature, max_tokens}; None = env's
    run: str | None = None  # the study run (arm or ablation) the test ledger keys on; None = the arm
    ledger_extra: Mapping[str, Any] | None = None  # the campaign's admission (campaign id, weights) and more fields
    served_model: str | None = None  # with base_url: the name that endpoint serves the model under; None = model
    evaluation: bool = False  # served and run so that it repeats (predict.serving.identity.evaluation_server/_concurrency)


def select_tasks(rows: Sequence[Mapping[str, Any]], n_tasks: int | None, samples: int) -> list[dict[str, Any]]:
    """The first n_tasks by task_id, each repeated `samples` times with a distinct `sample` index."""
    chosen = sorted(rows, key=lambda r: r["task_id"])[: n_tasks or None]
    return [{**row, "sample": s} for row in chosen for s in range(samples)]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):  # no git, or a git that hangs (a slow shared filesystem)
        return None


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pass {task.fields[passed]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=False,
    )


Config = StageSettings | Mapping[str, Any]
"""What `run_job` and `job_fingerprint` take: a stage's typed object that lists `predict.stages.ROLLOUT` (the rollout
stage's, evaluate's), or a config mapping (a test's), read once through ``rollout``'s row. The rest take the typed
object alone."""


def rollout_config(config: Config) -> StageSettings:
    """The typed object the rollouts read: a stage's own as it is, a mapping through the rollout stage's row."""
    return config if isinstance(config, StageSettings) else stage_settings("rollout", config)


def sandbox_isolation(config: StageSettings) -> dict[str, Any]:
    """Hold the sandbox layers that the rollout's checks get (check_once children of this process, as in the agent
    program) against config verifier.isolation; the record goes into the rollout parquet's metadata."""
    from predict.sandbox import check_isolation, isolation_status

    policy = config.verifier.isolation
    record = check_isolation(isolation_status(), policy.require, policy.accept_weaker)
    if record["missing"]:
        log.warning("weaker sandbox isolation accepted: %s not active", ", ".join(record["missing"]))
    return record


def job_fingerprint(job: RolloutJob, config: Config) -> Any:
    """What shapes a rollout job's rows (`predict.fingerprint`): the env/verifier/protocol config, the model's and
    the tasks' content, the seed and the job's own settings; a `.partial` folder resumes only under the same. The
    config is hashed as plain data (`predict.fingerprint.fingerprint`): the bytes a `.partial` folder was saved
    under."""
    return _fingerprint(job, rollout_config(config))


def _fingerprint(job: RolloutJob, config: StageSettings) -> Any:
    from predict.fingerprint import RESUME_KEYS, fingerprint

    settings = {f.name: getattr(job, f.name) for f in fields(job) if f.name not in (
        "tasks_path", "out", "model", "base_url", "test_ledger", "ledger_extra", "seed", "served_model")}
    return fingerprint(config, RESUME_KEYS["rollout"], inputs={"model": job.model, "tasks": job.tasks_path},
                       seed=job.seed, extra={"job": settings})


@dataclass
class PendingOutput:
    """A rollout job whose rows are all persisted (in `<out>.partial/`) but not yet published to `<out>`.

    A job that evaluates several checkpoints publishes them all at the end: Snakemake deletes every declared
    output of a failed job, so an output published before a later checkpoint fails would be lost, while the
    undeclared partial folder survives and the rerun resumes from it without redoing a rollout."""

    job: RolloutJob
    sink: ResumableParquet
    isolation: dict[str, Any]
    ledger_entry: dict[str, Any]
    summary: dict[str, Any]

    def publish(self) -> dict[str, Any]:
        """Write `<out>`, drop the partial folder and record a finished test evaluation in the ledger, with the
        published file's sha256 (the test statistics read only files the ledger knows)."""
        from predict.fingerprint import file_sha256
        from predict.sandbox import isolation_metadata

        self.sink.finish(metadata=isolation_metadata(self.isolation))
        if self.job.test_ledger is not None:
            done = {**self.ledger_entry, **self.summary, "sha256": file_sha256(self.job.out)}
            TestLedger(self.job.test_ledger).record(done, "done")
        return self.summary


def _rollouts(job: RolloutJob, config: StageSettings) -> tuple[list[dict[str, Any]], ResumableParquet, list[dict[str,
                                                                                                                 Any]]]:
    """The job's rollouts, its persisted rows (after dropping any persisted under another fingerprint: other inputs
    or settings) and the rollouts not persisted yet."""
    from predict.env.records import RECORD_SCHEMA
    from predict.fingerprint import resumable_rows

    tasks = select_tasks(load_split(job.tasks_path), job.n_tasks, job.samples)
    guard_job(job, [t["task_id"] for t in tasks])  # before the .partial folder (or a server) exists
    sink = resumable_rows(job.out, RECORD_SCHEMA, ("task_id", "sample"), _fingerprint(job, config))
    done = sink.done()
    return tasks, sink, [t for t in tasks if (t["task_id"], t["sample"]) not in done]


class EvaluationRolloutsFailed(RuntimeError):
    """An evaluation whose rollouts failed (``ok`` false: a model server that refused or died, a harness error) is
    not published: its rows would be no result (the statistics drop them, and a test evaluation is run once). The
    rollouts that ran are kept in the job's partial folder; a rerun runs the failed ones again."""

    def __init__(self, job: RolloutJob, failed: Sequence[Mapping[str, Any]], kept: int) -> None:
        first = "; ".join(f"task {r['task_id']}: {(r.get('error') or 'no error recorded').splitlines()[0][:200]}"
                          for r in failed[:3])
        super().__init__(
            f"{job.out}: {len(failed)} of the {job.run or job.arm} {job.checkpoint} {job.split} evaluation's rollouts "
            f"failed, so nothing is published ({first}). The {kept} that ran are kept and a rerun runs the rest; "
            "look at the server log beside the output"
        )


def guard_job(job: RolloutJob, task_ids: Sequence[int]) -> None:
    """`predict.campaign.seal.guard_tasks` for this job: a test task only in an evaluation its campaign admitted."""
    admission = dict(job.ledger_extra or {}) if job.test_ledger is not None else None
    guard_tasks(split=job.split, tasks_path=job.tasks_path, task_ids=task_ids, run=job.run or job.arm,
                checkpoint=job.checkpoint, seed=job.seed,
                admission=admission if admission and "campaign" in admission else None, ledger=job.test_ledger)


def rollout_settings(job: RolloutJob, config: StageSettings, *, base_url: str, model: str) -> Any:
    """The `predict.env.runner.RolloutSettings` a job's rollouts run under, against the endpoint `base_url` serving
    `model`: the study config's, the job's arm, seed, checkpoint, variant, client and sampling, and, for an
    evaluation, the requests in flight that repeat (`predict.serving.identity.evaluation_concurrency`)."""
    from predict.env.runner import RolloutSettings
    from predict.serving.identity import evaluation_concurrency

    settings = RolloutSettings.from_study_config(
        config,
        arm=job.arm,
        seed=job.seed,
        checkpoint=job.checkpoint,
        base_url=base_url,
        model=model,
        variant=job.variant,
        client=job.client,
        split=job.split,
        **({"protocol": job.protocol} if job.protocol else {}),
        **dict(job.sampling or {}),
    )
    if job.evaluation:
        settings = dataclasses.replace(settings, concurrency=evaluation_concurrency(config.serving,
                                                                                    settings.concurrency))
    return settings


def remaining_rollouts(job: RolloutJob, config: StageSettings) -> int:
    """How many of the job's rollouts are not persisted yet (0: publishing needs no server)."""
    return len(_rollouts(job, config)[2])


def run_job(job: RolloutJob, config: Config) -> dict[str, Any]:
    """Run (or resume) one rollout job and write its parquet. Returns a short summary."""
    return roll_out(job, rollout_config(config)).publish()


def roll_out(job: RolloutJob, config: StageSettings) -> PendingOutput:
    """Run (or resume) one rollout job's rollouts, persisting each as it finishes; publish with `.publish()`."""
    from predict.env.runner import run_rollouts_sync
    from predict.serving.identity import evaluation_server
    from predict.serving.server import SERVED_NAME, VLLMServer

    isolation = sandbox_isolation(config)  # before anything is read: a missing sandbox layer stops the stage
    tasks, sink, todo = _rollouts(job, config)  # guarded (`guard_job`) before anything is written
    log.info("%d rollouts, %d already persisted, %d to run", len(tasks), len(tasks) - len(todo), len(todo))
    ledger_entry = {
        "run": job.run or job.arm,
        "arm": job.arm,
        "checkpoint": job.checkpoint,
        "seed": job.seed,
        "model": job.model,
        "n_rollouts": len(tasks),
        "out": str(job.out),
        "git_commit": _git_commit(),
        **dict(job.ledger_extra or {}),
    }
    if job.test_ledger is not None:
        TestLedger(job.test_ledger).record(ledger_entry, "started")

    timing: dict[str, float] = {}
    failed: list[dict[str, Any]] = []
    if todo:
        serving = config.serving
        server = (
            contextlib.nullcontext(None)
            if job.base_url
            else VLLMServer.from_serving(
                job.model,
                serving,
                sequences=config.env.concurrency,
                served_model_name=SERVED_NAME,  # records name one model whichever server ran (and one can be shared)
                log_path=job.out.with_name(job.out.stem + ".vllm.log"),
                **(evaluation_server(serving) if job.evaluation else {}),
            )
        )
        t0 = time.perf_counter()
        with server as srv:
            if srv is not None:  # started here; with job.base_url the caller's server (evaluate reports its serve_s)
                timing["server_start_s"] = time.perf_counter() - t0
            settings = rollout_settings(job, config, base_url=job.base_url or srv.base_url,
                                        model=srv.model_name if srv is not None else (job.served_model or job.model))
            passed = sum(bool(r["final_pass"]) for r in sink.rows)
            t1 = time.perf_counter()
            with _progress() as bar:
                bar_task = bar.add_task("rollouts", total=len(tasks), completed=len(tasks) - len(todo), passed=passed)

                def on_record(record: dict[str, Any]) -> None:
                    nonlocal passed
                    if job.evaluation and not record["ok"]:  # not a result: kept out, so a rerun runs it again
                        failed.append(record)
                    else:
                        sink.append([record])  # persisted before anything else can fail
                    passed += bool(record["final_pass"])
                    bar.update(bar_task, advance=1, passed=passed)

                run_rollouts_sync(todo, settings, on_record=on_record)
            timing["rollouts_s"] = time.perf_counter() - t1
    if failed:
        raise EvaluationRolloutsFailed(job, failed, len(sink.rows))
    rows = sink.rows
    summary = {
        "rollouts": len(rows),
        "ran": len(todo),
        "pass_rate": sum(bool(r["final_pass"]) for r in rows) / max(len(rows), 1),
        "failed_infra": sum(not r["ok"] for r in rows),
        **timing,
    }
    if todo:
        summary["rollouts_per_s"] = len(todo) / timing["rollouts_s"]
    return PendingOutput(job, sink, isolation, ledger_entry, summary)


# `predict rollout`
def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def arguments(p: argparse.ArgumentParser) -> None:
    from predict.vocabulary import VARIANTS

    p.add_argument("--tasks-file", required=True, help="split parquet from `predict split`")
    p.add_argument("--split", required=True, choices=["sft", "rl", "val", "test"])
    p.add_argument("--model", required=True, help="checkpoint folder or HF id")
    p.add_argument("--checkpoint", required=True, help="the name records carry, e.g. base")
    p.add_argument("--arm", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--n-tasks", type=int, default=None,
                   help="first N tasks by task_id (default: env.rollout_tasks; all when it is null)")
    p.add_argument("--samples", type=int, default=RolloutJob.samples, help="rollouts per task")
    p.add_argument("--protocol", choices=["reactive", "predictive"], default=None, help="default: the arm's")
    p.add_argument("--variant", choices=list(VARIANTS), default=RolloutJob.variant,
                   help="protocol variant (src/predict/env/protocol.py)")
    p.add_argument("--test-cost", type=positive_int, default=None,
                   help="budget calls per python_test (default: env.test_cost)")
    p.add_argument("--max-chained-revisions", type=positive_int, default=None,
                   help="edit_on_revise: replacement patches in a row (default: env.max_chained_revisions)")
    p.add_argument("--client", choices=["eval", "train"], default="eval", help="train = record token ids")
    p.add_argument("--base-url", default=None, help="use this running endpoint instead of starting vLLM")
    p.add_argument("--out", required=True)


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.config import ConfigError
    from predict.outputs import print_summary
    from predict.runs import with_env

    # the flags' env overrides: what the job reads and what its fingerprint hashes are the overridden env
    study = with_env(config, test_cost=args.test_cost, max_chained_revisions=args.max_chained_revisions)
    job = RolloutJob(
        tasks_path=Path(args.tasks_file),
        split=args.split,
        out=Path(args.out),
        model=args.model,
        checkpoint=args.checkpoint,
        arm=args.arm,
        seed=args.seed,
        n_tasks=args.n_tasks if args.n_tasks is not None else study.env.rollout_tasks,
        samples=args.samples,
        variant=args.variant,
        protocol=args.protocol,
        client=args.client,
        base_url=args.base_url,
    )  # no test ledger: the test split belongs to the test campaign (`predict evaluate --split test`)
    if args.arm not in study.arms:
        raise ConfigError(f"{args.config or 'config'}: arms: no arm {args.arm!r} (have {', '.join(study.arms)})")
    summary = run_job(job, study)
    print_summary(f"rollouts: arm {job.arm}, {job.checkpoint}, {job.split}, seed {job.seed}", summary)
    return 0

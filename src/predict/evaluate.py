"""Greedy evaluation of a study run's checkpoints, and the test campaign: the `predict evaluate` stage.

Rules:

* Evaluation is pass@1 with its own sampling settings, the config's ``evaluation`` section (the paper: temperature
  0, one sample per task), never the training rollouts' ``env.temperature``. Everything else (protocol, budget,
  verifier) is the rollout stage's (`predict.rollouts`), and the rows keep the per-trajectory record schema.
* A run is an arm (``arms``: A, B) or an ablation (``ablations``: each its base arm, Arm B, with one factor
  changed: ``variant`` is a protocol change applied here, ``alpha`` a training change that only its checkpoints
  carry). An extension (``extensions``) is the same overlay; its ``variant`` and ``test_cost`` apply here, its
  ``mask_decision`` and ``trainer`` only shaped its checkpoints. Records carry the base arm in ``arm``; the run is the
  first folder of the output path (``results/eval/{run}/{checkpoint}/{split}/seed{seed}.parquet``).
* One job evaluates all of a run/seed's checkpoints on a split with ONE vLLM server (`CheckpointServer`): started for
  the first checkpoint that has rollouts left, its weights reloaded in place for the next (an HF id, which has no
  folder to reload from, gets a fresh server). Outputs stay one parquet per checkpoint, all published at the end:
  Snakemake deletes a failed job's declared outputs, never the `.partial` folders a rerun resumes from.
* Evaluation repeats: its server is batch-invariant on a GPU, else it sends one request at a time
  (`predict.serving.identity.evaluation_server`, `evaluation_concurrency`); `predict.serving.identity.serving_identity` says what
  its rows then depend on besides the checkpoint and the config (the campaign line records it).
* The stage reads its own typed object (`predict.stages.stage_model`: the evaluate row on val, evaluate-test on
  test) as attributes. What is hashed or recorded (the design hash, the ledger's evaluation section and serving
  settings, the rollouts' sampling, which their resume fingerprint holds) takes its plain data
  (`predict.config.models.plain_data`): the bytes of the slice, so no frozen design, ledger line or `.partial` folder
  changes with the typed object.
* On test, every checkpoint of the job is admitted by the campaign (`predict.campaign.admission.TestLedger.admit`:
  the plan, the design, the registry outside results_dir, the weights' hash) before any server starts; the campaign
  package's modules hold the rules. Selection (`predict.campaign.selection.select`) reads only val evaluations.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from predict.campaign import (
    SplitGuardError,
    TestLedger,
    campaign_from_stats,
    config_hash,
    evaluation_ledger,
    read_selection,
    results_origin,
    serving_dependencies,
)
from predict.config.models import plain_data
from predict.rollouts import RolloutJob, remaining_rollouts, roll_out, run_job
from predict.runs import resolve_run
from predict.serving.server import SERVED_NAME  # every checkpoint is served under it
from predict.stages import StageSettings, stage_settings

log = logging.getLogger(__name__)

Config = StageSettings | Mapping[str, Any]
"""A stage's typed object, or a config mapping (a whole config or a slice: tests, the bundle's replay) that its
holder reads once through the split's row (`evaluation_config`). Below the stage every function takes the typed
object alone."""

SAMPLING = ("temperature", "max_tokens")
"""The evaluation keys every request's sampling takes (the rest say which tasks, how often)."""


def evaluation_config(config: Config, split: str) -> StageSettings:
    """The typed object evaluation reads: the stage's own as it is, a mapping through the row of the stage that
    evaluates `split` (evaluate-test on test, which the ledger's design needs; evaluate otherwise)."""
    if isinstance(config, StageSettings):
        return config
    return stage_settings("evaluate-test" if split == "test" else "evaluate", config)


def run_identity(config: Mapping[str, Any], run: str) -> tuple[str, str]:
    """(arm, variant) of a study run (see `predict.runs`)."""
    spec = resolve_run(config, run)
    return spec.arm, spec.variant


def selected_checkpoint(selection: Sequence[Mapping[str, Any]], run: str, seed: int, where: Path) -> dict[str, Any]:
    """The selection row of run/seed from `predict stats`' selection.parquet."""
    rows = [r for r in selection if (r["run"], r["seed"]) == (run, seed)]
    if not rows:
        raise SplitGuardError(f"{where}: no checkpoint selection for run {run} seed {seed}")
    return rows[0]


def evaluation_job(
    config: StageSettings,
    *,
    run: str,
    checkpoint: str,
    split: str,
    seed: int,
    tasks_path: Path,
    model: str,
    out: Path,
    base_url: str | None = None,
    test_ledger: Path | None = None,
    selection: Sequence[Mapping[str, Any]] | None = None,
) -> RolloutJob:
    """The rollout job of one greedy evaluation (see the module docstring). On test it needs the ledger and the val
    selection (recorded with each evaluation); the campaign's admission is added by `evaluate_checkpoints`."""
    spec = resolve_run(config, run)
    study = spec.env(config)  # the run's test_cost reaches the rollouts (extension expensive_tests_*)
    ev = study.evaluation
    # Plain data for what is hashed or recorded (`plain_data`: the slice's bytes): the design hash, the ledger's
    # evaluation section, and `sampling`, which the rollouts' resume fingerprint holds (a YAML `temperature: 0`
    # hashes as 0, not as its typed 0.0, which would discard a .partial folder).
    evaluation = plain_data(ev)
    ledger_extra = None
    if split == "test":
        if test_ledger is None or selection is None:
            raise SplitGuardError("the test split is evaluated once, by the test campaign (snakemake test), which "
                                  "passes the ledger and the checkpoint selection")
        chosen = selected_checkpoint(selection, run, seed, test_ledger)
        ledger_extra = {"config_hash": config_hash(plain_data(study)), "selection": chosen, "evaluation": evaluation}
    return RolloutJob(
        tasks_path=tasks_path,
        split=split,
        out=out,
        model=model,
        checkpoint=checkpoint,
        arm=spec.arm,
        seed=seed,
        n_tasks=ev.tasks,  # null or left out (it has no default to fill in): every task
        samples=ev.samples,
        variant=spec.variant,
        client="eval",
        base_url=base_url,
        test_ledger=test_ledger if split == "test" else None,
        sampling={key: value for key, value in evaluation.items() if key in SAMPLING},  # plain: see above
        run=run,
        ledger_extra=ledger_extra,
        evaluation=True,
    )


def evaluate(config: Config, **kw: Any) -> dict[str, Any]:
    """Run (or resume) one evaluation on val; returns the rollout stage's summary. (The test split goes through
    `evaluate_checkpoints`, which asks the ledger first.)"""
    if kw.get("split") == "test":
        raise SplitGuardError("the test split is evaluated by evaluate_checkpoints, which asks the test ledger")
    config = evaluation_config(config, kw["split"])
    return run_job(evaluation_job(config, **kw), resolve_run(config, kw["run"]).env(config))


@dataclass(frozen=True)
class CheckpointEval:
    """One checkpoint of an evaluation job: its name, what vLLM loads, where its rows go; its run and seed when they
    are not the job's (the test campaign as one job, `evaluate_checkpoints`)."""

    checkpoint: str
    model: str
    out: Path
    run: str | None = None
    seed: int | None = None


class CheckpointServer:
    """One vLLM server for a run/seed's checkpoints: started for the first one, its weights reloaded in place for
    each next one (`VLLMServer.reload_weights`, as RL does between steps), restarted only for a model that is not
    a local folder (an HF id). Every checkpoint is served under `SERVED_NAME`."""

    def __init__(self, serving: Any, log_path: Path, *, sequences: int) -> None:
        """`serving`: the config's typed ``serving`` section (`predict.config.models.ServingSettings`)."""
        self.serving, self.log_path, self.sequences = serving, log_path, sequences
        self.server: Any = None  # predict.serving.server.VLLMServer
        self.starts = self.reloads = 0

    def load(self, model: str, version: str) -> str:
        """Serve `model`; returns the base URL."""
        from predict.serving.identity import evaluation_server
        from predict.serving.server import VLLMServer

        if self.server is not None and Path(model).is_dir():
            self.server.reload_weights(model, version=version)
            self.reloads += 1
            return self.server.base_url
        self.close()
        self.server = VLLMServer.from_serving(
            model, self.serving, sequences=self.sequences, served_model_name=SERVED_NAME, worker_extension=True,
            log_path=self.log_path, **evaluation_server(self.serving),
        ).start()
        self.starts += 1
        return self.server.base_url

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> CheckpointServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def evaluate_checkpoints(
    config: StageSettings,
    *,
    run: str,
    split: str,
    seed: int,
    tasks_path: Path,
    checkpoints: Sequence[CheckpointEval],
    base_url: str | None = None,
    test_ledger: Path | None = None,
    selection_path: Path | None = None,
    val_metrics: Path | None = None,
    new_campaign: str | None = None,
) -> list[dict[str, Any]]:
    """Evaluate (or resume) a run/seed's checkpoints on a split with one server; one summary per checkpoint. A
    checkpoint that names its own run and seed is evaluated as theirs (the test campaign as one job of many runs,
    where the run's jobs share one server: workflow/rules/evaluation.smk); all are admitted together.
    `base_url`: an endpoint already serving (tests); then no server is started and nothing is reloaded. On test:
    the val statistics' `selection_path` and `val_metrics`, and, for a declared second campaign on the split,
    `new_campaign` (its reason); the ledger is the checkout's registry (`predict.campaign.ledger.evaluation_ledger`:
    `test_ledger` may only name it). No job's rows are persisted and no server starts before its tasks are
    guarded (`predict.rollouts.guard_job`) and, on test, every checkpoint admitted."""
    if not checkpoints:
        raise ValueError(f"run {run} seed {seed}: no checkpoint to evaluate")
    sequences = config.env.concurrency  # a run's env changes test_cost only
    if split == "test":
        test_ledger = evaluation_ledger(test_ledger)  # the registry, never a ledger made here
        if selection_path is None or val_metrics is None:
            raise SplitGuardError("the test campaign needs the val statistics' selection.parquet (--selection) and "
                                  "metrics.parquet (--val-metrics): they decide the campaign's list")
    selection = read_selection(selection_path) if selection_path is not None else None
    owners = [(c.run or run, seed if c.seed is None else c.seed) for c in checkpoints]  # (run, seed) of each
    jobs = [evaluation_job(config, run=r, checkpoint=c.checkpoint, split=split, seed=sd, tasks_path=tasks_path,
                           model=c.model, out=c.out, base_url=base_url, test_ledger=test_ledger,
                           selection=selection) for c, (r, sd) in zip(checkpoints, owners, strict=True)]
    if split == "test":
        assert test_ledger is not None and selection_path is not None and val_metrics is not None
        design = plain_data(config)  # the campaign hashes the design and records it in the ledger
        admissions = TestLedger(test_ledger).admit(  # every checkpoint admitted before any server starts
            design, campaign_from_stats(design, val_metrics, selection_path),
            [(r, job.checkpoint, sd, job.model) for job, (r, sd) in zip(jobs, owners, strict=True)],
            tasks_path=tasks_path, selection=selection or (),
            depends_on=serving_dependencies(config.serving, sequences),
            origin=results_origin(jobs[0].out),
            new_campaign=new_campaign,
        )
        jobs = [replace(job, ledger_extra={**dict(job.ledger_extra or {}), **a.fields()})
                for job, a in zip(jobs, admissions, strict=True)]
    pending = []
    log_path = jobs[0].out.with_name(jobs[0].out.stem + ".vllm.log")
    with CheckpointServer(config.serving, log_path, sequences=sequences) as server:
        for job, (job_run, _) in zip(jobs, owners, strict=True):
            run_study = resolve_run(config, job_run).env(config)
            serve_s = 0.0
            if base_url is None and remaining_rollouts(job, run_study):
                t0 = time.perf_counter()
                job = replace(job, base_url=server.load(job.model, version=job.checkpoint), served_model=SERVED_NAME)
                serve_s = time.perf_counter() - t0
            out = roll_out(job, run_study)
            out.summary["serve_s"] = serve_s
            pending.append(out)
        starts, reloads = server.starts, server.reloads
    summaries = [p.publish() for p in pending]
    log.info("%s on %s: %d checkpoints, %d server start(s), %d in-place reload(s)",
             ", ".join(sorted({f"{r} seed {sd}" for r, sd in owners})), split, len(jobs), starts, reloads)
    return [{"run": r, "seed": sd, "checkpoint": j.checkpoint, **s, "server_starts": starts}
            for j, s, (r, sd) in zip(jobs, summaries, owners, strict=True)]


# `predict evaluate` (`--split test`: the test campaign, with the stage table entry evaluate-test)
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="append", required=True,
                   help="an arm (A, B) or an ablation (alpha0, forced_keep, ...): once for every checkpoint, or once "
                        "per --checkpoint (the test campaign as one job)")
    p.add_argument("--split", required=True, choices=["val", "test"])
    p.add_argument("--seed", type=int, action="append", required=True,
                   help="once for every checkpoint, or once per --checkpoint")
    p.add_argument("--tasks-file", required=True, help="split parquet from `predict split`")
    p.add_argument("--checkpoint", action="append", required=True,
                   help="base, sft or step<N>; repeat with --model and --out for each checkpoint, in order")
    p.add_argument("--model", action="append", required=True, help="checkpoint folder or HF id (per --checkpoint)")
    p.add_argument("--out", action="append", required=True, help="its parquet (per --checkpoint)")
    p.add_argument("--base-url", default=None, help="use this running endpoint instead of starting vLLM")
    p.add_argument("--test-ledger", default=None,
                   help="refused unless it names the checkout's registry (.test-campaigns/ledger.jsonl), where every "
                        "test evaluation records: a ledger is never created elsewhere (reading one for analysis is "
                        "`predict stats --test-ledger`)")
    p.add_argument("--selection", default=None, help="test only: selection.parquet from `predict stats` on val")
    p.add_argument("--val-metrics", default=None, help="test only: metrics.parquet from `predict stats` on val")
    p.add_argument("--new-campaign", default=None, metavar="WHY",
                   help="test only: declare a second campaign on this split and base model, and why (config "
                        "evaluation.new_campaign); the report lists every campaign with its reason")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import print_summary

    n = len(args.checkpoint)
    if not (n == len(args.model) == len(args.out)) or len(args.run) not in (1, n) or len(args.seed) not in (1, n):
        raise SystemExit(f"evaluate: give one --model and one --out per --checkpoint, and --run and --seed once or "
                         f"once per --checkpoint (got {n} --checkpoint, {len(args.model)} --model, {len(args.out)} "
                         f"--out, {len(args.run)} --run, {len(args.seed)} --seed)")
    runs, seeds = args.run * (n // len(args.run)), args.seed * (n // len(args.seed))
    summaries = evaluate_checkpoints(
        config,
        run=runs[0],
        split=args.split,
        seed=seeds[0],
        tasks_path=Path(args.tasks_file),
        checkpoints=[CheckpointEval(c, m, Path(o), r, sd)
                     for c, m, o, r, sd in zip(args.checkpoint, args.model, args.out, runs, seeds, strict=True)],
        base_url=args.base_url,
        test_ledger=Path(args.test_ledger) if args.test_ledger else None,
        selection_path=Path(args.selection) if args.selection else None,
        val_metrics=Path(args.val_metrics) if args.val_metrics else None,
        # evaluation.new_campaign is in evaluate-test's row only (a val evaluation reading it raises SliceError)
        new_campaign=args.new_campaign or (config.evaluation.new_campaign if args.split == "test" else None),
    )
    for summary in summaries:
        run, seed, checkpoint = summary.pop("run"), summary.pop("seed"), summary.pop("checkpoint")
        print_summary(f"greedy evaluation: {run}, {checkpoint}, {args.split}, seed {seed}", summary)
    return 0

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
  (`predict.serve.evaluation_environment`, `evaluation_concurrency`); `predict.serve.serving_identity` says what
  its rows then depend on besides the checkpoint and the config.
* Checkpoint selection (`predict.stats.select_checkpoints`) reads only val evaluations.
* The test split is touched by the test campaign alone, once per frozen design (`TestLedger`,
  ``results/test/ledger.jsonl``). Its first evaluation records the config hash (of what shapes results:
  `config_hash` leaves out `NOT_RESULT_SHAPING`) and the full list of (run, checkpoint, seed) the campaign evaluates
  (`campaign_plan`: per run and seed the checkpoint selection chose on val, for the arms also
  ``evaluation.reference``, and ``evaluation.test_checkpoints`` where evaluated on val). Refused, each naming the
  ledger and what differs: an evaluation outside that list, a second evaluation of an entry, any evaluation under
  another config hash. An interrupted campaign resumes from its persisted rollouts; that is not a second evaluation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from predict.rollouts import (
    RolloutJob,
    SplitGuardError,
    ledger_lock,
    read_ledger,
    remaining_rollouts,
    roll_out,
    run_job,
)
from predict.runs import resolve_run, study_runs
from predict.serve import SERVED_NAME  # every checkpoint is served under it
from predict.stages import UNTRACKED, without_keys

log = logging.getLogger(__name__)

EVALUATION_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "max_tokens": 512, "samples": 1, "tasks": None}


# Config keys (dotted) that shape no evaluation: names, where results go, the report's wording, the power grid, SLURM
# sizes, the statistics' bootstrap, and how jobs are served (stages.UNTRACKED: one shared server or one per job).
# Changing them is not a new design, so the test campaign's hash leaves them out.
NOT_RESULT_SHAPING = ("run_name", "results_dir", "report", "power", "cluster", "evaluation.bootstrap", *UNTRACKED)


def design_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config without `NOT_RESULT_SHAPING`: what a frozen design is."""
    return without_keys(config, NOT_RESULT_SHAPING)


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the design (`design_config`) as canonical JSON: what the test ledger records."""
    return hashlib.sha256(json.dumps(design_config(config), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs (for a message that says what changed)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in config_differences(old.get(key), new.get(key), f"{prefix}{key}.")]  # fmt: skip
    return [] if old == new else [prefix.rstrip(".") or "(whole config)"]


def evaluation_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation section over its defaults, as plain data: it goes into rollout jobs and ledger entries, which
    are copied and serialised (a stage's config view is a dict subclass that dataclasses.asdict cannot rebuild)."""
    return json.loads(json.dumps({**EVALUATION_DEFAULTS, **dict(config.get("evaluation") or {})}))


def run_identity(config: Mapping[str, Any], run: str) -> tuple[str, str]:
    """(arm, variant) of a study run (see `predict.runs`)."""
    spec = resolve_run(config, run)
    return spec.arm, spec.variant


def selected_checkpoint(selection_path: Path, run: str, seed: int) -> dict[str, Any]:
    """The selection row of run/seed from `predict stats`' selection.parquet."""
    rows = [r for r in pq.read_table(selection_path).to_pylist() if (r["run"], r["seed"]) == (run, seed)]
    if not rows:
        raise SplitGuardError(f"{selection_path}: no checkpoint selection for run {run} seed {seed}")
    return rows[0]


# -- the test campaign: which (run, checkpoint, seed) it evaluates ----------------------------------------------------

CampaignEntry = tuple[str, str, int]  # (run, checkpoint, seed)


def campaign_checkpoints(config: Mapping[str, Any], run: str, val_checkpoints: Sequence[str], selected: str) -> list[str]:
    """A run/seed's test checkpoints: for an arm its reference (the SFT), then the one selection chose on val, then
    any of ``evaluation.test_checkpoints`` it was evaluated at on val (fixed in the config before the campaign)."""
    ev = config.get("evaluation") or {}
    reference = ev.get("reference", "sft")
    wanted = [reference] if run in config["arms"] and reference else []
    wanted += [selected, *(ev.get("test_checkpoints") or [])]
    return [c for c in dict.fromkeys(wanted) if c == selected or c in val_checkpoints]


def campaign_plan(config: Mapping[str, Any], val_checkpoints: Mapping[tuple[str, int], Sequence[str]],
                  selected: Mapping[tuple[str, int], str]) -> list[CampaignEntry]:
    """Every (run, checkpoint, seed) the campaign evaluates, in study order (`predict.runs.study_runs`)."""
    order = {run: i for i, run in enumerate(study_runs(config))}
    keys = sorted(selected, key=lambda rs: (order.get(rs[0], len(order)), rs[0], rs[1]))
    return [(run, c, seed) for run, seed in keys
            for c in campaign_checkpoints(config, run, val_checkpoints.get((run, seed), ()), selected[(run, seed)])]


def planned_selection(config: Mapping[str, Any], val_checkpoints: Mapping[tuple[str, int], Sequence[str]]) -> dict:
    """The checkpoint `evaluation.selection.mode: fixed` chooses, known before any evaluation (the workflow builds
    the campaign's jobs from it): `predict.stats.select_checkpoints` itself, given the val checkpoints."""
    from predict.stats import select_checkpoints  # noqa: PLC0415

    selection = (config.get("evaluation") or {}).get("selection") or {"mode": "fixed", "step": 100}
    if selection["mode"] != "fixed":
        raise ValueError(f"evaluation.selection.mode {selection['mode']!r}: the choice is known only after val")
    metrics = [{"run": run, "seed": seed, "checkpoint": c, "split": "val", "pass_at_1": math.nan}
               for (run, seed), checkpoints in val_checkpoints.items() for c in checkpoints]  # fmt: skip
    return {(r["run"], r["seed"]): r["checkpoint"] for r in select_checkpoints(metrics, "fixed", selection.get("step"))}


def campaign_from_stats(config: Mapping[str, Any], val_metrics: Path, selection_path: Path) -> list[CampaignEntry]:
    """The campaign plan from the val statistics: the checkpoints each run/seed was evaluated at (metrics.parquet)
    and the one selection chose (selection.parquet)."""
    val_checkpoints: dict[tuple[str, int], list[str]] = {}
    for row in pq.read_table(val_metrics, columns=["run", "checkpoint", "split", "seed"]).to_pylist():
        if row["split"] == "val":
            val_checkpoints.setdefault((row["run"], int(row["seed"])), []).append(row["checkpoint"])
    selected = {(r["run"], int(r["seed"])): r["checkpoint"] for r in pq.read_table(selection_path).to_pylist()}
    return campaign_plan(config, val_checkpoints, selected)


class TestLedger:
    """``results/test/ledger.jsonl``: one campaign per frozen design (see the module docstring). Its first line is
    the campaign (config hash, the design, the plan); then a ``started`` and a ``done`` line per evaluation."""

    __test__ = False  # not a pytest class

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def entries(self) -> list[dict[str, Any]]:
        return [e for _, e in read_ledger(self.path)]

    def admit(self, config: Mapping[str, Any], plan: Sequence[CampaignEntry], run: str, checkpoint: str,
              seed: int) -> None:
        """Record the campaign on its first evaluation; refuse this one if it is outside the campaign's list, was
        done before, or runs under another config hash."""
        entry, digest = (run, checkpoint, int(seed)), config_hash(config)
        with ledger_lock(self.path):
            entries = read_ledger(self.path)
            campaign = next((e for _, e in entries if e.get("event") == "campaign"), None)
            if campaign is None:
                campaign = {"event": "campaign", "config_hash": digest, "design": design_config(config),
                            "plan": [list(e) for e in plan], "time": time.strftime("%FT%T%z")}  # fmt: skip
                with open(self.path, "a") as f:
                    f.write(json.dumps(campaign, sort_keys=True) + "\n")
                log.info("%s: test campaign frozen: config hash %s, %d evaluations", self.path, digest[:12], len(plan))
            if campaign["config_hash"] != digest:
                changed = config_differences(campaign.get("design"), design_config(config))
                raise SplitGuardError(
                    f"{self.path}: the test campaign was frozen at {campaign['time']} under config hash "
                    f"{campaign['config_hash'][:12]}; this evaluation ({run} {checkpoint} seed {seed}) runs under "
                    f"{digest[:12]}, which differs in {', '.join(changed[:8]) or 'the design'}: the test split is "
                    "touched once per frozen design"
                )
            planned = [tuple(e) for e in campaign["plan"]]
            if entry not in planned:
                raise SplitGuardError(
                    f"{self.path}: {run} {checkpoint} seed {seed} is not in the test campaign's list, fixed at "
                    f"{campaign['time']}: {', '.join(f'{r} {c} seed {s}' for r, c, s in planned)}"
                )
            for line_number, e in entries:
                if e.get("status") == "done" and (e.get("run"), e.get("checkpoint"), e.get("seed")) == entry:
                    raise SplitGuardError(
                        f"{self.path}:{line_number}: {run} {checkpoint} seed {seed} was already evaluated on test "
                        f"at {e['time']}; the test split is touched once per frozen design"
                    )


def evaluation_job(
    config: Mapping[str, Any],
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
    selection_path: Path | None = None,
) -> RolloutJob:
    """The rollout job of one greedy evaluation (see the module docstring). On test it needs the ledger and the
    val selection (recorded with each evaluation); whether the campaign admits it is `TestLedger.admit`'s call."""
    spec = resolve_run(config, run)
    config = spec.env(config)  # the run's test_cost reaches the rollouts (extension expensive_tests_*)
    ev = evaluation_settings(config)
    ledger_extra = None
    if split == "test":
        if test_ledger is None or selection_path is None:
            raise SplitGuardError("the test split is evaluated once, by the test campaign (snakemake test), which "
                                  "passes the ledger and the checkpoint selection")
        chosen = selected_checkpoint(selection_path, run, seed)
        ledger_extra = {"config_hash": config_hash(config), "selection": chosen, "evaluation": ev}
    return RolloutJob(
        tasks_path=tasks_path,
        split=split,
        out=out,
        model=model,
        checkpoint=checkpoint,
        arm=spec.arm,
        seed=seed,
        n_tasks=ev["tasks"],
        samples=int(ev["samples"]),
        variant=spec.variant,
        client="eval",
        base_url=base_url,
        test_ledger=test_ledger,
        sampling={"temperature": ev["temperature"], "max_tokens": ev["max_tokens"]},
        run=run,
        ledger_extra=ledger_extra,
        evaluation=True,
    )


def evaluate(config: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    """Run (or resume) one evaluation on val; returns the rollout stage's summary. (The test split goes through
    `evaluate_checkpoints`, which asks the ledger first.)"""
    if kw.get("split") == "test":
        raise SplitGuardError("the test split is evaluated by evaluate_checkpoints, which asks the test ledger")
    return run_job(evaluation_job(config, **kw), resolve_run(config, kw["run"]).env(config))


@dataclass(frozen=True)
class CheckpointEval:
    """One checkpoint of a run/seed's evaluation job: its name, what vLLM loads, where its rows go."""

    checkpoint: str
    model: str
    out: Path


class CheckpointServer:
    """One vLLM server for a run/seed's checkpoints: started for the first one, its weights reloaded in place for
    each next one (`VLLMServer.reload_weights`, as RL does between steps), restarted only for a model that is not
    a local folder (an HF id). Every checkpoint is served under `SERVED_NAME`."""

    def __init__(self, serving: Mapping[str, Any], log_path: Path) -> None:
        self.serving, self.log_path = serving, log_path
        self.server: Any = None  # predict.serve.VLLMServer
        self.starts = self.reloads = 0

    def load(self, model: str, version: str) -> str:
        """Serve `model`; returns the base URL."""
        from predict.serve import VLLMServer, evaluation_environment  # noqa: PLC0415

        if self.server is not None and Path(model).is_dir():
            self.server.reload_weights(model, version=version)
            self.reloads += 1
            return self.server.base_url
        self.close()
        self.server = VLLMServer.from_serving(
            model, self.serving, served_model_name=SERVED_NAME, worker_extension=True, log_path=self.log_path,
            env=evaluation_environment(self.serving),
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
    config: Mapping[str, Any],
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
) -> list[dict[str, Any]]:
    """Evaluate (or resume) a run/seed's checkpoints on a split with one server; one summary per checkpoint.
    `base_url`: an endpoint already serving (tests); then no server is started and nothing is reloaded."""
    if not checkpoints:
        raise ValueError(f"run {run} seed {seed}: no checkpoint to evaluate")
    jobs = [evaluation_job(config, run=run, checkpoint=c.checkpoint, split=split, seed=seed, tasks_path=tasks_path,
                           model=c.model, out=c.out, base_url=base_url, test_ledger=test_ledger,
                           selection_path=selection_path) for c in checkpoints]  # fmt: skip
    if split == "test":
        if val_metrics is None:
            raise SplitGuardError("the test campaign needs the val statistics' metrics.parquet (--val-metrics): the "
                                  "checkpoints each run was evaluated at decide the campaign's list")
        assert test_ledger is not None and selection_path is not None  # evaluation_job refused otherwise
        plan = campaign_from_stats(config, val_metrics, selection_path)
        ledger = TestLedger(test_ledger)
        for job in jobs:  # every checkpoint admitted before any server starts
            ledger.admit(config, plan, run, job.checkpoint, seed)
    study = resolve_run(config, run).env(config)
    pending = []
    with CheckpointServer(config["serving"], jobs[0].out.with_name(jobs[0].out.stem + ".vllm.log")) as server:
        for job in jobs:
            serve_s = 0.0
            if base_url is None and remaining_rollouts(job, study):
                t0 = time.perf_counter()
                job = replace(job, base_url=server.load(job.model, version=job.checkpoint), served_model=SERVED_NAME)
                serve_s = time.perf_counter() - t0
            out = roll_out(job, study)
            out.summary["serve_s"] = serve_s
            pending.append(out)
        starts, reloads = server.starts, server.reloads
    summaries = [p.publish() for p in pending]
    log.info("%s seed %d on %s: %d checkpoints, %d server start(s), %d in-place reload(s)", run, seed, split,
             len(jobs), starts, reloads)  # fmt: skip
    return [{"checkpoint": j.checkpoint, **s, "server_starts": starts} for j, s in zip(jobs, summaries, strict=True)]

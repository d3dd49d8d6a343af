"""The test split, sealed: no stage but the test campaign reads a test task, whatever file, name, folder or ledger
state it is handed.

Rules:

* What is sealed (`sealed_sources`): the test split the stage's own config defines (`predict.data.derive_test_split`:
  the MBPP file, ``data.split_seed`` and ``data.sizes``; computed in any clone, with no registry and no split file),
  every test split the checkout's registry has registered (`predict split`), and every task a test campaign of this
  checkout has evaluated (its campaign line's task ids), whatever the config, the split or the file says now.
* Every stage that reads tasks names the flags that hold them in its stage table entry
  (`predict.stages.Stage.task_files`); `seal_stage` checks them by task id, called by `predict.cli` for every stage
  before it claims its results folder, writes a byte or starts a process. A stage that derives its tasks itself
  (`predict signal`) calls `seal_task_ids` first. A file's name, folder or hash never decides: its task ids do.
* The test campaign (`predict evaluate --split test`, stage ``evaluate-test``) is the one stage whose tasks are test
  tasks: its file must hold exactly the test split (`predict.campaign.check_campaign_tasks`), and its ledger rules
  are `predict.campaign`'s (admission, one campaign per split, base model and design, missing history refused).
* `replay` is the one door for re-executing test rollouts outside the campaign: those the ledger records as done,
  for the same weights and design, written nowhere (the reviewer bundle's ``verify-bundle --rerun``).
* Each refusal names the file, the first few task ids and what to do.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predict.campaign import (
    SplitGuardError,
    check_campaign_tasks,
    config_differences,
    config_hash,
    design_config,
    first_ids,
    read_ledger,
    registry_ledger,
)
from predict.data import derive_test_split, task_ids_of

if TYPE_CHECKING:
    from predict.stages import Stage

CAMPAIGN_STAGE = "evaluate-test"
"""The stage table entry of the test campaign: the one stage whose task file must be the test split."""


def sealed_sources(data: Mapping[str, Any], ledger: Path | None = None) -> list[tuple[frozenset[int], str]]:
    """Every sealed set of task ids with why it is sealed (see the module docstring): the config's own test split,
    then the registry's registered splits and evaluated campaigns. `ledger`: the registry (default the checkout's,
    `predict.campaign.registry_ledger`); a missing registry adds nothing and is not created."""
    split = derive_test_split(data)
    sources = [(split.task_ids, f"they are in {split.describe()}")]
    registry = ledger or registry_ledger()
    for line, entry in read_ledger(registry):
        ids = frozenset(int(t) for t in entry.get("task_ids") or ())
        if entry.get("event") == "split" and ids != split.task_ids:
            sources.append((ids, f"{registry}:{line} registered them as a test split ({entry.get('time')})"))
        elif entry.get("event") == "campaign":
            sources.append((ids, f"test campaign {entry.get('campaign')} evaluated them ({registry}:{line}, "
                                 f"{entry.get('time')})"))
    return sources


def seal_task_ids(task_ids: Iterable[int], data: Mapping[str, Any], *, source: str | Path, stage: str,
                  ledger: Path | None = None) -> None:
    """Refuse (`predict.campaign.SplitGuardError`) when any of `task_ids` (read from `source`) is sealed."""
    ids = {int(t) for t in task_ids}
    hits = [(ids & sealed, why) for sealed, why in sealed_sources(data, ledger) if ids & sealed]
    if not hits:
        return
    overlap = set().union(*(h for h, _ in hits))
    raise SplitGuardError(
        f"{source}: {len(overlap)} of its {len(ids)} tasks are test tasks ({first_ids(overlap)}): "
        f"{'; '.join(why for _, why in hits)}. `predict {stage}` never reads a test task: the test split is evaluated "
        "once, by its campaign (snakemake test), and never trained on, selected on or made into traces. Give it "
        "tasks of the sft, rl or val split (results/data/{sft,rl,val}.parquet from `predict split`)")


def seal_file(path: str | Path, data: Mapping[str, Any], *, stage: str, ledger: Path | None = None) -> None:
    """`seal_task_ids` of a task-keyed parquet's ``task_id`` column (a split, traces)."""
    seal_task_ids(task_ids_of(path), data, source=path, stage=stage, ledger=ledger)


def seal_stage(stage: Stage, args: argparse.Namespace, config: Mapping[str, Any]) -> None:
    """The seal at a stage's entry (`predict.cli`, before anything is written or started): every file the stage
    table says holds its tasks (`Stage.task_files`) holds no sealed task; the test campaign's is the test split. A
    flag left out, or a file that does not exist (nothing to read: the stage's own error names it), is skipped."""
    for dest in stage.task_files:
        if (value := getattr(args, dest, None)) is None or not Path(value).exists():
            continue
        if stage.name == CAMPAIGN_STAGE:
            check_campaign_tasks(Path(value), derive_test_split(config["data"]))
        else:
            seal_file(value, config["data"], stage=stage.name)


@dataclass(frozen=True)
class Replay:
    """Test rollouts the ledger records as done, cleared for re-execution in memory (`replay`)."""

    campaign: str
    run: str
    checkpoint: str
    seed: int
    tasks: tuple[dict[str, Any], ...]
    """Rollout-ready task rows (each task of `task_ids` once per evaluation sample, with ``sample``), in task_id
    order, as `predict.rollouts.select_tasks` made them for the campaign."""
    done: dict[str, Any]
    """The ledger's ``done`` line of the evaluation: its ``out``, ``sha256``, ``weights``, ``evaluation`` settings."""


def replay(config: Mapping[str, Any], *, run: str, checkpoint: str, seed: int, model: str | Path,
           task_ids: Iterable[int], ledger: Path | None = None) -> Replay:
    """The one door through which test rollouts may run outside the campaign: re-executing some that the ledger
    records as done (a reviewer's ``verify-bundle --rerun K``), to compare them with the recorded rows.

    Cleared only when the ledger (default the checkout's registry; never created, locked or written) records the
    evaluation (run, checkpoint, seed) as ``done`` in a campaign on the test split of ``config["data"]``, under the
    same design (`predict.campaign.config_hash`) and the same weights (`model`'s content,
    `predict.fingerprint.input_identity`), and every one of `task_ids` was among the tasks it evaluated. Refused
    otherwise (`SplitGuardError`, naming what differs). The caller rolls `Replay.tasks` out in memory (e.g.
    `predict.env.rollout.run_rollouts_sync`) and writes the rows nowhere: not into results, not into the ledger, and
    never through `predict.rollouts` or `predict evaluate`, which persist and record."""
    from predict.fingerprint import input_identity  # noqa: PLC0415
    from predict.rollouts import select_tasks  # noqa: PLC0415

    ledger = Path(ledger) if ledger is not None else registry_ledger()
    if not ledger.exists():
        raise SplitGuardError(f"{ledger}: no such ledger; a replay re-executes test rollouts a ledger records as "
                              "done: name the campaign's ledger (it is read, never created)")
    split = derive_test_split(config["data"])
    entries = [e for _, e in read_ledger(ledger)]
    campaigns = {e["campaign"]: e for e in entries
                 if e.get("event") == "campaign" and e.get("split_sha256") == split.sha256}  # fmt: skip
    done = [e for e in entries if e.get("status") == "done" and e.get("campaign") in campaigns
            and (e.get("run"), e.get("checkpoint"), e.get("seed")) == (run, checkpoint, int(seed))]  # fmt: skip
    where = f"{ledger}: {run} {checkpoint} seed {seed}"
    if not done:
        raise SplitGuardError(f"{where} has no done test evaluation on {split.describe()}: only rollouts the ledger "
                              "records can be replayed")
    entry = done[-1]
    campaign = campaigns[entry["campaign"]]
    if config_hash(config) != campaign["config_hash"]:
        changed = config_differences(campaign.get("design"), design_config(config))
        raise SplitGuardError(f"{where}: the replay's config differs from the frozen design of campaign "
                              f"{campaign['campaign']} in {', '.join(changed[:8]) or 'the design'}: replay under it")
    if (weights := input_identity(model)) != entry.get("weights"):
        raise SplitGuardError(f"{where}: {model} is not the checkpoint the ledger recorded ({weights[:24]}..., "
                              f"recorded {str(entry.get('weights'))[:24]}...): a replay re-executes the same weights")
    evaluation = entry.get("evaluation") or {}
    rows = sorted(split.rows, key=lambda r: r["task_id"])[: evaluation.get("tasks") or None]
    wanted = {int(t) for t in task_ids}
    if outside := wanted - {int(r["task_id"]) for r in rows}:
        raise SplitGuardError(f"{where}: tasks {first_ids(outside)} were not among the tasks it evaluated: a replay "
                              "re-executes recorded rollouts only")
    chosen = [r for r in rows if int(r["task_id"]) in wanted]
    tasks = select_tasks(chosen, None, int(evaluation.get("samples") or 1))
    return Replay(campaign["campaign"], run, checkpoint, int(seed), tuple(tasks), dict(entry))

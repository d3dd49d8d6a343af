"""The seal: no stage but the campaign reads a test task, whatever file, name, folder or ledger state it is handed.

Rules:

* Sealed (`sealed_sources`): the test split the stage's own config defines (`predict.data.derive_test_split`, in any
  clone, with no registry and no split file), every test split the registry has registered
  (`predict.campaign.ledger.register_split`, called by `predict split`), and every task a campaign of this checkout
  evaluated (its line's ``task_ids``), whatever the config, the split or the file says now.
* Every stage that reads tasks names the flags that hold them in its stage table entry
  (`predict.stages.Stage.task_files`); `seal_stage` checks them by task id, called by `predict.cli` before the stage
  claims its results folder, writes a byte or starts a process (`predict signal` calls `seal_task_ids` on the tasks
  it derives). The campaign's own file must be the test split (`predict.campaign.design.check_campaign_tasks`).
* Inside the rollout stage, `guard_tasks` refuses again, by the registry's ids, before a ``.partial`` folder or a
  server exists; a test job without its campaign's admission in the ledger (or without a ledger) is refused.
* A file's name never decides. Each refusal names the file, the first few task ids and what to do.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from predict.campaign.design import check_campaign_tasks
from predict.campaign.errors import SplitGuardError, first_ids
from predict.campaign.ledger import entry_key, ledger_lock, read_ledger, registry_ledger, test_task_ids
from predict.campaign.view import CAMPAIGN_STAGE
from predict.config.models import DataSettings
from predict.stages import Stage, StageSettings


def sealed_sources(data: DataSettings, ledger: Path | None = None) -> list[tuple[frozenset[int], str]]:
    """Every sealed set of task ids with why it is sealed (see the module docstring): the config's own test split,
    then the registry's registered splits and evaluated campaigns. `ledger`: the registry (default the checkout's,
    `registry_ledger`); a missing registry adds nothing and is not created."""
    from predict.data import derive_test_split

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


def seal_task_ids(task_ids: Iterable[int], data: DataSettings, *, source: str | Path, stage: str,
                  ledger: Path | None = None) -> None:
    """Refuse (`SplitGuardError`) when any of `task_ids` (read from `source`) is sealed."""
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


def seal_file(path: str | Path, data: DataSettings, *, stage: str, ledger: Path | None = None) -> None:
    """`seal_task_ids` of a task-keyed parquet's ``task_id`` column (a split, traces)."""
    from predict.data import task_ids_of

    seal_task_ids(task_ids_of(path), data, source=path, stage=stage, ledger=ledger)


def seal_stage(stage: Stage, args: argparse.Namespace, config: StageSettings) -> None:
    """The seal at a stage's entry (`predict.cli`, before anything is written or started): every file the stage
    table says holds its tasks (`Stage.task_files`) holds no sealed task; the test campaign's is the test split. A
    flag left out, or a file that does not exist (nothing to read: the stage's own error names it), is skipped.
    `config`: the stage's own typed object (`predict.stages.stage_settings`)."""
    from predict.data import derive_test_split

    for dest in stage.task_files:
        if (value := getattr(args, dest, None)) is None or not Path(value).exists():
            continue
        data = config.data  # every entry with task files reads SPLIT (the stage table)
        if stage.name == CAMPAIGN_STAGE:
            check_campaign_tasks(Path(value), derive_test_split(data))
        else:
            seal_file(value, data, stage=stage.name)


def guard_tasks(*, split: str, tasks_path: Path, task_ids: Iterable[int], run: str, checkpoint: str, seed: int,
                admission: Mapping[str, Any] | None, ledger: Path | None) -> None:
    """Refuse a rollout that touches the test split outside its campaign (see the module docstring)."""
    if admission is None:
        registry = ledger or registry_ledger()
        overlap = sorted(set(map(int, task_ids)) & test_task_ids(registry))
        if overlap or split == "test":  # by id and by the split it declares, never by its file's name
            what = (f"{len(overlap)} of its tasks are test tasks ({first_ids(overlap)}; {registry})" if overlap
                    else "it is the test split")
            raise SplitGuardError(f"{tasks_path}: {what}, which is evaluated once: it belongs to the test campaign "
                                  "(snakemake test), not a rollout stage; give it tasks of the sft, rl or val split")
        return
    if ledger is None or not ledger.exists():
        raise SplitGuardError(f"{tasks_path}: a test evaluation needs its campaign's ledger, and {ledger} is missing: "
                              "restore it; a missing ledger is a refusal, never a fresh start")
    entry = (run, checkpoint, int(seed))
    with ledger_lock(ledger):  # a campaign's other jobs may be appending right now
        entries = read_ledger(ledger)
    campaign = next((e for _, e in entries if e.get("event") == "campaign"
                     and e.get("campaign") == admission["campaign"]), None)
    if campaign is None or entry not in [tuple(p) for p in campaign["plan"]]:
        raise SplitGuardError(f"{ledger}: run {run} checkpoint {checkpoint} seed {seed} has no admission in test "
                              f"campaign {admission['campaign']}")
    for line_number, e in entries:
        if e.get("campaign") == admission["campaign"] and entry_key(e) == entry and e.get("status") == "done":
            raise SplitGuardError(f"{ledger}:{line_number}: run {run} checkpoint {checkpoint} seed {seed} was already "
                                  f"evaluated on test at {e['time']}; the test split is touched once")

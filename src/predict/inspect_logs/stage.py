"""`predict inspect-logs`: evaluations (and RL steps' rollouts, on request) as Inspect logs for `inspect view` (the rules
and the layout: predict.inspect_logs). Reads the stage table's run matrix (to pair the runs of each environment) and
``data`` (the seal)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.campaign import SplitGuardError, first_ids, read_ledger, registry_ledger, seal_task_ids
from predict.env.records import RECORD_SCHEMA
from predict.inspect_logs.sources import Pair, Source
from predict.stats.metrics import EVAL_PATH

if TYPE_CHECKING:
    from predict.stages import StageSettings

STAGE = "inspect-logs"
RL_PATH = re.compile(r"(?P<run>[^/]+)/seed(?P<seed>-?\d+)/\.work/rollouts/step(?P<step>\d+)\.parquet$")
MANIFEST = "logs.json"  # Inspect's manifest of a log folder (inspect_ai.log.write_log_dir_manifest)
LOG_SUFFIX = ".eval"
UNREAD = ("tokens",)  # the token graph: training's, not the reader's (the steps hold every message's text)

Key = tuple[str, str, str, int]  # (run, checkpoint, split, seed)


@dataclass
class Read:
    """One parquet read and admitted: its source, its rows, its log's path in the export folder."""

    source: Source
    rows: list[dict[str, Any]]
    log: str

    @property
    def key(self) -> Key:
        return (self.source.run, self.source.checkpoint, self.source.split, self.source.seed)


# -- inputs ------------------------------------------------------------------------------------------------------------


def evaluation_files(given: Iterable[str | Path]) -> list[Path]:
    """The evaluation parquets named, a folder standing for every one below it (`.partial` folders left out)."""
    out = []
    for path in map(Path, given):
        if path.is_dir():
            found = sorted(p for p in path.rglob("seed*.parquet")
                           if EVAL_PATH.search(p.as_posix()) and ".partial" not in p.as_posix())
            if not found:
                raise ValueError(f"{path}: no evaluation under it (.../{{run}}/{{checkpoint}}/{{split}}/seed{{seed}}"
                                 ".parquet, as `predict evaluate` writes them); nothing written")
            out += found
        elif not EVAL_PATH.search(path.as_posix()):
            raise ValueError(f"{path}: not an evaluation's path (.../{{run}}/{{checkpoint}}/{{split}}/seed{{seed}}"
                             ".parquet); nothing written")
        else:
            out.append(path)
    return out


def rl_files(given: Iterable[str | Path]) -> list[Path]:
    """The RL step rollouts named, a run's folder (results/rl/{run}/seed{seed}) standing for every step it kept."""
    out = []
    for path in map(Path, given):
        if path.is_dir():
            steps = {p: m for p in (path / ".work" / "rollouts").glob("step*.parquet")
                     if (m := RL_PATH.search(p.resolve().as_posix()))}
            found = sorted(steps, key=lambda p: int(steps[p]["step"]))
            if not found:
                raise ValueError(f"{path}: no RL step rollouts in it (.work/rollouts/step{{N}}.parquet of "
                                 "results/rl/{run}/seed{seed}); nothing written")
            out += found
        elif not RL_PATH.search(path.resolve().as_posix()):
            raise ValueError(f"{path}: not an RL step's rollouts (results/rl/{{run}}/seed{{seed}}/.work/rollouts/"
                             "step{N}.parquet); nothing written")
        else:
            out.append(path)
    return out


def check_record_schema(path: Path) -> None:
    """Refuse a parquet whose columns are not this code's record schema (another version of predict wrote it)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; nothing written")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path}: not a parquet file ({e}); nothing written") from None
    expected = RECORD_SCHEMA
    missing = [n for n in expected.names if n not in schema.names]
    extra = [n for n in schema.names if n not in expected.names]
    typed = [n for n in expected.names if n in schema.names and not schema.field(n).type.equals(expected.field(n).type)]
    if missing or extra or typed:
        what = [f"it lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}" if missing else "",
                f"it has {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''} besides" if extra else "",
                f"{typed[0]} is {schema.field(typed[0]).type}, not {expected.field(typed[0]).type}" if typed else ""]
        raise ValueError(f"{path}: not a rollout file of this version's record schema (predict.env.records."
                         f"RECORD_SCHEMA): {'; '.join(w for w in what if w)}. Another version of predict wrote it: "
                         "export it with that version, or evaluate again; nothing written")


def read_rows(path: Path) -> list[dict[str, Any]]:
    check_record_schema(path)
    return pq.read_table(path, columns=[n for n in RECORD_SCHEMA.names if n not in UNREAD]).to_pylist()


def read_source(path: Path, kind: str) -> Read:
    """One parquet, checked against its schema and its path (the rows' checkpoint, split and seed are the path's)."""
    from predict.fingerprint import file_sha256

    rows = read_rows(path)
    if kind == "evaluation":
        m = EVAL_PATH.search(path.as_posix())
        source = Source(str(path), file_sha256(path), m["run"], m["split"], int(m["seed"]), m["checkpoint"])
        log = f"{source.run}/{source.checkpoint}/{source.split}/seed{source.seed}{LOG_SUFFIX}"
        expected = {"checkpoint": source.checkpoint, "split": source.split, "seed": source.seed}
    else:
        m = RL_PATH.search(path.resolve().as_posix())
        source = Source(str(path), file_sha256(path), m["run"], "rl", int(m["seed"]), f"step{m['step']}", "rl_step")
        log = f"rl/{source.run}/seed{source.seed}/step{m['step']}{LOG_SUFFIX}"
        expected = {"seed": source.seed}
    for i, row in enumerate(rows):
        if any(row.get(k) != v for k, v in expected.items()):
            raise ValueError(f"{path}: row {i} (task {row.get('task_id')}) has "
                             f"{', '.join(f'{k} {row.get(k)}' for k in expected)}, its path says "
                             f"{', '.join(f'{k} {v}' for k, v in expected.items())}; nothing written")
    return Read(source, rows, log)


# -- the seal ----------------------------------------------------------------------------------------------------------


def admit(reads: Sequence[Read], data: Any, ledger: Path) -> dict[tuple[str, int], str]:
    """The test split's seal (predict.inspect_logs): a test evaluation only as the ledger records it done; any other
    file holds no sealed task. Returns the test campaign's selection, (run, seed) -> checkpoint, for the pairs."""
    test = [r for r in reads if r.source.split == "test"]
    for r in reads:
        if r.source.split != "test":
            seal_task_ids([row["task_id"] for row in r.rows], data, source=r.source.path, stage=STAGE)
    if not test:
        return {}
    if not ledger.exists():
        raise SplitGuardError(f"{test[0].source.path}: a test evaluation is exported only as the campaign ledger "
                              f"records it, and {ledger} is missing: restore it, or name the ledger that recorded it "
                              "with --test-ledger; nothing written")
    entries = [e for _, e in read_ledger(ledger)]
    done = {e["sha256"]: e for e in entries if e.get("status") == "done" and e.get("sha256")}
    for r in test:
        entry = done.get(r.source.sha256)
        named = (r.source.run, r.source.checkpoint, r.source.seed)
        if entry is None or (entry.get("run"), entry.get("checkpoint"), entry.get("seed")) != named:
            why = ("no campaign wrote it, or it changed since" if entry is None else
                   f"the ledger records it as {entry.get('run')} {entry.get('checkpoint')} seed {entry.get('seed')}")
            raise SplitGuardError(f"{r.source.path}: not a test evaluation that {ledger} records as done ({why}): the "
                                  "export reads the test campaign's own files only; nothing written")
    campaigns = {done[r.source.sha256]["campaign"] for r in test}
    return {(s["run"], int(s["seed"])): s["checkpoint"] for _, e in read_ledger(ledger)
            if e.get("event") == "campaign" and e.get("campaign") in campaigns for s in e.get("selection") or ()}


def task_rows(paths: Sequence[str | Path], reads: Sequence[Read]) -> dict[int, dict[str, Any]]:
    """task_id -> its split row, for the tasks of the admitted files only (read from the tasks files given)."""
    from predict.data import load_split

    wanted = {int(row["task_id"]) for r in reads for row in r.rows}
    found: dict[int, dict[str, Any]] = {}
    for path in paths:
        found |= {int(t["task_id"]): t for t in load_split(path) if int(t["task_id"]) in wanted}
    for r in reads:
        if missing := {int(row["task_id"]) for row in r.rows} - set(found):
            raise ValueError(f"{r.source.path}: task(s) {first_ids(missing)} are in none of the tasks files "
                             f"({', '.join(map(str, paths))}): give the split its rows come from "
                             f"(results/data/{r.source.split}.parquet); nothing written")
    return found


# -- pairs -------------------------------------------------------------------------------------------------------------


def pair_keys(keys: Iterable[Key], environments: Iterable[Any], selected: Mapping[tuple[str, int], str]) -> dict[Key, Key]:
    """Each evaluation's counterpart (predict.inspect_logs: pairs), both ways: the other protocol's run of its
    environment, same split and seed, at the same checkpoint, or on test at the checkpoint the campaign selected for
    it when this one is the selected one."""
    have = set(keys)
    out: dict[Key, Key] = {}
    for env in environments:
        for key in sorted(k for k in have if k[0] == env.reactive):
            run, checkpoint, split, seed = key
            candidates = [(env.predictive, checkpoint, split, seed)]
            if split == "test" and selected.get((run, seed)) == checkpoint and (env.predictive, seed) in selected:
                candidates.insert(0, (env.predictive, selected[(env.predictive, seed)], split, seed))
            other = next((c for c in candidates if c in have and c not in out), None)
            if other is not None and key not in out:
                out[key], out[other] = other, key
    return out


# -- writing -----------------------------------------------------------------------------------------------------------


def check_out_dir(out_dir: Path) -> None:
    """The export folder is replaced whole: refuse one that holds anything an export does not write."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir}: not a folder; nothing written")
    if strays := sorted(p for p in out_dir.rglob("*") if p.is_file() and p.suffix != LOG_SUFFIX and p.name != MANIFEST):
        raise ValueError(f"{out_dir}: holds {strays[0]}{f' and {len(strays) - 1} more files' if len(strays) > 1 else ''}"
                         ", which no export wrote, and the export replaces the folder whole: give an export folder "
                         "(results/inspect) or a new one; nothing written")


def export(config: StageSettings | Mapping[str, Any], *, evals: Sequence[str | Path] = (),
           rl_rollouts: Sequence[str | Path] = (), tasks_files: Sequence[str | Path], out_dir: Path,
           ledger: Path | None = None) -> list[Path]:
    """Read, check and admit every input (nothing is written before all of it checks out), then write one log per
    parquet and Inspect's manifest beside the old folder and swap it in. Returns the logs written. `config`: the
    stage's typed object, or a mapping (a test's, the bundle's) read through the stage's row."""
    from inspect_ai.log import write_eval_log, write_log_dir_manifest
    from tqdm import tqdm

    from predict.inspect_logs.episodes import eval_log
    from predict.runs import environments
    from predict.stages import StageSettings, stage_settings

    view = config if isinstance(config, StageSettings) else stage_settings(STAGE, config)
    paths = [(p, "evaluation") for p in evaluation_files(evals)] + [(p, "rl_step") for p in rl_files(rl_rollouts)]
    if not paths:
        raise ValueError("no evaluation or RL rollouts given (--evals, --rl-rollouts); nothing written")
    unique = list({p.resolve(): (p, kind) for p, kind in paths}.values())
    reads = [read_source(p, kind) for p, kind in tqdm(unique, desc="read", unit="file", disable=None)]
    by_log: dict[str, Read] = {}
    for r in reads:
        if r.log in by_log:
            raise ValueError(f"{r.source.path} and {by_log[r.log].source.path} are both {r.log}: export one of them; "
                             "nothing written")
        by_log[r.log] = r
    selected = admit(reads, view.data, Path(ledger) if ledger else registry_ledger())
    tasks = task_rows(tasks_files, reads)
    evaluations = {r.key: r for r in reads if r.source.kind == "evaluation"}
    counterparts = pair_keys(evaluations, environments(view), selected)
    check_out_dir(out_dir)

    staging = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    written = []
    for r in tqdm(reads, desc="write", unit="log", disable=None):
        pair = None
        if (other_key := counterparts.get(r.key)) is not None:
            other = evaluations[other_key]
            reactive, predictive = (r, other) if r.rows and r.rows[0].get("protocol") == "reactive" else (other, r)
            pair = Pair(reactive.source.run, predictive.source.run, other.log,
                        {(int(o["task_id"]), int(o.get("sample") or 0)): o for o in other.rows})
        path = staging / r.log
        path.parent.mkdir(parents=True, exist_ok=True)
        write_eval_log(eval_log(r.rows, tasks, r.source, pair), str(path), format="eval")
        written.append(out_dir / r.log)
    write_log_dir_manifest(str(staging))
    old = out_dir.with_name(f".{out_dir.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return written


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--evals", nargs="*", default=[],
                   help="evaluation parquets, or folders searched for .../{run}/{checkpoint}/{split}/seed{seed}.parquet "
                        "(results/eval)")
    p.add_argument("--rl-rollouts", nargs="*", default=[],
                   help="RL steps' rollouts on request: results/rl/{run}/seed{seed}/.work/rollouts/step{N}.parquet, or "
                        "the run's folder results/rl/{run}/seed{seed} for every step it kept")
    p.add_argument("--tasks-file", nargs="+", required=True,
                   help="the split files the task prompts come from (results/data/{val,test}.parquet; rl.parquet for "
                        "RL rollouts); read only for the tasks of the files admitted")
    p.add_argument("--test-ledger", default=None,
                   help="the campaign registry that recorded the test evaluations (default: the checkout's); read only")
    p.add_argument("--out-dir", required=True, help="results/inspect (replaced whole)")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console

    t0 = time.perf_counter()
    out_dir = Path(args.out_dir)
    written = export(config, evals=args.evals, rl_rollouts=args.rl_rollouts, tasks_files=args.tasks_file,
                     out_dir=out_dir, ledger=Path(args.test_ledger) if args.test_ledger else None)
    console.print(f"inspect logs: {len(written)} logs in {time.perf_counter() - t0:.1f} s -> {out_dir} "
                  f"(read them: .venv/bin/inspect view --log-dir {out_dir})")
    return 0

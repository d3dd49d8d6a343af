"""`predict verify-bundle PATH`: check a study bundle (predict.bundle) without the cluster, and say at which level it
checks out, in the terms of ACM's artifact badges (docs/verify.md):

* **available**: the manifest is there and complete, and every file in the bundle is one it lists, with its sha256
  and size (a file changed, replaced, added or left out is named).
* **functional**: every number re-derives from the bundled rows:
  - the config is a filled, valid study config whose design hash is the manifest's;
  - MBPP (the reviewer's copy, held to the manifest's sha256) split with the config's seed and sizes gives the
    bundled task ids of every split, and every evaluation holds exactly the rollouts its split and the evaluation
    settings plan (no task from another split, none missing, none added);
  - the test evaluations match the ledger: one campaign on the re-derived test split, frozen under the bundled
    config's design hash, its plan the one the val selection gives (stats/selection.parquet, itself re-derived
    next), every planned evaluation recorded ``done`` once with the bundled file's sha256 and the checkpoint's
    content hash, nothing evaluated outside it;
  - every statistics table, re-derived by the project's own stages from the bundled rows (predict.bundle.rederive),
    equals the bundled one value for value, floats bit for bit; and the report, re-rendered from the re-derived
    tables, prints what the bundled page prints, number for number.
* **reproduced** (``--rerun K`` with the checkpoints): K test rollouts re-executed give the bundled rows
  (predict.bundle.rerun; on the CPU with the embedded default, identical rows; on a GPU a difference also says what
  can make rows differ there without tampering: docs/repeatability.md).

A level is checked only when the one before it checks out. The exit status is 0 when every level checked checks
out, 1 otherwise, and the last line names the first file, row or number that does not. Nothing is written outside a
scratch folder (``--work`` keeps it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
from pydantic import ConfigDict

from predict.bundle import (
    ARCHIVE_ROOT,
    FORMAT,
    LEDGER,
    MANIFEST,
    MANIFEST_KEYS,
    REPORT,
    bundle_files,
    manifest_digest,
    sha256_file,
)
from predict.config.models import DataSettings, EvaluationSettings, Section, ServingSettings

LEVELS = ("available", "functional", "reproduced")


class CheckFailed(Exception):
    """One check found something that does not check out; the message names the file, row or number."""


@dataclass
class Level:
    """One verdict: its checks' one-line results and the first failure."""

    name: str
    status: str = "not checked"  # "checks out", "fails", "not checked"
    why: str = ""
    lines: list[tuple[bool, str]] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        return [text for ok, text in self.lines if not ok]


class BundledConfig(Section):
    """What the verifier itself reads of the bundle's recorded config, typed (once `Verifier.check_config` found it a
    filled, valid study config): the split's definition, the evaluation settings, the serving settings. The whole
    config stays the recorded plain data, for what hashes it (the design) and what slices it (the stages re-run)."""

    model_config = ConfigDict(extra="ignore")

    data: DataSettings
    evaluation: EvaluationSettings
    serving: ServingSettings


class Verifier:
    """The checks of one bundle (see the module docstring), in the order `verify` runs them."""

    def __init__(self, root: Path, work: Path, *, mbpp: Path | None = None) -> None:
        self.root, self.work, self.mbpp = root, work, mbpp
        self.manifest: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        """The manifest's config, as recorded (plain data: hashed, and sliced for the stages re-run)."""
        self.settings: BundledConfig | None = None
        """What the checks read of it, typed (`bundled`)."""
        self.split_ids: dict[str, list[int]] = {}
        self.test_tasks = work / "data" / "test.parquet"
        self.where: dict[int, str] = {}  # task id -> the split MBPP and the seed put it in
        self.campaign: dict[str, Any] = {}

    # -- available ------------------------------------------------------------------------------------------------

    def check_manifest(self) -> str:
        path = self.root / MANIFEST
        if not path.is_file():
            raise CheckFailed(f"{MANIFEST}: missing: {self.root} is not a study bundle (predict bundle writes one)")
        try:
            self.manifest = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CheckFailed(f"{MANIFEST}: not JSON ({e.msg}, line {e.lineno})") from None
        if self.manifest.get("format") != FORMAT:
            raise CheckFailed(f"{MANIFEST}: format {self.manifest.get('format')!r}, this verifier reads {FORMAT!r}")
        if missing := [k for k in MANIFEST_KEYS if k not in self.manifest]:
            raise CheckFailed(f"{MANIFEST}: it records no {', '.join(missing)}")
        self.config = self.manifest["config"]
        code, here = self.manifest["code"], _code_here()
        made = f"{code.get('commit')}{' (dirty)' if code.get('dirty') else ''}"
        return (f"manifest: {FORMAT}, run {self.manifest['run_name']}, made {self.manifest['created']} at commit {made}"
                f"{'' if here == code.get('commit') else f'; this checkout is at {here}: verify at the bundle commit'}")

    def check_files(self) -> str:
        listed: Mapping[str, Mapping[str, Any]] = self.manifest["files"]
        present = set(bundle_files(self.root))
        for rel in sorted(listed):
            if rel not in present:
                raise CheckFailed(f"{rel}: listed in the manifest, missing from the bundle")
            digest, size = sha256_file(self.root / rel), (self.root / rel).stat().st_size
            if digest != listed[rel]["sha256"] or size != listed[rel]["bytes"]:
                raise CheckFailed(f"{rel}: sha256 {digest[:16]}... ({size} bytes), the manifest says "
                                  f"{listed[rel]['sha256'][:16]}... ({listed[rel]['bytes']} bytes): the file was "
                                  "changed or replaced")
        if extra := sorted(present - set(listed)):
            raise CheckFailed(f"{extra[0]}: in the bundle but not in its manifest"
                              f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}")
        size = sum(f["bytes"] for f in listed.values())
        return f"files: {len(listed)} files ({size / 1e6:.2f} MB), every sha256 and size as the manifest says"

    def check_complete(self) -> str:
        from predict.bundle.rederive import handed_lists
        from predict.stats import STATS_TABLES, TEST_STATS_TABLES

        files = self.manifest["files"]
        wanted = [REPORT, LEDGER, *(f"stats/{t}.parquet" for t in STATS_TABLES),
                  *(f"test/stats/{t}.parquet" for t in TEST_STATS_TABLES)]
        if self.manifest["report"].get("example"):
            wanted.append(self.manifest["report"]["example"])
        if missing := [rel for rel in wanted if rel not in files]:
            raise CheckFailed(f"{missing[0]}: the report rests on it, and the bundle does not hold it")
        for split in ("val", "test"):
            if not any(rel.startswith("eval/") and f"/{split}/seed" in rel for rel in files):
                raise CheckFailed(f"eval/: the bundle holds no {split} evaluation")
        recorded, held = self.manifest["inputs"], handed_lists(sorted(files))
        for kind, listed in held.items():
            if sorted(recorded.get(kind) or []) != listed:
                raise CheckFailed(f"{MANIFEST}: inputs.{kind} does not list the bundle's {kind} tables, each once")
        return "complete: the report, the ledger, every statistics table and val and test evaluations"

    # -- functional -----------------------------------------------------------------------------------------------

    def check_config(self) -> str:
        from predict.campaign import config_differences, design_hashes
        from predict.config import ConfigError, validate_config, with_defaults

        try:
            validate_config(self.config, source=f"{MANIFEST} config")
            filled = with_defaults(self.config, source=f"{MANIFEST} config")
        except ConfigError as e:
            raise CheckFailed(str(e)) from None
        if filled != self.config:
            raise CheckFailed(f"{MANIFEST} config: not the filled config this code fills in (differs in "
                              f"{', '.join(config_differences(self.config, filled)[:6])}): verify at the bundle's "
                              f"commit, {self.manifest['code'].get('commit')}")
        digest = self.manifest["design_hash"]
        if digest not in (hashes := design_hashes(self.config)):  # a bundle of earlier code: the hash it wrote then
            raise CheckFailed(f"{MANIFEST}: design_hash {digest[:16]}... is not its config's, {hashes[0][:16]}...")
        return f"config: a valid, filled study config, design hash {digest[:16]}..."

    def bundled(self) -> BundledConfig:
        """The typed config the checks read, from the manifest's (`check_config` says what is wrong with a config
        that is no valid study config; a check that reads it before then fails naming the key)."""
        if self.settings is None:
            from predict.config import config_problems

            try:
                self.settings = BundledConfig.model_validate(self.config)
            except pydantic.ValidationError as e:
                raise CheckFailed(f"{MANIFEST} config: {config_problems(e, self.config, BundledConfig)[0]}") from None
        return self.settings

    def check_split(self) -> str:
        from predict.data import MBPP_SCHEMA, SPLITS, content_hash, load_mbpp, split_tasks
        from predict.outputs import write_rows

        data, recorded = self.bundled().data, self.manifest["data"]
        mbpp = self.mbpp or _checkout_path(data.mbpp_path)
        if not mbpp.is_file():
            raise CheckFailed(f"{mbpp}: no MBPP file to re-derive the split from (--mbpp PATH)")
        digest = sha256_file(mbpp)
        if recorded.get("mbpp_sha256") not in (None, digest):
            raise CheckFailed(f"{mbpp}: sha256 {digest[:16]}..., the bundle's split was made from "
                              f"{recorded['mbpp_sha256'][:16]}...: not the same MBPP")
        seed = data.split_seed
        if recorded.get("split_seed") != seed:
            raise CheckFailed(f"{MANIFEST} data: split seed {recorded.get('split_seed')}, the config's is {seed}")
        # hf_fallback=False: a reviewer re-derives from the file checked above, never from a download.
        splits = split_tasks(load_mbpp(mbpp, hf_fallback=False), seed, data.sizes)
        where = {int(r["task_id"]): name for name in SPLITS for r in splits[name]}
        bundled = recorded["splits"]
        for name in SPLITS:
            ids = [int(r["task_id"]) for r in splits[name]]
            mine = [int(t) for t in bundled[name]["task_ids"]]
            if moved := sorted(set(mine) - set(ids)):
                raise CheckFailed(f"{MANIFEST} data: task {moved[0]} is in the bundle's {name} split, but MBPP split "
                                  f"with seed {seed} puts it in {where.get(moved[0], 'no split')}")
            if lost := sorted(set(ids) - set(mine)):
                raise CheckFailed(f"{MANIFEST} data: task {lost[0]} is missing from the bundle's {name} split, where "
                                  f"MBPP split with seed {seed} puts it")
            if bundled[name]["content_sha256"] != content_hash(splits[name]):
                raise CheckFailed(f"{MANIFEST} data: the {name} split's content hash is not that of its tasks in MBPP")
            self.split_ids[name] = ids
        write_rows(splits["test"], MBPP_SCHEMA, self.test_tasks)
        self.where = where
        return (f"split: MBPP {digest[:16]}... with seed {seed} gives the bundled task ids "
                f"({', '.join(f'{n} {len(self.split_ids[n])}' for n in SPLITS)})")

    def check_rows(self) -> str:
        import pyarrow.parquet as pq

        from predict.rollouts import select_tasks
        from predict.stats.metrics import EVAL_PATH

        ev = self.bundled().evaluation
        samples = ev.samples
        rollouts = 0
        for rel in (r for r in self.manifest["files"] if r.startswith("eval/")):
            m = EVAL_PATH.search(rel)
            if m is None:
                raise CheckFailed(f"{rel}: not an evaluation path (eval/{{run}}/{{checkpoint}}/{{split}}/seed{{seed}}.parquet)")
            split = m["split"]
            rows = pq.read_table(self.root / rel, columns=["task_id", "sample", "split", "checkpoint", "seed"]).to_pylist()
            ids = set(self.split_ids.get(split, ()))
            for i, r in enumerate(rows):
                if int(r["task_id"]) not in ids:
                    raise CheckFailed(f"{rel} row {i}: task {r['task_id']} is not a {split} task (MBPP split with seed "
                                      f"{self.bundled().data.split_seed} puts it in "
                                      f"{self.where.get(int(r['task_id']), 'no split')})")
                if (r["split"], r["checkpoint"], int(r["seed"])) != (split, m["checkpoint"], int(m["seed"])):
                    raise CheckFailed(f"{rel} row {i}: its split/checkpoint/seed {r['split']}/{r['checkpoint']}/"
                                      f"{r['seed']} are not its path's")
            planned = {(int(t["task_id"]), int(t["sample"])) for t in select_tasks(
                [{"task_id": t} for t in self.split_ids[split]], ev.tasks, samples)}
            held = [(int(r["task_id"]), int(r["sample"])) for r in rows]
            if len(set(held)) != len(held):
                task, sample = next(k for k in held if held.count(k) > 1)
                raise CheckFailed(f"{rel}: task {task} sample {sample} appears twice")
            if set(held) != planned:
                extra, lost = sorted(set(held) - planned), sorted(planned - set(held))
                task, sample = (extra or lost)[0]
                count = ev.tasks  # null or left out: every task
                raise CheckFailed(f"{rel}: task {task} sample {sample} is {'not among' if extra else 'missing from'} "
                                  f"the rollouts the evaluation plans ({'all' if count is None else f'the first {count}'}"
                                  f" {split} tasks x {samples} samples)")
            rollouts += len(rows)
        return f"rows: {rollouts} rollouts, each one its split and the evaluation settings plan"

    def rederive_val(self) -> None:
        from predict.bundle.rederive import rederive_val

        try:
            rederive_val(self.config, self.root, self.work, inputs=self.manifest["inputs"])
        except Exception as e:  # a stage refusing the bundle's rows: its message names the file or row
            raise CheckFailed(f"the val statistics could not be re-derived: {e}") from None

    def check_ledger(self) -> str:
        import pyarrow.parquet as pq

        from predict.bundle.rederive import handed_config
        from predict.campaign import (
            SplitGuardError,
            base_model_identity,
            campaign_from_stats,
            config_differences,
            config_hash,
            design_config,
            frozen_under,
            read_ledger,
        )
        from predict.data import content_hash, load_split

        try:
            entries = read_ledger(self.root / LEDGER)
        except SplitGuardError as e:
            raise CheckFailed(str(e)) from None
        ident = self.manifest["campaign"]
        found = [(n, e) for n, e in entries if e.get("event") == "campaign" and e.get("campaign") == ident]
        if len(found) != 1:
            raise CheckFailed(f"{LEDGER}: {len(found)} lines record test campaign {ident}, the manifest's: one must")
        line, campaign = found[0]
        self.campaign = campaign
        where = f"{LEDGER}:{line}: test campaign {ident}"
        split_hash = content_hash(load_split(self.test_tasks))
        for n, e in entries:
            if e.get("event") == "campaign" and e.get("split_sha256") != split_hash:
                raise CheckFailed(f"{LEDGER}:{n}: campaign {e.get('campaign')} is on another test split "
                                  f"({str(e.get('split_sha256'))[:16]}...) than the one MBPP gives ({split_hash[:16]}...)")
        if not frozen_under(campaign, self.config):
            changed = config_differences(campaign.get("design"), design_config(self.config))
            raise CheckFailed(f"{where} froze design hash {campaign['config_hash'][:16]}..., the bundled config's is "
                              f"{config_hash(self.config)[:16]}...: it differs in {', '.join(changed[:6]) or 'the design'}")
        if campaign.get("base_model") != base_model_identity(self.config):
            raise CheckFailed(f"{where} evaluated base model {campaign.get('base_model')}, the config's is "
                              f"{base_model_identity(self.config)}")
        if sorted(map(int, campaign.get("task_ids") or ())) != sorted(self.split_ids["test"]):
            raise CheckFailed(f"{where}: its test task ids are not those MBPP split with the config's seed gives")
        # the bundle's val statistics (re-derived from the rows and compared after this check), read through the
        # campaign's slice as its stage reads it
        plan = [tuple(p) for p in campaign["plan"]]
        derived = campaign_from_stats(handed_config(self.config, "evaluate-test", self.work),
                                      self.root / "stats" / "metrics.parquet", self.root / "stats" / "selection.parquet")
        if plan != derived:
            first = next((a, b) for a, b in zip([*plan, None], [*derived, None], strict=False) if a != b)
            raise CheckFailed(f"{where}: its plan is not the one the val selection gives (first difference: "
                              f"{first[0]} planned, {first[1]} from stats/selection.parquet)")
        selection = [{"run": s["run"], "seed": int(s["seed"]), "checkpoint": s["checkpoint"]}
                     for s in pq.read_table(self.root / "stats" / "selection.parquet").to_pylist()]
        if campaign.get("selection") and campaign["selection"] != selection:
            raise CheckFailed(f"{where}: the selection it froze is not stats/selection.parquet's")
        self._check_planned_evaluations(where, plan, [(n, e) for n, e in entries
                                                      if e.get("campaign") == ident and "status" in e])
        return (f"ledger: one campaign ({ident}) on the re-derived test split, frozen under the bundled config's "
                f"design, {len(plan)} planned evaluations each done once with the bundled file and checkpoint")

    def _check_planned_evaluations(self, where: str, plan: Sequence[tuple[Any, ...]],
                                   mine: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        """`check_ledger` of the campaign's evaluations: every bundled test file and every ledger line (`mine`, the
        campaign's ``started``/``done`` lines) in the plan, each planned one done once with the bundled file and the
        manifest's checkpoint."""
        from predict.stats.metrics import EVAL_PATH

        identities = {(c["run"], c["checkpoint"], int(c["seed"])): c["identity"] for c in self.manifest["checkpoints"]}
        files = {}
        for rel in self.manifest["files"]:
            if (m := EVAL_PATH.search(rel)) and rel.startswith("eval/") and m["split"] == "test":
                key = (m["run"], m["checkpoint"], int(m["seed"]))
                if key not in plan:
                    raise CheckFailed(f"{rel}: {' '.join(map(str, key))} is not in the test campaign's plan ("
                                      f"{', '.join(' '.join(map(str, p)) for p in plan)}): evaluated outside it")
                files[key] = rel
        for n, e in mine:
            key = (e.get("run"), e.get("checkpoint"), e.get("seed"))
            if key not in plan:
                raise CheckFailed(f"{LEDGER}:{n}: {' '.join(map(str, key))} was {e['status']} on test outside the plan")
            if e.get("weights") and e["weights"] != identities.get(key):
                raise CheckFailed(f"{LEDGER}:{n}: {' '.join(map(str, key))} was evaluated with weights "
                                  f"{e['weights'][:24]}..., the manifest's checkpoint is {str(identities.get(key))[:24]}...")
        for key in plan:
            rel = files.get(key)
            if rel is None:
                raise CheckFailed(f"{where}: planned {' '.join(map(str, key))}, and the bundle holds no test evaluation of it")
            done = [(n, e) for n, e in mine if (e.get("run"), e.get("checkpoint"), e.get("seed")) == key
                    and e["status"] == "done"]
            if len(done) != 1:
                raise CheckFailed(f"{where}: {' '.join(map(str, key))} is recorded done {len(done)} times: once it must")
            if done[0][1].get("sha256") != sha256_file(self.root / rel):
                raise CheckFailed(f"{rel}: not the file the campaign recorded done ({LEDGER}:{done[0][0]}, sha256 "
                                  f"{str(done[0][1].get('sha256'))[:16]}...): its rows changed since")

    def check_tables(self, folders: Sequence[str]) -> str:
        import pyarrow.parquet as pq

        from predict.bundle.rederive import table_difference, tables

        mine, theirs = tables(self.root, folders), tables(self.work, folders)
        if extra := sorted(set(mine) - set(theirs)):
            raise CheckFailed(f"{extra[0]}: a table in the bundle that no stage re-derives from its rows")
        if lost := sorted(set(theirs) - set(mine)):
            raise CheckFailed(f"{lost[0]}: the stages re-derive this table, and the bundle does not hold it")
        numbers = 0
        for rel in mine:
            counted, difference = table_difference(rel, pq.read_table(self.root / rel), pq.read_table(self.work / rel))
            if difference:
                raise CheckFailed(difference)
            numbers += counted
        return f"statistics ({', '.join(folders)}): {len(mine)} tables, {numbers} numbers re-derived bit for bit"

    def rederive_test(self) -> None:
        from predict.bundle.rederive import rederive_test

        try:
            rederive_test(self.config, self.root, self.work, ledger=self.root / LEDGER)
        except Exception as e:  # the stage refusing the bundle's rows or ledger: its message names what
            raise CheckFailed(f"the test statistics could not be re-derived: {e}") from None

    def rederive_report(self) -> None:
        from predict.bundle.rederive import rederive_report

        try:
            rederive_report(self.config, self.root, self.work, inputs=self.manifest["inputs"], test_tasks=self.test_tasks,
                            example=self.manifest["report"].get("example"))
        except Exception as e:
            raise CheckFailed(f"the report could not be re-rendered: {e}") from None

    def check_report(self) -> str:
        import importlib.metadata

        from predict.bundle.rederive import report_difference, report_numbers

        bundled = (self.root / REPORT).read_text()
        here = importlib.metadata.version("matplotlib")
        recorded = self.manifest["environments"].get("pipeline", {}).get("packages", {}).get("matplotlib")
        difference = report_difference(bundled, (self.work / REPORT).read_text(), compare_figures=here == recorded)
        if difference:
            raise CheckFailed(difference)
        figures = "its figures byte for byte" if here == recorded else (
            f"its figures not compared (matplotlib {here} here, {recorded} in the bundle)")
        return f"report: {report_numbers(bundled)} numbers, re-rendered from the re-derived tables, equal; {figures}"

    def environment_note(self) -> str:
        """Where this machine's serving environment differs from the bundle's (a reason rows may differ)."""
        from predict.bundle.build import serving_environment

        here = serving_environment(self.bundled().serving).get("packages") or {}
        there = self.manifest["environments"].get("serving", {}).get("packages") or {}
        changed = sorted(k for k in set(here) | set(there) if here.get(k) != there.get(k))
        shown = ", ".join(f"{k} {there.get(k)} -> {here.get(k)}" for k in changed[:6])
        return f" (the serving environment differs from the bundle's: {shown})" if changed else ""

    # -- reproduced -----------------------------------------------------------------------------------------------

    def check_rerun(self, k: int, seed: int, checkpoints: Path | None) -> str:
        import pyarrow.parquet as pq

        from predict.bundle.rerun import RERUN_LOG, gpu_rerun_note, pick_rollouts, replay_test_rollouts, row_difference
        from predict.fingerprint import input_identity

        weights = self.root / "weights"
        root = checkpoints or (weights if weights.is_dir() else None)
        if root is None:
            raise CheckFailed("--rerun needs the checkpoints: --checkpoints RESULTS_DIR (the folder the manifest's "
                              "checkpoint paths are under), or a bundle built with bundle.weights")
        plan = [tuple(p) for p in self.campaign["plan"]]
        picks = pick_rollouts(self.root, plan, k, seed)
        entries = {(c["run"], c["checkpoint"], int(c["seed"])): c for c in self.manifest["checkpoints"]}
        models = {}
        for key in dict.fromkeys((p.run, p.checkpoint, p.seed) for p in picks):
            entry = entries[key]
            model = str(root / entry["path"]) if entry["path"] is not None else entry["model"]
            if (identity := input_identity(model)) != entry["identity"]:
                raise CheckFailed(f"{model}: checkpoint {' '.join(map(str, key))} hashes to {identity[:24]}..., the "
                                  f"campaign evaluated {entry['identity'][:24]}...: not the evaluated weights")
            models[key] = model
        selection = pq.read_table(self.root / "stats" / "selection.parquet").to_pylist()
        replayed = replay_test_rollouts(self.config, picks, models, tasks_path=self.test_tasks, selection=selection,
                                        ledger=self.root / LEDGER, scratch=self.work / "rerun")
        for pick, row in zip(picks, replayed, strict=True):
            bundled = pq.read_table(self.root / pick.evaluation).slice(pick.row, 1).to_pylist()[0]
            if difference := row_difference(bundled, row):
                raise CheckFailed(f"{pick.evaluation} row {pick.row} (task {pick.task_id}, sample {pick.sample}) "
                                  f"re-executed: {difference}{self.environment_note()}"
                                  f"{gpu_rerun_note(self.bundled().serving, self.work / 'rerun' / RERUN_LOG)}")
        return (f"rerun: {len(picks)} test rollouts re-executed from {len(models)} checkpoint(s) (rows chosen with "
                f"seed {seed}) give the bundled rows")


def _code_here() -> str | None:
    from predict.bundle.build import code_state

    return code_state()["commit"]


def _checkout_path(path: str) -> Path:
    """A config path relative to the current folder, else to the checkout this code runs from."""
    here = Path(path)
    if here.exists() or here.is_absolute():
        return here
    return Path(__file__).resolve().parents[3] / path


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Path]:
    """The bundle folder: `path` itself, or an archive unpacked into a scratch folder (its one top folder)."""
    if path.is_dir():
        yield path
        return
    if not tarfile.is_tarfile(path):
        raise CheckFailed(f"{path}: neither a bundle folder nor a bundle archive")
    with tempfile.TemporaryDirectory(prefix="predict-bundle-") as tmp, tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp) / ARCHIVE_ROOT


def _run(level: Level, check: Callable[[], str | None]) -> None:
    try:
        text = check()
    except CheckFailed as e:
        level.lines.append((False, str(e)))
        return
    if text:
        level.lines.append((True, text))


def verify(path: Path, *, rerun: int = 0, rerun_seed: int = 0, checkpoints: Path | None = None,
           mbpp: Path | None = None, work: Path | None = None) -> list[Level]:
    """The three verdicts of a bundle folder or archive (see the module docstring)."""
    levels = [Level(name) for name in LEVELS]
    available, functional, reproduced = levels
    with opened(path) as root, contextlib.ExitStack() as stack:
        scratch = work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="predict-verify-")))
        v = Verifier(root, scratch, mbpp=mbpp)
        for check in (v.check_manifest, v.check_files, v.check_complete):
            _run(available, check)
            if available.failures:
                break
        _settle(available, f"identity (manifest sha256) {manifest_digest(root)}" if not available.failures else "")
        if available.status != "checks out":
            functional.why = reproduced.why = "the bundle is not intact"
            return levels
        for check in (v.check_config, v.check_split, v.check_rows, v.check_ledger, v.rederive_val,
                      lambda: v.check_tables(("stats", "ablations", "extensions")), v.rederive_test,
                      lambda: v.check_tables(("test/stats",)), v.rederive_report, v.check_report):
            _run(functional, check)
            if functional.failures:
                break  # a later check would only read what this one found wrong
        _settle(functional, "")
        if functional.status != "checks out":
            reproduced.why = "it is not functional"
        elif rerun <= 0:
            reproduced.why = "re-executing test rollouts needs --rerun K and the checkpoints"
        else:
            _run(reproduced, lambda: v.check_rerun(rerun, rerun_seed, checkpoints))
            _settle(reproduced, "")
    return levels


def _settle(level: Level, note: str) -> None:
    level.status = "fails" if level.failures else "checks out"
    level.why = level.failures[0] if level.failures else note


# `predict verify-bundle PATH`
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="the bundle folder (results/bundle) or its archive (results/bundle.tar.gz)")
    p.add_argument("--rerun", type=int, default=0, metavar="K",
                   help="re-execute K test rollouts and compare them row for row (needs the checkpoints)")
    p.add_argument("--rerun-seed", type=int, default=0, help="which rows --rerun picks (choose your own)")
    p.add_argument("--checkpoints", default=None,
                   help="the results folder the manifest's checkpoint paths are under (default: the bundle's "
                        "weights/, where it has them)")
    p.add_argument("--mbpp", default=None, help="the MBPP file to re-derive the split from (default: the config's "
                                                "data.mbpp_path)")
    p.add_argument("--work", default=None, help="keep the re-derived tables and report here (default: a scratch "
                                                "folder, removed)")


def main(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from predict.outputs import console

    t0 = time.perf_counter()
    try:
        levels = verify(Path(args.bundle), rerun=args.rerun, rerun_seed=args.rerun_seed,
                        checkpoints=Path(args.checkpoints) if args.checkpoints else None,
                        mbpp=Path(args.mbpp) if args.mbpp else None, work=Path(args.work) if args.work else None)
    except CheckFailed as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 1
    for level in levels:
        for ok, text in level.lines:
            console.print(f"  {'[green]ok[/green]  ' if ok else '[red]FAIL[/red]'} {escape(text)}", soft_wrap=True)
    console.print(f"verify-bundle {args.bundle} ({time.perf_counter() - t0:.1f} s):")
    colour = {"checks out": "green", "fails": "red", "not checked": "yellow"}
    for level in levels:
        console.print(f"  {level.name:<11} [{colour[level.status]}]{level.status}[/{colour[level.status]}]"
                      f"{': ' + escape(level.why) if level.why else ''}", soft_wrap=True)
    failed = next((level for level in levels if level.status == "fails"), None)
    if failed is not None:
        console.print(f"[red]does not check out:[/red] {escape(failed.why)}", soft_wrap=True)
        return 1
    return 0

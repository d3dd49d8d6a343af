"""The test campaign: which checkpoints the frozen test evaluates, the design it freezes, and the ledger that keeps
the test split touched once. The one owner of checkpoint selection, the campaign plan, the design hash and the
ledger (read, lock, admit, append): `predict.evaluate`, `predict.rollouts`, `predict.stats`, the report and the rules
ask it; nothing else reads or writes the ledger.

Rules:

* Checkpoint selection reads val only (`select_checkpoints`), under ``evaluation.selection`` (its default: fixed step
  100, predict.config.models.SelectionSettings; `selection_settings`). ``fixed`` takes ``step{N}``; ``best_val`` the step checkpoint with the
  highest val pass@1 (ties: the earlier step). A run with no step checkpoint falls back to its last evaluated
  checkpoint by name (``sft`` over ``base``, whatever order the evaluations come in; ``fallback=True``).
* The plan (`campaign_plan`): per run and seed the checkpoint selection chose on val, then any of
  ``evaluation.test_checkpoints`` it was evaluated at on val; for an arm also its reference (``evaluation.reference``,
  the SFT checkpoint), evaluated ONCE, under the first seed: the same weights serve every seed's RL-vs-SFT comparison
  (`evaluation_seed` says which file holds a seed's reference).
* The design (`design_config`, `config_hash`): the config without `NOT_RESULT_SHAPING` (names, where results and
  the registry live, the power grid, SLURM sizes, how jobs are served). The bootstrap is part
  of it: the test's statistics settings are frozen with it.
* ONE registry per checkout, outside every results_dir (`registry_ledger`: ``<checkout>/.test-campaigns/ledger.jsonl``;
  ``PREDICT_TEST_CAMPAIGNS`` names another file, for tests). Every config run from the checkout shares it, so a new
  results_dir or run_name is no new ledger.
* A campaign is keyed on the test split (`predict.data.derive_test_split` of the design's ``data`` section: its
  content hash, the manifest's ``content_sha256`` of test), never on the file it is handed, and the base model
  (`base_model_identity`: the embedded default's tiny model is never the paper's base model). The tasks file must
  hold exactly that split, in any order and under any name (`check_campaign_tasks`): a subset, a superset or an
  edited copy is refused, never a campaign of its own. Its line records the design hash and design, the plan, the
  val selection, what its results depend on (vLLM version, device, serving flags: `serving_dependencies`), where it
  was run from, and the reason when it was declared.
* Missing history is a refusal, never a fresh start (`history_traces`): a campaign starts fresh on a split and base
  model only where the ledger holds none and the results folder holds no trace of one (test evaluations or their
  ``.partial`` folders the ledger does not know, test statistics, a report with a test section, an older
  per-results ledger, ledger lines of a campaign whose line is gone).
* A test evaluation records in the checkout's registry and nowhere else (`evaluation_ledger`): another
  ``--test-ledger`` is refused, never created. Reading a ledger for analysis is `predict stats --test-ledger`'s.
* Refused, each naming the ledger and what differs: a second campaign on the same key under another design unless it
  is declared (``--new-campaign "why"``; the report then lists every campaign on the split with its reason); an
  evaluation outside the plan; a second evaluation of an entry (``done``); a resume whose weights differ from those its
  ``started`` line hashed. An interrupted campaign resumes from its persisted rollouts: that is no second evaluation.
* Test statistics (`check_test_inputs`) read only evaluation files the ledger records ``done`` (by their sha256), all
  of one campaign, exactly its plan, under its selection and its statistics settings.
* The seal: no stage but the campaign reads a test task, whatever file, name, folder or ledger state it is handed.
  Sealed (`sealed_sources`): the test split the stage's own config defines (`predict.data.derive_test_split`, in any
  clone, with no registry and no split file), every test split the registry has registered (`register_split`, called
  by `predict split`), and every task a campaign of this checkout evaluated (its line's ``task_ids``), whatever the
  config, the split or the file says now. Every stage that reads tasks names the flags that hold them in its stage
  table entry (`predict.stages.Stage.task_files`); `seal_stage` checks them by task id, called by `predict.cli` before
  the stage claims its results folder, writes a byte or starts a process (`predict signal` calls `seal_task_ids` on
  the tasks it derives). The campaign's own file must be the test split (`check_campaign_tasks`). Inside the rollout
  stage, `guard_tasks` refuses again, by the registry's ids, before a ``.partial`` folder or a server exists; a test
  job without its campaign's admission in the ledger (or without a ledger) is refused. A file's name never decides.
  Each refusal names the file, the first few task ids and what to do.
* Read access for tools that check a campaign (the reviewer bundle): `split_history` (every registry line of one
  test split: its registrations, its campaigns, their started and done lines) and `replay` (the one door through
  which test rollouts the ledger already records may be re-executed, for the same weights and design, writing
  nowhere).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predict.config.models import DataSettings, EvaluationSettings, ModelSettings, SelectionSettings, StudyConfig
from predict.stages import UNTRACKED, Stage, StageView, field_value, pick, stage_view, without_keys

if TYPE_CHECKING:
    from predict.data import TestSplit

log = logging.getLogger(__name__)

STEP = re.compile(r"^step(\d+)$")

# Config keys (dotted) that shape no evaluation: names, where results go, the power grid, SLURM sizes, how jobs are
# served (stages.UNTRACKED: one shared server or one per job), where training curves go, a declared campaign's
# reason, and what the bundle a reviewer checks holds (predict.bundle: weights or not). Changing them is not a new
# design, so the campaign's hash leaves them out.
NOT_RESULT_SHAPING = ("run_name", "results_dir", "power", "cluster", "bundle", *UNTRACKED)

REGISTRY_ENV = "PREDICT_TEST_CAMPAIGNS"
_CHECKOUT = Path(__file__).resolve().parents[2]


class SplitGuardError(RuntimeError):
    """A rollout, an evaluation or a statistic would touch the test split outside its one campaign."""


class StatsInputError(ValueError):
    """An evaluation file is missing, misnamed or disagrees with its path (or with the selection)."""


def first_ids(ids: Iterable[int], n: int = 6) -> str:
    """The first few task ids, for a refusal: ``2, 3, 4, 5, 7, 8, ... (12 in all)``."""
    ids = sorted(ids)
    return ", ".join(map(str, ids[:n])) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")


# -- checkpoint selection ---------------------------------------------------------------------------------------------


CAMPAIGN_STAGE = "evaluate-test"
"""The stage table entry of the test campaign: the one stage whose task file must be the test split, and the entry
through which this module reads a plain config mapping (a whole config, a test's) as typed sections."""


def campaign_view(config: Mapping[str, Any] | StageView) -> StageView:
    """The typed view this module reads a config through: a stage's own view or slice as it is (its entry says
    what it may read), any other mapping through the campaign's entry (`CAMPAIGN_STAGE`)."""
    return stage_view(config, CAMPAIGN_STAGE)


def campaign_test_split(config: Mapping[str, Any] | StageView) -> TestSplit:
    """The test split of the config's typed ``data`` section (`predict.data.derive_test_split`), read through
    `campaign_view`: the split a campaign is keyed on, never a file's."""
    from predict.data import derive_test_split  # noqa: PLC0415

    return derive_test_split(campaign_view(config).data)


def selection_settings(config: Mapping[str, Any] | StageView) -> dict[str, Any]:
    """``evaluation.selection`` as its model types it; a config left without one selects the model's default."""
    selection = getattr(campaign_view(config).evaluation, "selection", None)  # MissingSection reads as left out
    return (selection if selection is not None else SelectionSettings()).model_dump()


def step_of(checkpoint: str) -> int | None:
    m = STEP.match(checkpoint)
    return int(m.group(1)) if m else None


def select_checkpoints(metrics: Sequence[Mapping[str, Any]], mode: str, step: int | None) -> list[dict[str, Any]]:
    """Per run and seed, the checkpoint selection reads on val only (see the module docstring). `metrics`: rows with
    run, seed, checkpoint, split, pass_at_1 (and n_pass, n_scored)."""
    val = [m for m in metrics if m["split"] == "val"]
    out = []
    for run, seed in sorted({(m["run"], m["seed"]) for m in val}):
        # by name, so the fallback below is the same whatever order the caller read the evaluations in
        mine = sorted((m for m in val if (m["run"], m["seed"]) == (run, seed)), key=lambda m: m["checkpoint"])
        steps = sorted((s, m) for m in mine if (s := step_of(m["checkpoint"])) is not None)
        chosen, fallback = None, False
        if mode == "fixed":
            chosen = next((m for s, m in steps if s == step), None)
        elif mode == "best_val":
            chosen = max(steps, key=lambda sm: (sm[1]["pass_at_1"], -sm[0]), default=(None, None))[1]
        else:
            raise ValueError(f"evaluation.selection.mode: {mode!r} is neither fixed nor best_val")
        if chosen is None:
            if steps:
                raise StatsInputError(f"run {run} seed {seed}: selection step{step} was not evaluated on val "
                                      f"(have {', '.join(m['checkpoint'] for _, m in steps)})")
            chosen, fallback = mine[-1], True
        out.append({"run": run, "seed": seed, "mode": mode, "step": step, "checkpoint": chosen["checkpoint"],
                    "val_pass_at_1": chosen["pass_at_1"], "val_n_pass": chosen.get("n_pass"),
                    "val_n_scored": chosen.get("n_scored"), "fallback": fallback})
    return out


def select(config: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`select_checkpoints` under the config's ``evaluation.selection``: what `predict stats`, the ablation and the
    extension tables and the campaign's planning all call."""
    settings = selection_settings(config)
    return select_checkpoints(metrics, settings["mode"], settings.get("step"))


# -- the design ---------------------------------------------------------------------------------------------------------


def design_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config without `NOT_RESULT_SHAPING`: what a frozen design is."""
    return without_keys(config, NOT_RESULT_SHAPING)


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the design (`design_config`) as canonical JSON: what the ledger records."""
    return hashlib.sha256(json.dumps(design_config(config), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs (for a message that says what changed)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in config_differences(old.get(key), new.get(key), f"{prefix}{key}.")]  # fmt: skip
    return [] if old == new else [prefix.rstrip(".") or "(whole config)"]


def base_model_identity(config: Mapping[str, Any]) -> str:
    """The base model a campaign is keyed on: ``model.base``, and for the embedded default's random tiny Qwen3 its
    builder's settings (so it can never be mistaken for the paper's base model, nor one tiny model for another)."""
    model = config.get("model") or {}
    base = field_value(ModelSettings, "base", model.get("base"))  # typed by its field; the tiny settings stay plain
    return f"{base}:{json.dumps(model.get('tiny') or {}, sort_keys=True)}" if base == "tiny" else base


def campaign_id(split_hash: str, base_model: str, design_hash: str) -> str:
    return hashlib.sha256(f"{split_hash}\0{base_model}\0{design_hash}".encode()).hexdigest()[:16]


def results_origin(out: Path) -> dict[str, Any]:
    """Where a campaign ran from, read off one of its outputs (``<results_dir>/eval/{run}/{checkpoint}/test/
    seed{seed}.parquet``): the results folder and the run_name that claimed it (`predict.fingerprint`). Not from the
    config, so a rename reruns no test evaluation."""
    from predict.fingerprint import RUN_NAME_FILE  # noqa: PLC0415

    parents = Path(out).resolve().parents
    results = parents[4] if len(parents) > 4 and parents[3].name == "eval" else parents[0]  # else: a file by hand
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return {"results_dir": str(results), "run_name": json.loads((results / RUN_NAME_FILE).read_text())["run_name"]}
    return {"results_dir": str(results), "run_name": None}


def serving_dependencies(serving: Mapping[str, Any], concurrency: int) -> dict[str, Any]:
    """What a greedy evaluation's rows depend on beyond the checkpoint and the design: `predict.serving.identity.serving_identity`
    (vLLM version, device and its name, batch invariance, requests in flight) and the serving settings."""
    from predict.serving.identity import serving_identity  # noqa: PLC0415

    return {**serving_identity(serving, concurrency=concurrency),
            "serving": {k: v for k, v in serving.items() if k not in ("python", "shared")}}


# -- the plan -----------------------------------------------------------------------------------------------------------

CampaignEntry = tuple[str, str, int]  # (run, checkpoint, seed)


def evaluation_seed(config: Mapping[str, Any], run: str, checkpoint: str, seed: int) -> int:
    """The seed whose test file holds run/checkpoint for `seed`: an arm's reference is evaluated once, under the first
    seed (one SFT checkpoint per arm); everything else under its own seed."""
    reference = campaign_view(config).evaluation.reference
    if run in config["arms"] and checkpoint == reference:
        return field_value(StudyConfig, "seeds", config["seeds"])[0]
    return int(seed)


def campaign_checkpoints(config: Mapping[str, Any], run: str, seed: int, val_checkpoints: Sequence[str],
                         selected: str) -> list[str]:
    """A run/seed's test evaluations (see the module docstring): for an arm its reference under the first seed only,
    the checkpoint selection chose on val, and any of ``evaluation.test_checkpoints`` it was evaluated at on val.
    The selected checkpoint is dropped where it is the reference, evaluated under the first seed."""
    ev = campaign_view(config).evaluation
    reference = ev.reference
    wanted = [reference] if run in config["arms"] and reference else []
    wanted += [selected, *ev.test_checkpoints]
    return [c for c in dict.fromkeys(wanted)
            if (c == selected or c in val_checkpoints) and evaluation_seed(config, run, c, seed) == seed]


def study_order(config: Mapping[str, Any]) -> dict[str, int]:
    from predict.runs import study_runs  # noqa: PLC0415

    return {run: i for i, run in enumerate(study_runs(config))}


def campaign_plan(config: Mapping[str, Any], val_checkpoints: Mapping[tuple[str, int], Sequence[str]],
                  selected: Mapping[tuple[str, int], str]) -> list[CampaignEntry]:
    """Every (run, checkpoint, seed) the campaign evaluates, in study order (`predict.runs.study_runs`)."""
    order = study_order(config)
    keys = sorted(selected, key=lambda rs: (order.get(rs[0], len(order)), rs[0], rs[1]))
    return [(run, c, seed) for run, seed in keys
            for c in campaign_checkpoints(config, run, seed, val_checkpoints.get((run, seed), ()),
                                          selected[(run, seed)])]  # fmt: skip


def planned_selection(config: Mapping[str, Any], val_checkpoints: Mapping[tuple[str, int], Sequence[str]]) -> dict:
    """The checkpoint ``evaluation.selection.mode: fixed`` chooses, known before any evaluation (the workflow builds
    the campaign's jobs from it): `select` itself, given the val checkpoints."""
    if (mode := selection_settings(config)["mode"]) != "fixed":
        raise ValueError(f"evaluation.selection.mode {mode!r}: the choice is known only after val")
    metrics = [{"run": run, "seed": seed, "checkpoint": c, "split": "val", "pass_at_1": math.nan}
               for (run, seed), checkpoints in val_checkpoints.items() for c in checkpoints]  # fmt: skip
    return {(r["run"], r["seed"]): r["checkpoint"] for r in select(config, metrics)}


def read_selection(selection_path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # noqa: PLC0415

    return pq.read_table(selection_path).to_pylist()


def campaign_from_stats(config: Mapping[str, Any], val_metrics: Path, selection_path: Path) -> list[CampaignEntry]:
    """The campaign plan from the val statistics: the checkpoints each run/seed was evaluated at (metrics.parquet)
    and the one selection chose (selection.parquet)."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    val_checkpoints: dict[tuple[str, int], list[str]] = {}
    for row in pq.read_table(val_metrics, columns=["run", "checkpoint", "split", "seed"]).to_pylist():
        if row["split"] == "val":
            val_checkpoints.setdefault((row["run"], int(row["seed"])), []).append(row["checkpoint"])
    selected = {(r["run"], int(r["seed"])): r["checkpoint"] for r in read_selection(selection_path)}
    return campaign_plan(config, val_checkpoints, selected)


# -- the ledger ---------------------------------------------------------------------------------------------------------


def registry_ledger() -> Path:
    """The checkout's one campaign ledger (see the module docstring)."""
    if env := os.environ.get(REGISTRY_ENV):
        return Path(env)
    in_checkout = (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "src" / "predict").is_dir()
    return (_CHECKOUT if in_checkout else Path.cwd()) / ".test-campaigns" / "ledger.jsonl"


def evaluation_ledger(given: Path | None = None) -> Path:
    """The ledger a test evaluation records in: the checkout's registry (`registry_ledger`), and only that. A ledger
    elsewhere would be a second history in which the test split was never touched, so `given` (``predict evaluate
    --test-ledger``) must name the registry itself; any other path is refused, never created."""
    registry = registry_ledger()
    if given is not None and Path(given).resolve() != registry.resolve():
        raise SplitGuardError(
            f"--test-ledger {given}: a test evaluation records in the checkout's campaign registry ({registry}) and "
            "nowhere else; a ledger elsewhere would start a second history of the test split. Leave --test-ledger "
            "out (it is `predict stats`' flag: there it reads a ledger for analysis and never creates one)")
    return registry


def split_history(ledger: Path, split_sha256: str) -> list[dict[str, Any]]:
    """Every line of `ledger` about one test split (its content hash: `predict.data.derive_test_split(...).sha256`,
    a campaign line's ``split_sha256``), in file order, each with its ``line`` number: the split's registrations
    (``event: split``), its campaigns (``event: campaign``) and their ``started`` and ``done`` lines. Read only: a
    missing ledger reads as no line (whether that is a refusal is the caller's to say); nothing is locked or
    written."""
    entries = read_ledger(Path(ledger))
    campaigns = {e.get("campaign") for _, e in entries
                 if e.get("event") == "campaign" and e.get("split_sha256") == split_sha256}  # fmt: skip
    return [{**e, "line": n} for n, e in entries
            if (e.get("event") == "split" and e.get("content_sha256") == split_sha256)
            or (e.get("event") == "campaign" and e.get("split_sha256") == split_sha256)
            or ("status" in e and e.get("campaign") in campaigns)]  # fmt: skip


def read_ledger(ledger: Path) -> list[tuple[int, dict[str, Any]]]:
    """The ledger's entries with their line numbers in the file (blank lines skipped): the one reader of it. A line
    that is not a JSON object (a torn write, a hand edit) stops the run naming the file and line: the ledger is what
    keeps the test split touched once, so it is never read past."""
    if not ledger.exists():
        return []
    entries = []
    for line_number, line in enumerate(ledger.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            why = None if isinstance(entry, dict) else f"a JSON {type(entry).__name__}, not an object"
        except json.JSONDecodeError as e:
            why = f"not JSON: {e.msg}"
        if why is not None:
            raise SplitGuardError(f"{ledger}:{line_number}: not a ledger entry ({why}); repair or restore the "
                                  "ledger, never delete it")
        entries.append((line_number, entry))
    return entries


@contextlib.contextmanager
def ledger_lock(ledger: Path) -> Iterator[None]:
    """The ledger's lock (`<ledger>.lock`): a campaign's jobs may run at once (SLURM, a shared filesystem, where
    appends from two machines can interleave), so every read-then-write and every append holds it."""
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger.with_name(ledger.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _append(ledger: Path, entry: Mapping[str, Any]) -> None:
    """Append one line; the caller holds `ledger_lock`."""
    with open(ledger, "a") as f:
        f.write(json.dumps(dict(entry), sort_keys=True) + "\n")


def _now() -> str:
    return time.strftime("%FT%T%z")


def _key(entry: Mapping[str, Any]) -> CampaignEntry:
    return (entry.get("run", entry.get("arm")), entry.get("checkpoint"), entry.get("seed"))


def register_split(ledger: Path, test_rows: Sequence[Mapping[str, Any]], content_sha256: str) -> None:
    """Tell the registry which task ids a test split holds (`predict split`), so that no rollout outside its
    campaign touches one of them, whatever its file is called. Once per split content."""
    with ledger_lock(ledger):
        if any(e.get("event") == "split" and e.get("content_sha256") == content_sha256 for _, e in read_ledger(ledger)):
            return
        _append(ledger, {"event": "split", "content_sha256": content_sha256,
                         "task_ids": sorted(int(r["task_id"]) for r in test_rows), "time": _now()})  # fmt: skip


def test_task_ids(ledger: Path) -> set[int]:
    """Every test task id the registry knows: of the splits registered and of every campaign."""
    return {int(t) for _, e in read_ledger(ledger) if e.get("event") in ("split", "campaign")
            for t in e.get("task_ids") or ()}  # fmt: skip


test_task_ids.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


@dataclass(frozen=True)
class Admission:
    """What one admitted test evaluation carries into its rollout job and its ledger lines."""

    campaign: str  # the campaign id
    ledger: Path
    weights: str  # `predict.fingerprint.input_identity` of the model

    def fields(self) -> dict[str, Any]:
        return {"campaign": self.campaign, "weights": self.weights}


class TestLedger:
    """The campaign ledger (see the module docstring): ``campaign`` lines, each followed over time by a ``started``
    and a ``done`` line per evaluation, and ``split`` lines naming the test task ids."""

    __test__ = False  # not a pytest class

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def entries(self) -> list[dict[str, Any]]:
        return [e for _, e in read_ledger(self.path)]

    def campaigns(self, split_hash: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e.get("event") == "campaign"
                and (split_hash is None or e.get("split_sha256") == split_hash)]  # fmt: skip

    def admit(
        self,
        config: Mapping[str, Any],
        plan: Sequence[CampaignEntry],
        evaluations: Sequence[tuple[str, str, int, str]],
        *,
        tasks_path: Path,
        selection: Sequence[Mapping[str, Any]] = (),
        depends_on: Mapping[str, Any] | None = None,
        origin: Mapping[str, Any] | None = None,
        new_campaign: str | None = None,
    ) -> list[Admission]:
        """Admit these evaluations ((run, checkpoint, seed, model) each) into the campaign of this split, base model
        and design, recording the campaign on its first evaluation; refuse (see the module docstring) naming the
        ledger and what differs. Every evaluation is admitted before any server starts."""
        from predict.fingerprint import input_identity  # noqa: PLC0415

        split = campaign_test_split(config)
        check_campaign_tasks(tasks_path, split)
        split_hash, base, digest = split.sha256, base_model_identity(config), config_hash(config)
        ident = campaign_id(split_hash, base, digest)
        weights = {(r, c, int(s)): input_identity(m) for r, c, s, m in evaluations}
        if not self.path.exists():  # ledger_lock would create its folder: refuse first where history is missing
            refuse_missing_history(self.path, [], split_hash, (origin or {}).get("results_dir"))
        with ledger_lock(self.path):
            entries = read_ledger(self.path)
            same_key = [e for _, e in entries if e.get("event") == "campaign" and e.get("split_sha256") == split_hash
                        and e.get("base_model") == base]  # fmt: skip
            campaign = next((e for e in same_key if e.get("campaign") == ident), None)
            if not same_key:  # a fresh start on this split and base model: only where no history is missing
                refuse_missing_history(self.path, [e for _, e in entries], split_hash,
                                       (origin or {}).get("results_dir"))
            if campaign is None:
                if same_key and not new_campaign:
                    last = same_key[-1]
                    changed = config_differences(last.get("design"), design_config(config))
                    raise SplitGuardError(
                        f"{self.path}: the test campaign on this split and base model ({base}) was frozen at "
                        f"{last['time']} under config hash {last['config_hash'][:12]}"
                        f"{' (from ' + str(last.get('results_dir')) + ')' if last.get('results_dir') else ''}; "
                        f"this evaluation runs under {digest[:12]}, which differs in "
                        f"{', '.join(changed[:8]) or 'the design'}: the test split is touched once per frozen design. "
                        "A second campaign must be declared: --new-campaign \"why\" (config evaluation.new_campaign), "
                        "and the report lists it"
                    )
                campaign = {
                    "event": "campaign", "campaign": ident, "config_hash": digest, "design": design_config(config),
                    "split_sha256": split_hash, "base_model": base, "task_ids": sorted(split.task_ids),
                    "plan": [list(e) for e in plan], "selection": [_selection_key(s) for s in selection],
                    "depends_on": dict(depends_on or {}), **dict(origin or {}),
                    "reason": new_campaign if same_key else None,
                    "time": _now(),
                }
                _append(self.path, campaign)
                log.info("%s: test campaign %s frozen: config hash %s, %d evaluations%s", self.path, ident,
                         digest[:12], len(plan), f" (declared: {new_campaign})" if same_key else "")  # fmt: skip
            planned = [tuple(e) for e in campaign["plan"]]
            for run, checkpoint, seed, _ in evaluations:
                entry = (run, checkpoint, int(seed))
                if entry not in planned:
                    raise SplitGuardError(
                        f"{self.path}: {run} {checkpoint} seed {seed} is not in the test campaign's list, fixed at "
                        f"{campaign['time']}: {', '.join(f'{r} {c} seed {s}' for r, c, s in planned)}"
                    )
                for line_number, e in entries:
                    if e.get("campaign") != ident or _key(e) != entry or "status" not in e:
                        continue
                    if e["status"] == "done":
                        raise SplitGuardError(
                            f"{self.path}:{line_number}: {run} {checkpoint} seed {seed} was already evaluated on test "
                            f"at {e['time']}; the test split is touched once per frozen design"
                        )
                    if e.get("weights") not in (None, weights[entry]):
                        raise SplitGuardError(
                            f"{self.path}:{line_number}: {run} {checkpoint} seed {seed} was started on test at "
                            f"{e['time']} with other weights ({e['weights'][:24]}..., now {weights[entry][:24]}...): "
                            "a campaign resumes only the weights it started with"
                        )
        return [Admission(ident, self.path, weights[(r, c, int(s))]) for r, c, s, _ in evaluations]

    def record(self, entry: Mapping[str, Any], status: str) -> None:
        """Append a ``started`` or ``done`` line of an admitted evaluation."""
        with ledger_lock(self.path):
            _append(self.path, {**entry, "status": status, "time": _now()})


def _selection_key(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"run": row["run"], "seed": int(row["seed"]), "checkpoint": row["checkpoint"]}


def check_campaign_tasks(tasks_path: Path, split: Any) -> None:
    """Refuse a test campaign's tasks file unless it holds exactly `split` (a `predict.data.TestSplit`): every task
    of it, nothing else, each row as the split has it; the order and the file's name do not matter."""
    from predict.data import FIELDS, load_split  # noqa: PLC0415

    rows = load_split(tasks_path)
    given = {int(r["task_id"]): r for r in rows}
    expected = {int(r["task_id"]): r for r in split.rows}
    problems = []
    if missing := set(expected) - set(given):
        problems.append(f"it lacks {len(missing)} of its {len(expected)} tasks ({first_ids(missing)})")
    if extra := set(given) - set(expected):
        problems.append(f"it holds {len(extra)} tasks outside it ({first_ids(extra)})")
    if edited := {t for t in set(given) & set(expected) if any(given[t][f] != expected[t][f] for f in FIELDS)}:
        problems.append(f"{len(edited)} of its rows differ from the split's ({first_ids(edited)})")
    if len(rows) != len(given):
        problems.append(f"{len(rows) - len(given)} task ids appear twice")
    if problems:
        raise SplitGuardError(
            f"{tasks_path}: not {split.describe()}: {'; '.join(problems)}. The test campaign evaluates that split "
            "whole, whatever its file is called or ordered: a subset, a superset or an edited copy is the same "
            "campaign's split, not a campaign of its own. Pass the split `predict split` wrote "
            "(results/data/test.parquet)")


def history_traces(results_dir: str | Path | None, entries: Sequence[Mapping[str, Any]],
                   split_sha256: str) -> list[str]:
    """What in `results_dir` and in the ledger's `entries` shows that a test campaign ran there that the ledger does
    not record (see the module docstring), each in a few words; empty when there is none."""
    from predict.fingerprint import file_sha256  # noqa: PLC0415

    campaigns = {e.get("campaign") for e in entries if e.get("event") == "campaign"}
    on_split = any(e.get("event") == "campaign" and e.get("split_sha256") == split_sha256 for e in entries)
    known_out = {str(Path(e["out"]).resolve()) for e in entries if e.get("out") and "status" in e}
    known_sha = {e["sha256"] for e in entries if e.get("status") == "done" and e.get("sha256")}
    found = []
    if orphans := [e for e in entries if "status" in e and e.get("campaign") not in campaigns]:
        found.append(f"{len(orphans)} started/done line(s) of campaign(s) the ledger has no campaign line for "
                     f"({', '.join(sorted({str(e.get('campaign')) for e in orphans})[:3])})")
    results = Path(results_dir) if results_dir else None
    if results is None or not results.is_dir():
        return found
    for out in sorted(results.glob("eval/*/*/test/seed*.parquet")):
        if str(out.resolve()) not in known_out and file_sha256(out) not in known_sha:
            found.append(f"test evaluation {out}")
    for partial in sorted(results.glob("eval/*/*/test/seed*.parquet.partial")):
        out = partial.with_name(partial.name.removesuffix(".partial"))  # ResumableParquet.partial_dir_of
        if str(out.resolve()) not in known_out:
            found.append(f"an interrupted test evaluation {partial}")
    if not on_split:
        if tables := sorted((results / "test" / "stats").glob("*.parquet")):
            found.append(f"test statistics {results / 'test' / 'stats'} ({len(tables)} tables)")
        report = results / "report" / "index.html"
        if report.is_file() and 'id="test-' in report.read_text(errors="replace"):
            found.append(f"a report with a test section {report}")
        if (old := results / "test" / "ledger.jsonl").exists():
            found.append(f"an older per-results ledger {old}")
    return found


def refuse_missing_history(ledger: Path, entries: Sequence[Mapping[str, Any]], split_sha256: str,
                           results_dir: str | Path | None) -> None:
    """Refuse to start a test campaign afresh where `history_traces` finds one the ledger does not record."""
    if found := history_traces(results_dir, entries, split_sha256):
        state = "is missing" if not ledger.exists() else "records no test campaign on this split and base model"
        raise SplitGuardError(
            f"{ledger} {state}, yet a campaign's traces exist: {'; '.join(found[:6])}"
            f"{f'; and {len(found) - 6} more' if len(found) > 6 else ''}. A missing ledger is a refusal, never a "
            f"fresh start: restore {ledger} (a backup, or the checkout that ran the campaign) and run again; if "
            "these files are no campaign's, move them out of the results folder yourself")


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
                     and e.get("campaign") == admission["campaign"]), None)  # fmt: skip
    if campaign is None or entry not in [tuple(p) for p in campaign["plan"]]:
        raise SplitGuardError(f"{ledger}: run {run} checkpoint {checkpoint} seed {seed} has no admission in test "
                              f"campaign {admission['campaign']}")
    for line_number, e in entries:
        if e.get("campaign") == admission["campaign"] and _key(e) == entry and e.get("status") == "done":
            raise SplitGuardError(f"{ledger}:{line_number}: run {run} checkpoint {checkpoint} seed {seed} was already "
                                  f"evaluated on test at {e['time']}; the test split is touched once")


# -- the seal: no stage but the campaign reads a test task ------------------------------------------------------------

def sealed_sources(data: DataSettings, ledger: Path | None = None) -> list[tuple[frozenset[int], str]]:
    """Every sealed set of task ids with why it is sealed (see the module docstring): the config's own test split,
    then the registry's registered splits and evaluated campaigns. `ledger`: the registry (default the checkout's,
    `registry_ledger`); a missing registry adds nothing and is not created."""
    from predict.data import derive_test_split  # noqa: PLC0415

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
    from predict.data import task_ids_of  # noqa: PLC0415

    seal_task_ids(task_ids_of(path), data, source=path, stage=stage, ledger=ledger)


def seal_stage(stage: Stage, args: argparse.Namespace, config: Mapping[str, Any]) -> None:
    """The seal at a stage's entry (`predict.cli`, before anything is written or started): every file the stage
    table says holds its tasks (`Stage.task_files`) holds no sealed task; the test campaign's is the test split. A
    flag left out, or a file that does not exist (nothing to read: the stage's own error names it), is skipped."""
    from predict.data import derive_test_split  # noqa: PLC0415

    for dest in stage.task_files:
        if (value := getattr(args, dest, None)) is None or not Path(value).exists():
            continue
        data = stage_view(config, stage.name).data  # every entry with task files reads SPLIT (the stage table)
        if stage.name == CAMPAIGN_STAGE:
            check_campaign_tasks(Path(value), derive_test_split(data))
        else:
            seal_file(value, data, stage=stage.name)


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
    evaluation (run, checkpoint, seed) as ``done`` in a campaign on the test split of the config's ``data``, under the
    same design (`predict.campaign.config_hash`) and the same weights (`model`'s content,
    `predict.fingerprint.input_identity`), and every one of `task_ids` was among the tasks it evaluated. Refused
    otherwise (`SplitGuardError`, naming what differs). The caller rolls `Replay.tasks` out in memory (e.g.
    `predict.env.runner.run_rollouts_sync`) and writes the rows nowhere: not into results, not into the ledger, and
    never through `predict.rollouts` or `predict evaluate`, which persist and record."""
    from predict.fingerprint import input_identity  # noqa: PLC0415

    ledger = Path(ledger) if ledger is not None else registry_ledger()
    if not ledger.exists():
        raise SplitGuardError(f"{ledger}: no such ledger; a replay re-executes test rollouts a ledger records as "
                              "done: name the campaign's ledger (it is read, never created)")
    split = campaign_test_split(config)
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
    if "samples" not in evaluation:  # every campaign line records its evaluation section, filled (predict.evaluate)
        raise SplitGuardError(f"{where}: the ledger's line records no evaluation settings: it cannot be replayed")
    rows = sorted(split.rows, key=lambda r: r["task_id"])[: evaluation.get("tasks") or None]
    wanted = {int(t) for t in task_ids}
    if outside := wanted - {int(r["task_id"]) for r in rows}:
        raise SplitGuardError(f"{where}: tasks {first_ids(outside)} were not among the tasks it evaluated: a replay "
                              "re-executes recorded rollouts only")
    samples = field_value(EvaluationSettings, "samples", evaluation["samples"])  # the line's section, as its model types it
    tasks = [{**r, "sample": k} for r in rows if int(r["task_id"]) in wanted
             for k in range(samples)]  # as predict.rollouts.select_tasks repeats them
    return Replay(campaign["campaign"], run, checkpoint, int(seed), tuple(tasks), dict(entry))


# -- the test statistics' inputs ---------------------------------------------------------------------------------------


def check_test_inputs(ledger: Path, paths: Sequence[str | Path], selection: Sequence[Mapping[str, Any]],
                      stats_config: Mapping[str, Any], settings: Sequence[str]) -> list[dict[str, Any]]:
    """The test statistics' inputs, held against the ledger (see the module docstring): `stats_config` must agree
    with the frozen design at every one of `settings` (the statistics stage's entry in the stage table). Returns every
    campaign on the same split, the one these files belong to marked ``this``; refuses naming the ledger and what
    differs."""
    from predict.fingerprint import file_sha256  # noqa: PLC0415

    if not ledger.exists():
        raise SplitGuardError(
            f"the test statistics read the campaign's ledger, and {ledger} is missing: restore it (a backup, or the "
            "checkout that ran the campaign), or name the ledger that recorded these evaluations with --test-ledger "
            "(read for analysis only: it is never created)")
    entries = [e for _, e in read_ledger(ledger)]
    done = {e.get("sha256"): e for e in entries if e.get("status") == "done" and e.get("sha256")}
    owners: dict[str, list[str]] = {}
    keys = []
    for path in map(Path, paths):
        entry = done.get(file_sha256(path))
        if entry is None:
            raise SplitGuardError(f"{path}: not a test evaluation that {ledger} records as done (a file no campaign "
                                  "wrote, or one changed since): the test statistics read the campaign's files only")
        owners.setdefault(entry["campaign"], []).append(str(path))
        keys.append(_key(entry))
    if len(owners) > 1:
        raise SplitGuardError(f"{ledger}: these test evaluations belong to {len(owners)} campaigns "
                              f"({', '.join(owners)}): the statistics read one campaign")
    if not owners:
        raise SplitGuardError(f"{ledger}: no test evaluation given")
    ident = next(iter(owners))
    campaign = next(e for e in entries if e.get("event") == "campaign" and e.get("campaign") == ident)
    where = f"{ledger}: test campaign {ident} (frozen at {campaign['time']})"
    planned = {tuple(p) for p in campaign["plan"]}
    if missing := sorted(planned - set(keys)):
        raise SplitGuardError(f"{where}: its evaluations {', '.join(f'{r} {c} seed {s}' for r, c, s in missing)} are "
                              "not among the inputs: the statistics read the campaign's whole plan")
    frozen = {(s["run"], s["seed"]): s["checkpoint"] for s in campaign.get("selection") or ()}
    given = {(s["run"], int(s["seed"])): s["checkpoint"] for s in selection}
    if frozen and (moved := sorted(k for k in set(frozen) | set(given) if frozen.get(k) != given.get(k))):
        raise SplitGuardError(f"{where}: the selection differs from the frozen one for "
                              + ", ".join(f"{r} seed {s} ({frozen.get((r, s))} -> {given.get((r, s))})" for r, s in moved))
    changed = [d for key in settings
               for d in config_differences(pick(campaign["design"], key)[1], pick(stats_config, key)[1], key + ".")]
    if changed:
        raise SplitGuardError(f"{where}: the statistics settings differ from the frozen design in {', '.join(changed)}")
    same_split = [e for e in entries if e.get("event") == "campaign" and e.get("split_sha256") == campaign["split_sha256"]]
    n_done = {c: sum(1 for e in entries if e.get("campaign") == c and e.get("status") == "done")
              for c in {e["campaign"] for e in same_split}}  # fmt: skip
    return [{"campaign": e["campaign"], "config_hash": e["config_hash"], "time": e["time"],
             "base_model": e["base_model"], "reason": e.get("reason") or "", "results_dir": e.get("results_dir") or "",
             "run_name": e.get("run_name") or "", "vllm_version": (e.get("depends_on") or {}).get("vllm_version", ""),
             "device": (e.get("depends_on") or {}).get("device_name", ""),
             "serving": json.dumps((e.get("depends_on") or {}).get("serving") or {}, sort_keys=True),
             "n_planned": len(e["plan"]), "n_done": n_done[e["campaign"]], "this": e["campaign"] == ident}
            for e in same_split]  # fmt: skip

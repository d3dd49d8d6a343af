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
  the registry live, the report's wording, the power grid, SLURM sizes, how jobs are served). The bootstrap is part
  of it: the test's statistics settings are frozen with it.
* ONE registry per checkout, outside every results_dir (`registry_ledger`: ``<checkout>/.test-campaigns/ledger.jsonl``;
  ``PREDICT_TEST_CAMPAIGNS`` names another file, for tests). Every config run from the checkout shares it, so a new
  results_dir or run_name is no new ledger.
* A campaign is keyed on the test split's content (`predict.data.content_hash` of its rows, the manifest's ``content_sha256`` of test)
  and the base model (`base_model_identity`: the embedded default's tiny model is never the paper's base model). Its
  line records the design hash and design, the plan, the val selection, what its results depend on (vLLM version,
  device, serving flags: `serving_dependencies`), where it was run from, and the reason when it was declared.
* Refused, each naming the ledger and what differs: a second campaign on the same key under another design unless it
  is declared (``--new-campaign "why"``; the report then lists every campaign on the split with its reason); an
  evaluation outside the plan; a second evaluation of an entry (``done``); a resume whose weights differ from those its
  ``started`` line hashed. An interrupted campaign resumes from its persisted rollouts: that is no second evaluation.
* Test statistics (`check_test_inputs`) read only evaluation files the ledger records ``done`` (by their sha256), all
  of one campaign, exactly its plan, under its selection and its statistics settings.
* Outside its campaign, no rollout or evaluation touches a test task (`guard_tasks`): task ids are compared with every
  test split the registry knows (`register_split`, called by `predict split`, and every campaign's own), not file
  names; a test job without its campaign's admission in the ledger (or without a ledger) is refused.
"""

from __future__ import annotations

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
from typing import Any

from predict.config import section
from predict.config.models import EvaluationSettings, SelectionSettings
from predict.stages import UNTRACKED, pick, without_keys

log = logging.getLogger(__name__)

STEP = re.compile(r"^step(\d+)$")

# Config keys (dotted) that shape no evaluation: names, where results go, the report's wording, the power grid, SLURM
# sizes, how jobs are served (stages.UNTRACKED: one shared server or one per job), a declared campaign's reason, and
# what the bundle a reviewer checks holds (predict.bundle: weights or not). Changing them is not a new design, so the
# campaign's hash leaves them out.
NOT_RESULT_SHAPING = ("run_name", "results_dir", "report", "power", "cluster", "bundle", *UNTRACKED)

REGISTRY_ENV = "PREDICT_TEST_CAMPAIGNS"
_CHECKOUT = Path(__file__).resolve().parents[2]


class SplitGuardError(RuntimeError):
    """A rollout, an evaluation or a statistic would touch the test split outside its one campaign."""


class StatsInputError(ValueError):
    """An evaluation file is missing, misnamed or disagrees with its path (or with the selection)."""


# -- checkpoint selection ---------------------------------------------------------------------------------------------


def selection_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """``evaluation.selection``, its defaults filled in (a config left without one selects fixed step 100)."""
    return section(config, SelectionSettings, "evaluation", "selection").model_dump()


def _evaluation(config: Mapping[str, Any]) -> EvaluationSettings:
    return section(config, EvaluationSettings, "evaluation")


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
    base = str(model.get("base"))
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
    reference = _evaluation(config).reference
    return int(config["seeds"][0]) if run in config["arms"] and checkpoint == reference else int(seed)


def campaign_checkpoints(config: Mapping[str, Any], run: str, seed: int, val_checkpoints: Sequence[str],
                         selected: str) -> list[str]:
    """A run/seed's test evaluations (see the module docstring): for an arm its reference under the first seed only,
    the checkpoint selection chose on val, and any of ``evaluation.test_checkpoints`` it was evaluated at on val.
    The selected checkpoint is dropped where it is the reference, evaluated under the first seed."""
    ev = _evaluation(config)
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
        from predict.data import content_hash, load_split  # noqa: PLC0415
        from predict.fingerprint import input_identity  # noqa: PLC0415

        rows = load_split(tasks_path)

        split_hash, base, digest = content_hash(rows), base_model_identity(config), config_hash(config)
        ident = campaign_id(split_hash, base, digest)
        weights = {(r, c, int(s)): input_identity(m) for r, c, s, m in evaluations}
        with ledger_lock(self.path):
            entries = read_ledger(self.path)
            same_key = [e for _, e in entries if e.get("event") == "campaign" and e.get("split_sha256") == split_hash
                        and e.get("base_model") == base]  # fmt: skip
            campaign = next((e for e in same_key if e.get("campaign") == ident), None)
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
                    "split_sha256": split_hash, "base_model": base, "task_ids": sorted(int(r["task_id"]) for r in rows),
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


def guard_tasks(*, split: str, tasks_path: Path, task_ids: Iterable[int], run: str, checkpoint: str, seed: int,
                admission: Mapping[str, Any] | None, ledger: Path | None) -> None:
    """Refuse a rollout that touches the test split outside its campaign (see the module docstring)."""
    if admission is None:
        registry = ledger or registry_ledger()
        overlap = sorted(set(map(int, task_ids)) & test_task_ids(registry))
        if overlap or split == "test" or tasks_path.name == "test.parquet":
            what = (f"{len(overlap)} of its tasks are test tasks ({', '.join(map(str, overlap[:6]))}"
                    f"{', ...' if len(overlap) > 6 else ''}; {registry})") if overlap else "it is the test split"
            raise SplitGuardError(f"{tasks_path}: {what}, which is evaluated once: it belongs to the test campaign "
                                  "(snakemake test), not a rollout stage")
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


# -- the test statistics' inputs ---------------------------------------------------------------------------------------


def check_test_inputs(ledger: Path, paths: Sequence[str | Path], selection: Sequence[Mapping[str, Any]],
                      stats_config: Mapping[str, Any], settings: Sequence[str]) -> list[dict[str, Any]]:
    """The test statistics' inputs, held against the ledger (see the module docstring): `stats_config` must agree
    with the frozen design at every one of `settings` (the statistics stage's entry in the stage table). Returns every
    campaign on the same split, the one these files belong to marked ``this``; refuses naming the ledger and what
    differs."""
    from predict.fingerprint import file_sha256  # noqa: PLC0415

    if not ledger.exists():
        raise SplitGuardError(f"the test statistics read the campaign's ledger, and {ledger} is missing")
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

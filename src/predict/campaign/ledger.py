"""The campaign ledger: ONE registry per checkout, the one reader of it, its lock and its appends.

Rules:

* ONE registry per checkout, outside every results_dir (`registry_ledger`: ``<checkout>/.test-campaigns/
  ledger.jsonl``; ``PREDICT_TEST_CAMPAIGNS`` names another file, for tests). Every config run from the checkout shares
  it, so a new results_dir or run_name is no new ledger.
* A test evaluation records in the checkout's registry and nowhere else (`evaluation_ledger`): another
  ``--test-ledger`` is refused, never created. Reading a ledger for analysis is `predict stats --test-ledger`'s.
* `read_ledger` is the one reader: a line that is not a JSON object stops the run naming the file and line. Every
  read-then-write and every append holds `ledger_lock` (a campaign's jobs may run at once, on several machines).
* ``split`` lines name a test split's task ids (`register_split`, called by `predict split`); ``campaign`` lines and
  their ``started``/``done`` lines are written by the admission (`predict.campaign.admission`).
* Read access for tools that check a campaign (the reviewer bundle): `split_history`, every registry line of one
  test split (its registrations, its campaigns, their started and done lines).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from predict.campaign.errors import SplitGuardError
from predict.campaign.plan import CampaignEntry

REGISTRY_ENV = "PREDICT_TEST_CAMPAIGNS"
_CHECKOUT = Path(__file__).resolve().parents[3]  # src/predict/campaign/ledger.py -> the checkout


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
                 if e.get("event") == "campaign" and e.get("split_sha256") == split_sha256}
    return [{**e, "line": n} for n, e in entries
            if (e.get("event") == "split" and e.get("content_sha256") == split_sha256)
            or (e.get("event") == "campaign" and e.get("split_sha256") == split_sha256)
            or ("status" in e and e.get("campaign") in campaigns)]


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


def append_entry(ledger: Path, entry: Mapping[str, Any]) -> None:
    """Append one line; the caller holds `ledger_lock`."""
    with open(ledger, "a") as f:
        f.write(json.dumps(dict(entry), sort_keys=True) + "\n")


def ledger_time() -> str:
    return time.strftime("%FT%T%z")


def entry_key(entry: Mapping[str, Any]) -> CampaignEntry:
    return (entry.get("run", entry.get("arm")), entry.get("checkpoint"), entry.get("seed"))


def register_split(ledger: Path, test_rows: Sequence[Mapping[str, Any]], content_sha256: str) -> None:
    """Tell the registry which task ids a test split holds (`predict split`), so that no rollout outside its
    campaign touches one of them, whatever its file is called. Once per split content."""
    with ledger_lock(ledger):
        if any(e.get("event") == "split" and e.get("content_sha256") == content_sha256 for _, e in read_ledger(ledger)):
            return
        append_entry(ledger, {"event": "split", "content_sha256": content_sha256,
                         "task_ids": sorted(int(r["task_id"]) for r in test_rows), "time": ledger_time()})


def test_task_ids(ledger: Path) -> set[int]:
    """Every test task id the registry knows: of the splits registered and of every campaign."""
    return {int(t) for _, e in read_ledger(ledger) if e.get("event") in ("split", "campaign")
            for t in e.get("task_ids") or ()}


test_task_ids.__test__ = False  # type: ignore[attr-defined]  # not a pytest test

"""Missing history is a refusal, never a fresh start.

Rules:

* A campaign starts fresh on a split and base model only where the ledger holds none and no results folder holds a
  trace of one (`history_traces`): test evaluations or their ``.partial`` folders the ledger does not know, test
  statistics, a report with a test section, an older per-results ledger, ledger lines of a campaign whose line is
  gone. `refuse_missing_history` refuses naming the ledger and what it found.
* History counts wherever it is (`history_folders`): the study's results folder (the config's ``results_dir``) and
  the folder the evaluation writes into (`predict.campaign.admission.results_origin` of its output), both. An output
  written outside the results folder never hides the frozen campaign's evaluations inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from predict.campaign.errors import SplitGuardError
from predict.campaign.view import campaign_config
from predict.config.models import Section


def history_folders(config: Mapping[str, Any] | Section, origin: Mapping[str, Any] | None) -> list[Path]:
    """Every folder a campaign's history may lie in: the config's ``results_dir`` (left out: none; relative: to the
    working directory, as the stages resolve it) and `origin`'s (where the evaluation writes), each once."""
    folders = [Path(f) for f in (campaign_config(config).results_dir, (origin or {}).get("results_dir")) if f]
    return list({f.resolve(): f for f in folders}.values())


def history_traces(results_dirs: Sequence[str | Path], entries: Sequence[Mapping[str, Any]],
                   split_sha256: str) -> list[str]:
    """What in `results_dirs` (`history_folders`) and in the ledger's `entries` shows that a test campaign ran that
    the ledger does not record (see the module docstring), each in a few words; empty when there is none."""
    campaigns = {e.get("campaign") for e in entries if e.get("event") == "campaign"}
    on_split = any(e.get("event") == "campaign" and e.get("split_sha256") == split_sha256 for e in entries)
    known_out = {str(Path(e["out"]).resolve()) for e in entries if e.get("out") and "status" in e}
    known_sha = {e["sha256"] for e in entries if e.get("status") == "done" and e.get("sha256")}
    found = []
    if orphans := [e for e in entries if "status" in e and e.get("campaign") not in campaigns]:
        found.append(f"{len(orphans)} started/done line(s) of campaign(s) the ledger has no campaign line for "
                     f"({', '.join(sorted({str(e.get('campaign')) for e in orphans})[:3])})")
    for results in map(Path, results_dirs):
        if results.is_dir():
            found += _folder_traces(results, known_out, known_sha, on_split)
    return found


def _folder_traces(results: Path, known_out: set[str], known_sha: set[str], on_split: bool) -> list[str]:
    """`history_traces` of one results folder."""
    from predict.fingerprint import file_sha256

    found = []
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
                           results_dirs: Sequence[str | Path]) -> None:
    """Refuse to start a test campaign afresh where `history_traces` finds one the ledger does not record."""
    if found := history_traces(results_dirs, entries, split_sha256):
        state = "is missing" if not ledger.exists() else "records no test campaign on this split and base model"
        raise SplitGuardError(
            f"{ledger} {state}, yet a campaign's traces exist: {'; '.join(found[:6])}"
            f"{f'; and {len(found) - 6} more' if len(found) > 6 else ''}. A missing ledger is a refusal, never a "
            f"fresh start: restore {ledger} (a backup, or the checkout that ran the campaign) and run again; if "
            "these files are no campaign's, move them out of the results folder yourself")

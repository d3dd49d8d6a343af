"""The replay: the one door through which test rollouts the ledger already records may be re-executed.

Rules:

* For the same weights and design, writing nowhere (`replay`): a reviewer's ``verify-bundle --rerun K`` compares
  them with the recorded rows. Everything else that rolls out test tasks goes through the campaign's admission.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predict.campaign.design import campaign_test_split, config_differences, design_config, frozen_under
from predict.campaign.errors import SplitGuardError, first_ids
from predict.campaign.ledger import read_ledger, registry_ledger
from predict.config.models import EvaluationSettings


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
    same design (`predict.campaign.design.config_hash`) and the same weights (`model`'s content,
    `predict.fingerprint.input_identity`), and every one of `task_ids` was among the tasks it evaluated. Refused
    otherwise (`SplitGuardError`, naming what differs). The caller rolls `Replay.tasks` out in memory (e.g.
    `predict.env.runner.run_rollouts_sync`) and writes the rows nowhere: not into results, not into the ledger, and
    never through `predict.rollouts` or `predict evaluate`, which persist and record."""
    from predict.fingerprint import input_identity

    ledger = Path(ledger) if ledger is not None else registry_ledger()
    if not ledger.exists():
        raise SplitGuardError(f"{ledger}: no such ledger; a replay re-executes test rollouts a ledger records as "
                              "done: name the campaign's ledger (it is read, never created)")
    split = campaign_test_split(config)
    entries = [e for _, e in read_ledger(ledger)]
    campaigns = {e["campaign"]: e for e in entries
                 if e.get("event") == "campaign" and e.get("split_sha256") == split.sha256}
    done = [e for e in entries if e.get("status") == "done" and e.get("campaign") in campaigns
            and (e.get("run"), e.get("checkpoint"), e.get("seed")) == (run, checkpoint, int(seed))]
    where = f"{ledger}: {run} {checkpoint} seed {seed}"
    if not done:
        raise SplitGuardError(f"{where} has no done test evaluation on {split.describe()}: only rollouts the ledger "
                              "records can be replayed")
    entry = done[-1]
    campaign = campaigns[entry["campaign"]]
    if not frozen_under(campaign, config):
        changed = config_differences(campaign.get("design"), design_config(config))
        raise SplitGuardError(f"{where}: the replay's config differs from the frozen design of campaign "
                              f"{campaign['campaign']} in {', '.join(changed[:8]) or 'the design'}: replay under it")
    if (weights := input_identity(model)) != entry.get("weights"):
        raise SplitGuardError(f"{where}: {model} is not the checkpoint the ledger recorded ({weights[:24]}..., "
                              f"recorded {str(entry.get('weights'))[:24]}...): a replay re-executes the same weights")
    # the line's section, as its model types it: every campaign line records it, filled (predict.evaluate)
    evaluation = EvaluationSettings.model_validate(entry.get("evaluation") or {})
    if "samples" not in evaluation.model_fields_set:
        raise SplitGuardError(f"{where}: the ledger's line records no evaluation settings: it cannot be replayed")
    rows = sorted(split.rows, key=lambda r: r["task_id"])[: evaluation.tasks or None]
    wanted = {int(t) for t in task_ids}
    if outside := wanted - {int(r["task_id"]) for r in rows}:
        raise SplitGuardError(f"{where}: tasks {first_ids(outside)} were not among the tasks it evaluated: a replay "
                              "re-executes recorded rollouts only")
    tasks = [{**r, "sample": k} for r in rows if int(r["task_id"]) in wanted
             for k in range(evaluation.samples)]  # as predict.rollouts.select_tasks repeats them
    return Replay(campaign["campaign"], run, checkpoint, int(seed), tuple(tasks), dict(entry))

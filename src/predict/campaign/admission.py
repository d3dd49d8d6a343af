"""Admission: the campaign line, and which test evaluations the ledger lets run.

Rules:

* `TestLedger.admit` admits a job's evaluations before any server starts, recording the campaign on its first
  evaluation. Its line records the design hash and design (`predict.campaign.design`), the plan, the val selection,
  what its results depend on (vLLM version, device, serving flags: `serving_dependencies`), where it was run from
  (`results_origin`), and the reason when it was declared.
* A fresh start only where no history is missing, in the study's results folder or the output's
  (`predict.campaign.history`).
* Refused, each naming the ledger and what differs: a second campaign on the same key under another design unless it
  is declared (``--new-campaign "why"``; the report then lists every campaign on the split with its reason); an
  evaluation outside the plan; a second evaluation of an entry (``done``); a resume whose weights differ from those its
  ``started`` line hashed; an evaluation on a server that differs from the campaign's in what greedy rows depend on
  (`SERVER_KEYS` of its ``depends_on``: vLLM's version, the device, batch invariance, the attention kernels, the
  server's extra environment and flags). An interrupted campaign resumes from its persisted rollouts: that is no
  second evaluation.
* `TestLedger.record` appends an admitted evaluation's ``started`` and ``done`` lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predict.campaign.design import (
    base_model_identity,
    campaign_id,
    campaign_test_split,
    check_campaign_tasks,
    config_differences,
    config_hash,
    design_config,
    frozen_under,
)
from predict.campaign.errors import SplitGuardError
from predict.campaign.history import history_folders, refuse_missing_history
from predict.campaign.ledger import append_entry, entry_key, ledger_lock, ledger_time, read_ledger
from predict.campaign.plan import CampaignEntry

log = logging.getLogger(__name__)

#: What a campaign's later evaluations must be served like (`predict.serving.identity.serving_identity`'s keys that
#: greedy rows depend on; not the driver, nor the concurrency of a batch-invariant or one-at-a-time server). A key the
#: campaign line lacks (written before it was recorded) is not compared, so ledgers already written stay valid.
SERVER_KEYS = ("vllm_version", "device", "device_name", "batch_invariant", "attention_backend", "environment",
               "server_args")


def results_origin(out: Path) -> dict[str, Any]:
    """Where a campaign ran from, read off one of its outputs (``<results_dir>/eval/{run}/{checkpoint}/test/
    seed{seed}.parquet``): the results folder and the run_name that claimed it (`predict.fingerprint`). Not from the
    config, so a rename reruns no test evaluation."""
    from predict.fingerprint import RUN_NAME_FILE

    parents = Path(out).resolve().parents
    results = parents[4] if len(parents) > 4 and parents[3].name == "eval" else parents[0]  # else: a file by hand
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return {"results_dir": str(results), "run_name": json.loads((results / RUN_NAME_FILE).read_text())["run_name"]}
    return {"results_dir": str(results), "run_name": None}


def serving_dependencies(serving: Any, concurrency: int) -> dict[str, Any]:
    """What a greedy evaluation's rows depend on beyond the checkpoint and the design:
    `predict.serving.identity.serving_identity` (vLLM version, device and its name, batch invariance, requests in
    flight) and the serving settings (the typed ``serving`` section, recorded as its plain data)."""
    from predict.config.models import plain_data
    from predict.serving.identity import serving_identity

    return {**serving_identity(serving, concurrency=concurrency),
            "serving": {k: v for k, v in plain_data(serving).items() if k not in ("python", "shared")}}


@dataclass(frozen=True)
class Admission:
    """What one admitted test evaluation carries into its rollout job and its ledger lines."""

    campaign: str  # the campaign id
    ledger: Path
    weights: str  # `predict.fingerprint.input_identity` of the model

    def fields(self) -> dict[str, Any]:
        return {"campaign": self.campaign, "weights": self.weights}


class TestLedger:
    """The campaign ledger (`predict.campaign.ledger`) as the campaign's jobs write it: ``campaign`` lines, each
    followed over time by a ``started`` and a ``done`` line per evaluation, and ``split`` lines naming the test task
    ids."""

    __test__ = False  # not a pytest class

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def entries(self) -> list[dict[str, Any]]:
        return [e for _, e in read_ledger(self.path)]

    def campaigns(self, split_hash: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e.get("event") == "campaign"
                and (split_hash is None or e.get("split_sha256") == split_hash)]

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
        from predict.fingerprint import input_identity

        split = campaign_test_split(config)
        check_campaign_tasks(tasks_path, split)
        split_hash, base, digest = split.sha256, base_model_identity(config), config_hash(config)
        ident = campaign_id(split_hash, base, digest)
        weights = {(r, c, int(s)): input_identity(m) for r, c, s, m in evaluations}
        history = history_folders(config, origin)  # the study's results_dir and the output's folder, both
        if not self.path.exists():  # ledger_lock would create its folder: refuse first where history is missing
            refuse_missing_history(self.path, [], split_hash, history)
        with ledger_lock(self.path):
            entries = read_ledger(self.path)
            same_key = [e for _, e in entries if e.get("event") == "campaign" and e.get("split_sha256") == split_hash
                        and e.get("base_model") == base]
            campaign = next((e for e in same_key if e.get("campaign") == ident), None)
            if campaign is None:  # the same design as earlier code filed it (a key has left the design since)
                campaign = next((e for e in same_key if frozen_under(e, config)), None)
                ident = campaign["campaign"] if campaign is not None else ident
            if not same_key:  # a fresh start on this split and base model: only where no history is missing
                refuse_missing_history(self.path, [e for _, e in entries], split_hash, history)
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
                    "time": ledger_time(),
                }
                append_entry(self.path, campaign)
                log.info("%s: test campaign %s frozen: config hash %s, %d evaluations%s", self.path, ident,
                         digest[:12], len(plan), f" (declared: {new_campaign})" if same_key else "")
            self._refuse_other_server(campaign, depends_on or {})
            for entry in weights:
                self._refuse_unadmitted(campaign, entry, weights[entry], entries)
        return [Admission(campaign["campaign"], self.path, weights[(r, c, int(s))]) for r, c, s, _ in evaluations]

    def _refuse_other_server(self, campaign: Mapping[str, Any], depends_on: Mapping[str, Any]) -> None:
        """`admit`'s refusal of an evaluation whose server differs from the campaign's in `SERVER_KEYS`: on a GPU its
        rows could differ from the campaign's with the same weights (docs/repeatability.md)."""
        recorded = campaign.get("depends_on") or {}
        differ = [k for k in SERVER_KEYS if k in recorded and k in depends_on and recorded[k] != depends_on[k]]
        if differ:
            raise SplitGuardError(
                f"{self.path}: the test campaign {campaign['campaign']} was frozen at {campaign['time']} on another "
                f"server: {'; '.join(f'{k} {recorded[k]!r} then, {depends_on[k]!r} now' for k in differ)}. The same "
                "weights could give other rows there (docs/repeatability.md): evaluate the campaign's checkpoints on "
                "a server like the one it started on"
            )

    def _refuse_unadmitted(self, campaign: Mapping[str, Any], entry: CampaignEntry, weights: str,
                           entries: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        """`admit`'s refusals of one evaluation (run, checkpoint, seed) of `campaign`: outside its plan, done
        already, or started with other weights."""
        run, checkpoint, seed = entry
        planned = [tuple(e) for e in campaign["plan"]]
        if entry not in planned:
            raise SplitGuardError(
                f"{self.path}: {run} {checkpoint} seed {seed} is not in the test campaign's list, fixed at "
                f"{campaign['time']}: {', '.join(f'{r} {c} seed {s}' for r, c, s in planned)}"
            )
        for line_number, e in entries:
            if e.get("campaign") != campaign["campaign"] or entry_key(e) != entry or "status" not in e:
                continue
            if e["status"] == "done":
                raise SplitGuardError(
                    f"{self.path}:{line_number}: {run} {checkpoint} seed {seed} was already evaluated on test "
                    f"at {e['time']}; the test split is touched once per frozen design"
                )
            if e.get("weights") not in (None, weights):
                raise SplitGuardError(
                    f"{self.path}:{line_number}: {run} {checkpoint} seed {seed} was started on test at "
                    f"{e['time']} with other weights ({e['weights'][:24]}..., now {weights[:24]}...): "
                    "a campaign resumes only the weights it started with"
                )

    def record(self, entry: Mapping[str, Any], status: str) -> None:
        """Append a ``started`` or ``done`` line of an admitted evaluation."""
        with ledger_lock(self.path):
            append_entry(self.path, {**entry, "status": status, "time": ledger_time()})


def _selection_key(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"run": row["run"], "seed": int(row["seed"]), "checkpoint": row["checkpoint"]}

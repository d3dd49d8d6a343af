"""The test statistics' inputs, held against the ledger.

Rules:

* Test statistics (`check_test_inputs`) read only evaluation files the ledger records ``done`` (by their sha256), all
  of one campaign, exactly its plan, under its selection and its statistics settings (the statistics stage's entry
  in the stage table). A missing ledger is a refusal; ``predict stats --test-ledger`` names another to read, never
  to create.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from predict.campaign.design import config_differences
from predict.campaign.errors import SplitGuardError
from predict.campaign.ledger import entry_key, read_ledger
from predict.stages import pick


def check_test_inputs(ledger: Path, paths: Sequence[str | Path], selection: Sequence[Mapping[str, Any]],
                      stats_config: Mapping[str, Any], settings: Sequence[str]) -> list[dict[str, Any]]:
    """The test statistics' inputs, held against the ledger (see the module docstring): `stats_config` must agree
    with the frozen design at every one of `settings` (the statistics stage's entry in the stage table). Returns every
    campaign on the same split, the one these files belong to marked ``this``; refuses naming the ledger and what
    differs."""
    from predict.fingerprint import file_sha256

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
        keys.append(entry_key(entry))
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
        raise SplitGuardError(f"{where}: the selection differs from the frozen one for " + ", ".join(
            f"{r} seed {s} ({frozen.get((r, s))} -> {given.get((r, s))})" for r, s in moved))
    changed = [d for key in settings
               for d in config_differences(pick(campaign["design"], key)[1], pick(stats_config, key)[1], key + ".")]
    if changed:
        raise SplitGuardError(f"{where}: the statistics settings differ from the frozen design in {', '.join(changed)}")
    same_split = [e for e in entries
                  if e.get("event") == "campaign" and e.get("split_sha256") == campaign["split_sha256"]]
    n_done = {c: sum(1 for e in entries if e.get("campaign") == c and e.get("status") == "done")
              for c in {e["campaign"] for e in same_split}}
    return [{"campaign": e["campaign"], "config_hash": e["config_hash"], "time": e["time"],
             "base_model": e["base_model"], "reason": e.get("reason") or "", "results_dir": e.get("results_dir") or "",
             "run_name": e.get("run_name") or "", "vllm_version": (e.get("depends_on") or {}).get("vllm_version", ""),
             "device": (e.get("depends_on") or {}).get("device_name", ""),
             "serving": json.dumps((e.get("depends_on") or {}).get("serving") or {}, sort_keys=True),
             "n_planned": len(e["plan"]), "n_done": n_done[e["campaign"]], "this": e["campaign"] == ident}
            for e in same_split]

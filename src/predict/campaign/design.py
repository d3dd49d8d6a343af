"""The design a campaign freezes and the key it is filed under.

Rules:

* The design (`design_config`, `config_hash`): the config without `NOT_RESULT_SHAPING` (names, where results and
  the registry live, the power grid, SLURM sizes, how jobs are served). The bootstrap is part of it: the test's
  statistics settings are frozen with it. The hash is sha256 of the design as canonical JSON: the bytes every ledger
  line recorded, so a refactor that changes them invalidates every frozen campaign (tests/test_campaign.py pins them).
* A key that leaves the design (prime-rl's time limits, issue 60) changes the hash; `design_hashes` also gives the
  hashes earlier code wrote for the same config, and a campaign filed under any of them is this config's campaign: a
  ledger written before stays valid, and a fresh ledger records today's hash.
* A campaign is keyed on the test split (`campaign_test_split`: `predict.data.derive_test_split` of the design's
  ``data`` section, its content hash, the manifest's ``content_sha256`` of test), never on the file it is handed, and
  the base model (`base_model_identity`: the embedded default's tiny model is never the paper's base model);
  `campaign_id` hashes split, base model and design.
* The tasks file must hold exactly that split, in any order and under any name (`check_campaign_tasks`): a subset, a
  superset or an edited copy is refused, never a campaign of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predict.campaign.errors import SplitGuardError, first_ids
from predict.campaign.view import campaign_config
from predict.config.models import Section, plain_data
from predict.stages import SCHEDULING, UNTRACKED, without_keys

if TYPE_CHECKING:
    from predict.data import TestSplit

# Config keys (dotted) that shape no evaluation: names, where results go, the power grid, SLURM sizes, how jobs are
# served (stages.UNTRACKED: one shared server or one per job), where training curves go, a declared campaign's
# reason, and what the bundle a reviewer checks holds (predict.bundle: weights or not). Changing them is not a new
# design, so the campaign's hash leaves them out.
NOT_RESULT_SHAPING = ("run_name", "results_dir", "power", "cluster", "bundle", *UNTRACKED)
# The designs ledgers were written under before a key left the design, newest first: each is NOT_RESULT_SHAPING
# less the keys that left since. The scheduling keys (stages.SCHEDULING: prime-rl's time limits) left in issue 60.
EARLIER_DESIGNS = (tuple(k for k in NOT_RESULT_SHAPING if k not in SCHEDULING),)


def design_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config without `NOT_RESULT_SHAPING`: what a frozen design is."""
    return without_keys(config, NOT_RESULT_SHAPING)


def _digest(design: Any) -> str:
    return hashlib.sha256(json.dumps(design, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the design (`design_config`) as canonical JSON: what the ledger records."""
    return _digest(design_config(config))


def design_hashes(config: Mapping[str, Any]) -> list[str]:
    """The config's design hash, then the hashes earlier code filed the same design under (`EARLIER_DESIGNS`): a
    campaign a ledger froze then is this config's campaign still, so ledgers already written stay valid."""
    hashes = [config_hash(config)]
    for left_out in EARLIER_DESIGNS:
        if (digest := _digest(without_keys(config, left_out))) not in hashes:
            hashes.append(digest)
    return hashes


def frozen_under(campaign: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether a ledger's campaign line froze this config's design: its hash is the config's, or it was written
    before a key left the design (`EARLIER_DESIGNS`) and its recorded design, which its hash vouches for, is today's
    once those keys are dropped (whatever values they had then: a time limit edited since changes no design)."""
    if campaign.get("config_hash") == config_hash(config):
        return True
    design = campaign.get("design")
    if not isinstance(design, Mapping) or _digest(design) != campaign.get("config_hash"):
        return False
    return without_keys(design, NOT_RESULT_SHAPING) == design_config(config)


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs (for a message that says what changed)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in config_differences(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".") or "(whole config)"]


def base_model_identity(config: Mapping[str, Any] | Section) -> str:
    """The base model a campaign is keyed on: ``model.base``, and for the embedded default's random tiny Qwen3 its
    builder's settings as the config wrote them (so it can never be mistaken for the paper's base model, nor one tiny
    model for another)."""
    model = campaign_config(config).required("model")
    if model.base != "tiny":
        return model.base
    return f"{model.base}:{json.dumps(plain_data(model.tiny) if model.tiny is not None else {}, sort_keys=True)}"


def campaign_id(split_hash: str, base_model: str, design_hash: str) -> str:
    return hashlib.sha256(f"{split_hash}\0{base_model}\0{design_hash}".encode()).hexdigest()[:16]


def campaign_test_split(config: Mapping[str, Any] | Section) -> TestSplit:
    """The test split of the config's typed ``data`` section (`predict.data.derive_test_split`): the split a campaign
    is keyed on, never a file's."""
    from predict.data import derive_test_split

    return derive_test_split(campaign_config(config).required("data"))


def check_campaign_tasks(tasks_path: Path, split: Any) -> None:
    """Refuse a test campaign's tasks file unless it holds exactly `split` (a `predict.data.TestSplit`): every task
    of it, nothing else, each row as the split has it; the order and the file's name do not matter."""
    from predict.data import FIELDS, load_split

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

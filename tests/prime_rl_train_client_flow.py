"""One rollout of the rendered RL seat as prime-rl's env server runs it, on the CPU: verifiers at prime-rl's pin,
our taskset + harness from prime-rl's TOML, and prime-rl's client for a renderer run, verifiers' TrainClient (token
in/out through a real vLLM server's /inference/v1/generate, `prime_rl.utils.client.setup_clients`). The first RL run
on the H200 failed every rollout here (HTTP 502 "TrainClient does not support streaming"): the pipeline's own
verifiers fakes a stream for the train client, the pinned one refuses it. Prints one JSON object.

    python tests/prime_rl_train_client_flow.py <patched prime-rl> <verifiers at prime-rl's pin> <base_url> <model>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any


def main(prl: str, vf_src: str, base_url: str, model: str) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(repo / "src"), str(repo), vf_src, f"{prl}/src", f"{prl}/packages/prime-rl-configs/src"]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), vf_src, os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("PREDICT_LLM_API_KEY", "EMPTY")
    from tests.prime_rl_real_flow import STUBBED

    for name in STUBBED:
        from unittest import mock

        sys.modules.setdefault(name, mock.MagicMock(name=name))
    return asyncio.run(flow(base_url, model))


async def flow(base_url: str, model: str) -> dict[str, Any]:
    from prime_rl.configs.orchestrator import ClientConfig
    from prime_rl.utils.client import setup_clients
    from renderers.configs import Qwen3RendererConfig

    from predict.config import REPO_ROOT, load_config
    from predict.env.runner import default_tokenizer_dir
    from predict.train.prime_rl.configs import rl_config
    from predict_mbpp.environment import MbppEnvConfig
    from tests.prime_rl_fixtures import run_one_task

    paper = load_config(REPO_ROOT / "config" / "config.yaml")
    table = rl_config(paper, "B", 42, model="/m", tasks="unused.parquet", output_dir="unused")
    source = table["orchestrator"]["train"]["source"][0]
    env_config = MbppEnvConfig.model_validate({**source["env"], "taskset": {"id": "predict_mbpp", "path": "unused"}})
    (client,) = setup_clients(
        ClientConfig(base_url=[base_url], api_key_var="PREDICT_LLM_API_KEY"),
        client_type="renderer",
        renderer_config=Qwen3RendererConfig(enable_thinking=paper["model"]["enable_thinking"]),
        renderer_model_name=str(default_tokenizer_dir()),
    )
    seat = env_config.agent.model_copy(
        update={
            "harness": env_config.agent.harness.model_copy(update={"python": sys.executable}),
            "model": model,
            "client": client,
            "sampling": env_config.agent.sampling.model_copy(update={"max_tokens": 24}),
        }
    )
    row = {"task_id": 2, "text": "Write a function add(a, b).", "test_list": ["assert add(1, 2) == 3"]}
    trace = await run_one_task(seat, row)
    nodes = list(getattr(trace, "nodes", None) or [])
    return {
        "client": type(client).__name__,
        "stream": seat.harness.stream,
        "ok": bool(trace.ok),
        "errors": [f"{e.type}: {e.message}"[:300] for e in trace.errors],
        "program_exit_code": (trace.info or {}).get("program_exit_code"),
        "sampled_nodes": sum(1 for n in nodes if getattr(n, "sampled", False)),
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))

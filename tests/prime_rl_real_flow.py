"""PredictAlgorithm through prime-rl's own orchestrator code at the pin, on the CPU.

Run by tests/test_prime_rl_integration.py in an interpreter that has prime-rl's runtime dependencies (prime-rl's
own venv, or any with torch, msgspec, loguru, ...): build_algorithm from the patched registry and AlgoConfig union,
trace_to_samples on a real verifiers Trace (prime-rl's Rollout), finalize_rollout / finalize_group (advantage and
loss-routing stamping), the real zero-advantage filter, and the trainer's prepare_sample on every sample that
ships. Prints one JSON object.

    python tests/prime_rl_real_flow.py <patched prime-rl source> <verifiers source at prime-rl's pin>
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

STUBBED = ("wandb",)  # imported by prime-rl's utils, never called on this path


def main(prl: str, vf_src: str) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [vf_src, f"{prl}/src", f"{prl}/packages/prime-rl-configs/src", str(repo / "src"), str(repo)]
    for name in STUBBED:
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = mock.MagicMock(name=name)
    import verifiers.v1 as vf
    from prime_rl.configs.algorithm import AlgoConfig
    from prime_rl.orchestrator.algo import ALGORITHM_CLASSES, build_algorithm
    from prime_rl.orchestrator.filters import ZeroAdvantageFilter, apply_filters
    from prime_rl.orchestrator.trajectories import trace_to_samples
    from prime_rl.orchestrator.types import Rollout
    from prime_rl.trainer.batch import prepare_sample
    from pydantic import TypeAdapter
    from tokenizers import Tokenizer

    from predict.env.rollout import default_tokenizer_dir
    from predict.train.prime_rl.algorithm import PredictAlgorithm
    from tests.prime_rl_fixtures import episode_result, trace_nodes

    tok = Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def rollout(reward: float) -> Any:
        result = episode_result()
        nodes = [
            vf.MessageNode(
                parent=n["parent"],
                message={"role": n["role"], "content": "x"},
                sampled=n["sampled"],
                token_ids=n["token_ids"],
                mask=n["mask"],
                logprobs=n["logprobs"],
            )
            for n in trace_nodes(result, enc, scaffold=enc("<|im_start|>assistant\n"))
        ]
        r = Rollout(
            task={"type": "mbpp", "data": {"id": "mbpp/7", "prompt": "p"}},
            agent={"config": {}},
            nodes=nodes,
            info={"agent_result": result},
            env_name="predict_mbpp",
            rewards={"tests_pass": {"score": reward}},
        )
        r.samples = trace_to_samples(r, env_name=r.env_name)
        return r

    out: dict[str, Any] = {"registered": ALGORITHM_CLASSES["predict"] is PredictAlgorithm}

    async def flow(alpha: float, rewards: list[float]) -> list[dict[str, Any]]:
        config = TypeAdapter(AlgoConfig).validate_python({"type": "predict", "alpha": alpha, "tokenizer": "t"})
        algo = build_algorithm(config, policy_pool=None)
        algo.tokenizer = tok  # setup() would load it with transformers from config.tokenizer
        group = [rollout(x) for x in rewards]
        for r in group:
            await algo.finalize_rollout(r)
        await algo.finalize_group(group)
        apply_filters([ZeroAdvantageFilter(name="zero_advantage", enforce=True)], group)
        rows = []
        for r in group:
            for s in r.samples:
                s.temperatures = [1.0] * len(s.token_ids)  # what the train sink does next
                prepare_sample(s, seq_len=1 << 20)  # the trainer accepts every sample
            rl = [s for s in r.samples if any(s.mask)]
            rows.append(
                {
                    "filtered": r.is_filtered,
                    "n_rl": len(rl),
                    "n_ce": len(r.samples) - len(rl),
                    "rl_zeroed": sum(m and w == 0 for s in rl for m, w in zip(s.mask, s.rl_weights, strict=True)),
                    "advantages": sorted(set(r.advantages)) if r.advantages is not None else None,
                }
            )
        return rows

    out["mixed"] = asyncio.run(flow(0.5, [1.0, 0.0]))
    out["equal"] = asyncio.run(flow(0.5, [1.0, 1.0]))
    out["alpha0_equal"] = asyncio.run(flow(0.0, [1.0, 1.0]))
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))

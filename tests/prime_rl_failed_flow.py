"""A failed model call on the prime-rl path, through prime-rl's own code at the pin, on the CPU.

Run by tests/test_prime_rl_integration.py in an interpreter with prime-rl's runtime dependencies and verifiers at
prime-rl's pin (what prime-rl's env server runs): real rollouts of our taskset + harness (`predict_mbpp`'s env config,
as prime-rl's TOML renders it) against a scripted endpoint, one of whose tasks gets a 404 on its first call; that
trace joins a GRPO group with two scored rollouts in prime-rl's own TrainSink (the registered ``grpo_std``
algorithm, group finalization, batch building) and prime-rl's own per-step metrics, which our converter and the
failure check then read. Prints one JSON object.

    python tests/prime_rl_failed_flow.py <patched prime-rl source> <verifiers source at prime-rl's pin> <tmp dir>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def main(prl: str, vf_src: str, tmp: str) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(repo / "src"), str(repo), vf_src, f"{prl}/src", f"{prl}/packages/prime-rl-configs/src"]
    # the agent program and the grader run as `python -m predict...` in the subprocess runtime
    os.environ["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), vf_src, os.environ.get("PYTHONPATH", "")])
    from tests.prime_rl_real_flow import STUBBED

    for name in STUBBED:
        from unittest import mock

        sys.modules.setdefault(name, mock.MagicMock(name=name))
    return asyncio.run(flow(Path(tmp)))


async def flow(tmp: Path) -> dict[str, Any]:
    import verifiers.v1 as vf
    from prime_rl.configs.algorithm import AlgoConfig
    from prime_rl.orchestrator.algo import build_algorithm
    from prime_rl.orchestrator.train_sink import TrainSink
    from prime_rl.orchestrator.trajectories import trace_to_samples
    from prime_rl.orchestrator.types import Rollout
    from pydantic import TypeAdapter
    from tokenizers import Tokenizer

    from predict.config import REPO_ROOT, load_config
    from predict.env.runner import default_tokenizer_dir
    from predict.train.prime_rl.collect import FailedRolloutsError, check_failed_rollouts, metrics_table, schema_rows
    from predict.train.prime_rl.configs import rl_config
    from predict_mbpp.environment import MbppEnvConfig
    from tests.prime_rl_fixtures import episode_result, run_one_task, trace_nodes
    from tests.scripted_endpoint import HttpError, ScriptedEndpoint

    paper = load_config(REPO_ROOT / "config" / "config.yaml")
    table = rl_config(paper, "A", 42, model="/m", tasks=str(tmp / "rl.parquet"), output_dir=str(tmp / "o"))
    source = table["orchestrator"]["train"]["source"][0]
    # the env table of prime-rl's TOML, parsed by the env config predict_mbpp declares (verifiers at prime-rl's pin)
    env_config = MbppEnvConfig.model_validate({**source["env"], "taskset": {"id": "predict_mbpp", "path": "unused"}})
    agent_config = env_config.agent
    out: dict[str, Any] = {
        "seat": {
            "sampling": agent_config.sampling.model_dump(exclude_none=True),
            "runtime": agent_config.runtime.type,
            "harness": agent_config.harness.id,
            "max_turns": agent_config.max_turns,
        },
        "orchestrator_sampling": table["orchestrator"]["train"]["sampling"],
    }

    rows = [
        {"task_id": 901, "text": "[case:gone] Write multiply_int.", "test_list": ["assert multiply_int(2, 3) == 6"]}
    ]
    with ScriptedEndpoint({"[case:gone]": [HttpError(404, "The model `policy` does not exist.")]}) as endpoint:
        seat = agent_config.model_copy(
            update={
                "harness": agent_config.harness.model_copy(update={"python": sys.executable}),
                "model": "policy",
                "client": vf.EvalClientConfig(base_url=endpoint.base_url, api_key_var="PREDICT_LLM_API_KEY"),
            }
        )
        failed_trace = await run_one_task(seat, rows[0])
    failed = Rollout.model_construct(**dict(failed_trace))  # as prime-rl's env client builds a rollout
    out["failed_trace"] = {
        "ok": failed.ok,
        "has_error": failed.has_error,
        "errors": [(e.type, e.status_code) for e in failed.errors],
        "rewards": {k: (v.score if v is not None else None) for k, v in (failed.rewards or {}).items()},
        "program_exit_code": failed.info.get("program_exit_code"),
    }

    # two scored rollouts of the same group (the tokens of a real episode, as the train client records them)
    tok = Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))

    def scored(reward: float) -> Any:
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
            for n in trace_nodes(result, lambda t: tok.encode(t, add_special_tokens=False).ids)
        ]
        return Rollout(
            task={"type": "MbppTask", "data": {"id": "mbpp/901", "prompt": "p", "idx": 0}},
            agent={"config": {}},
            nodes=nodes,
            info={"agent_result": result},
            rewards={"tests_pass": {"score": reward}},
            ok=True,
        )

    group = [scored(1.0), scored(0.0), failed]
    for r in group:
        r.env_name, r.group_id = "predict_mbpp", group[0].group_id
    algo = build_algorithm(TypeAdapter(AlgoConfig).validate_python({"type": "grpo_std"}), policy_pool=None)
    seen: list[list[float]] = []
    score_group = algo.score_group

    async def recording(rollouts: list[Any]) -> None:
        seen.append([r.reward for r in rollouts])
        await score_group(rollouts)

    algo.score_group = recording
    env = SimpleNamespace(
        config=SimpleNamespace(group_size=len(group)),
        requires_group_scoring=False,
        algorithm=algo,
        sampling_args={"temperature": 1.0},
    )
    sink = TrainSink(
        None,
        tokenizer=None,
        train_envs=SimpleNamespace(get=lambda name: env),
        mm_token_type_ids_mapping=None,
        batch_size=2,
        token_batch_size=None,
        pre_filters=[],
        post_filters=[],
    )
    batch = None
    for r in group:
        batch = await sink.add([r]) or batch
    assert batch is not None, "the group did not finalize"
    _ = trace_to_samples  # the sink builds the samples with it (process_rollout)
    out["group_rewards_scored"] = seen
    out["shipped_from_failed"] = len(failed.samples)
    out["advantages"] = [sorted(set(r.advantages or [])) for r in group[:2]]
    out["identity"] = [(r.info.get("sample"), r.info.get("rollout_key")) for r in group]

    # the step's metrics as prime-rl's orchestrator logs them (finalize_train_batch), then our reader and check
    metrics = batch.rollouts.metrics.to_wandb(prefix="train/agg", subset="all")
    metrics |= {"progress/rollouts": len(batch.rollouts), "step": 1}
    (tmp / "o" / "run_default").mkdir(parents=True, exist_ok=True)
    (tmp / "o" / "run_default" / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    (row,) = schema_rows(metrics_table(tmp / "o"), "A", 42)
    out["schema_row"] = {k: row.get(k) for k in ("n_rollouts", "n_failed", "reward_mean")}
    out["error_metrics"] = {k: v for k, v in metrics.items() if "/error/" in k}
    verdicts = {}
    for share in (0.25, 0.5):
        try:
            check_failed_rollouts(tmp / "o", share)
            verdicts[str(share)] = "ok"
        except FailedRolloutsError as e:
            verdicts[str(share)] = str(e)
    out["check"] = verdicts
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3])))

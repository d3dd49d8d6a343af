"""One step's rollouts written as prime-rl's orchestrator saves them (``rollout.record_run(...)`` then
``save_rollouts([rollout.to_record()], .../train/all/traces.jsonl)``), for benchmarks/prime_rl_parity.py on the CPU:
one group of the fixture episode (tests/prime_rl_fixtures.py) with rewards 1 and 0, and one failed rollout.

    python tests/prime_rl_saved_traces.py <patched prime-rl> <verifiers at prime-rl's pin> <out traces.jsonl>
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path


def main(prl: str, vf_src: str, out: str) -> None:
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(repo / "src"), str(repo), vf_src, f"{prl}/src", f"{prl}/packages/prime-rl-configs/src"]
    from tests.prime_rl_real_flow import STUBBED

    for name in STUBBED:
        from unittest import mock

        sys.modules.setdefault(name, mock.MagicMock(name=name))
    import verifiers.v1 as vf
    from prime_rl.orchestrator.types import Rollout
    from prime_rl.orchestrator.utils import save_rollouts
    from tokenizers import Tokenizer

    from predict.env.runner import default_tokenizer_dir
    from tests.prime_rl_fixtures import episode_result, trace_nodes

    tok = Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    group = uuid.uuid4()
    rollouts = []
    for reward in (1.0, 0.0):
        result = episode_result()
        nodes = [
            vf.MessageNode(parent=n["parent"], message={"role": n["role"], "content": "x"}, sampled=n["sampled"],
                           token_ids=n["token_ids"], mask=n["mask"], logprobs=n["logprobs"])
            for n in trace_nodes(result, enc, scaffold=enc("<|im_start|>assistant\n"))
        ]
        rollouts.append(Rollout(task={"type": "mbpp", "data": {"id": "mbpp/7", "prompt": "p"}}, agent={"config": {}},
                                nodes=nodes, info={"agent_result": result}, rewards={"tests_pass": {"score": reward}},
                                ok=True, env_name="predict_mbpp", group_id=group))
    failed = Rollout(task={"type": "mbpp", "data": {"id": "mbpp/7", "prompt": "p"}}, agent={"config": {}},
                     env_name="predict_mbpp", group_id=group)
    failed.record_error(RuntimeError("HTTP 502"))
    rollouts.append(failed)
    for r in rollouts:
        r.record_run(vf.TrainRunInfo(id="run", step=1), env_name=r.env_name, group_id=str(r.group_id),
                     episode_id=r.episode_id, policy_version=0)
    save_rollouts([r.to_record() for r in rollouts], Path(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])

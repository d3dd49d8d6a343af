"""A predictive episode as the trace graph prime-rl sees: program steps + message nodes with token ids.

Shared by the prime-rl tests. The steps come from the real `Episode` state machine; the nodes are built the way
verifiers' train client records them: a root system+prompt node, then per model call an assistant node
(generation-prompt scaffold with mask False, then the sampled completion with mask True) and the environment's
answer as a user node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from predict.env.protocol import Episode, ProtocolConfig
from predict.vocabulary import Outcome

REPLIES = [
    'CALL apply_patch {"find": "# Write your function here.", "replace": "def f(x, y):\\n    return x + y"}',
    "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",  # wrong: the patch fails (shadow execution)
    'CALL apply_patch {"find": "return x + y", "replace": "return x * y"}',
    "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>REVISE</DECISION>",  # wrong: it passes; reverted
    'CALL apply_patch {"find": "return x + y", "replace": "return x * y"}',
    "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",
    'CALL python_test {"project_path": "solution.py"}',  # shows PASS: the third patch's outcome is seen
    "FINAL: done",
]
VERIFIED = {1: "ASSERTION_FAILURE", 3: "PASS", 5: "PASS"}
"""prediction call -> the verified class of its patch."""


def episode_result(replies: Sequence[str] = REPLIES) -> dict[str, Any]:
    ep = Episode(ProtocolConfig("predictive"), lambda code: Outcome.PASS if "*" in code else Outcome.ASSERTION_FAILURE)
    for reply in replies:
        if ep.step(reply) is None:
            break
    return {"steps": [s.to_dict() for s in ep.steps], "summary": ep.summary(), "config": ep.config.to_dict()}


def trace_nodes(
    result: dict[str, Any], encode: Callable[[str], list[int]], scaffold: Sequence[int] = (9001, 9002)
) -> list[dict[str, Any]]:
    """The message graph of one linear rollout (dicts shaped like `records.TOKEN_NODE_TYPE`)."""
    nodes: list[dict[str, Any]] = []

    def add(role: str, sampled: bool, ids: list[int], mask: list[bool]) -> None:
        nodes.append(
            {
                "parent": len(nodes) - 1 if nodes else None,
                "role": role,
                "sampled": sampled,
                "token_ids": ids,
                "mask": mask,
                "logprobs": [-0.5] * sum(mask),
            }
        )

    prompt = encode("system and task prompt")
    add("user", False, prompt, [False] * len(prompt))
    for step in result["steps"]:
        completion = encode(step["reply"])
        add("assistant", True, list(scaffold) + completion, [False] * len(scaffold) + [True] * len(completion))
        if step["result_sent"] and step["result"] is not None:
            answer = encode(step["result"])
            add("user", False, answer, [False] * len(answer))
    return nodes


async def run_one_task(seat: Any, row: dict[str, Any]) -> Any:
    """The trace of one rollout of ``row`` (as task idx 0) by ``seat``'s agent program, as prime-rl's env server runs
    it (`vf.make_agent`, entered when it is a context manager). Needs verifiers v1 and ``predict`` importable."""
    import verifiers.v1 as vf

    from predict.env.taskset import task_from_row

    agent = vf.make_agent(seat)
    row_task = task_from_row(row)
    task = type(row_task)(row_task.data.model_copy(update={"idx": 0}), row_task.config)
    if hasattr(agent, "__aenter__"):
        async with agent as live:
            return await live.run(task)
    return await agent.run(task)


"""Synthetic evaluation records with the real schema: each rollout is played through `protocol.Episode` and
turned into a row by `records.build_record`, so statistics and the report are tested on what rollouts produce.

A rollout is a script of patches: (verified outcome of the patched code, prediction, decision); the final verdict
is the outcome of the last kept patch (the stub fails when nothing was kept)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predict.env.protocol import Episode, ProtocolConfig
from predict.env.records import build_record, write_records
from predict.outcomes import Outcome

Patch = tuple[str, str | None, str | None]  # (outcome, prediction, decision); prediction None = reactive arm


def rollout(task_id: int, patches: Sequence[Patch], *, arm: str = "B", seed: int = 42, checkpoint: str = "step100",
            split: str = "val", variant: str = "none", budget: int = 8, final: bool = True) -> dict[str, Any]:
    protocol = "predictive" if arm != "A" else "reactive"
    codes = {f"def f():\n    return {i}": Outcome(o) for i, (o, _, _) in enumerate(patches)}
    ep = Episode(ProtocolConfig.resolve(protocol=protocol, variant=variant, budget=budget),
                 lambda code: codes.get(code.strip(), Outcome.ASSERTION_FAILURE))
    current = "# Write your function here."
    final_outcome = "ASSERTION_FAILURE"
    for i, (outcome, prediction, decision) in enumerate(patches):
        code = f"def f():\n    return {i}"
        find = current.replace("\n", "\\n")
        ep.step(f'CALL apply_patch {{"find": "{find}", "replace": "{code.replace(chr(10), chr(92) + "n")}"}}')
        if ep.done:
            break
        if protocol == "predictive":
            ep.step(f"<PREDICTION>{prediction}</PREDICTION> <DECISION>{decision}</DECISION>")
            kept = ep.steps[-1].decision == "KEEP"
        else:
            kept = True
        if kept:
            current, final_outcome = code, outcome
        if ep.done:
            break
    if final and not ep.done:
        ep.step("FINAL: done")
    result = {"config": ep.config.to_dict(), "steps": [s.to_dict() for s in ep.steps], "summary": ep.summary()}
    meta = {"arm": arm, "seed": seed, "checkpoint": checkpoint, "protocol": protocol, "variant": variant,
            "model": "synthetic", "client": "eval", "budget": budget, "revise_costs_call": True, "split": split}
    return build_record(meta=meta, task={"task_id": task_id, "split": split}, agent_result=result,
                        final_verdict={"outcome": final_outcome}, reward=float(final_outcome == "PASS"), ok=True,
                        error=None, wall_s=0.1)


PASS_KEEP: Patch = ("PASS", "PASS", "KEEP")
FAIL_KEEP: Patch = ("ASSERTION_FAILURE", "PASS", "KEEP")
FAIL_REVISE: Patch = ("ASSERTION_FAILURE", "ASSERTION_FAILURE", "REVISE")
PASS_REVISE: Patch = ("PASS", "ASSERTION_FAILURE", "REVISE")

# The writeup's step-100 seed-42 Arm B figures on 500 tasks, as rollout scripts:
#   never revised 409 rollouts, 259 pass (63.3%); ever revised 91, 1 passes (1.1%);
#   failing patches 315, 70 revised (22.2%); passing patches 284, 24 revised (8.5%).
WRITEUP_B_STEP100_SEED42: list[tuple[int, list[Patch]]] = [
    (259, [PASS_KEEP]),
    (145, [FAIL_KEEP]),
    (5, [FAIL_KEEP, FAIL_KEEP]),
    (1, [FAIL_REVISE, PASS_KEEP]),
    (24, [PASS_REVISE, FAIL_KEEP]),
    (63, [FAIL_REVISE, FAIL_KEEP]),
    (3, [FAIL_REVISE, FAIL_REVISE, FAIL_KEEP]),
]


def scripted_records(script: Sequence[tuple[int, list[Patch]]], **kw: Any) -> list[dict[str, Any]]:
    rows, task_id = [], 0
    for count, patches in script:
        for _ in range(count):
            rows.append(rollout(task_id, patches, **kw))
            task_id += 1
    return rows


def write_eval(root: Path, run: str, checkpoint: str, seed: int, rows: list[dict[str, Any]], split: str = "val") -> Path:
    return write_records(rows, root / run / checkpoint / split / f"seed{seed}.parquet")

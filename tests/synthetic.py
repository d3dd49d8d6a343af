"""Synthetic evaluation records with the real schema: each rollout is played through `protocol.Episode` and
turned into a row by `records.build_record`, so statistics and the report are tested on what rollouts produce.

A rollout is a script of patches: (verified outcome of the patched code, prediction, decision); the final verdict
is the outcome of the last kept patch (the stub fails when nothing was kept)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predict.config.models import AblationSettings
from predict.env.protocol import Episode, ProtocolConfig
from predict.env.records import build_record, write_records
from predict.runs import RunSpec
from predict.stats import ExtensionRun
from predict.vocabulary import Outcome

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


# ---------------------------------------------------------------------------------------------------------------
# The writeup's TEST figures (500 test tasks, seeds 42 and 43, each arm at sft and at its selected step100)
# ---------------------------------------------------------------------------------------------------------------
A_PASS: Patch = ("PASS", None, None)
A_FAIL: Patch = ("ASSERTION_FAILURE", None, None)
# Reactive scripts: P first patch passes; R first patch fails, the second passes (recovered); F fails; N no patch.
REACTIVE = {"P": [A_PASS], "R": [A_FAIL, A_PASS], "F": [A_FAIL], "N": []}
PREDICTIVE_SFT = {"P": [PASS_KEEP], "F": [FAIL_KEEP]}  # the SFT checkpoint predicts PASS for everything

# (count, SFT script, RL script) per task, in task order. The counts are chosen so that exact McNemar gives the
# writeup's p-values (statsmodels, two-sided):
#   Arm A seed 42: pass@1 251 -> 282 (56.4%), n10 51 / n01 20, p = 0.00030; first patch PASS 214 (42.8%) -> 239
#     (47.8%), n10 41 / n01 16, p = 0.0013 (10 SFT rollouts apply no patch: first-patch failures)
#   Arm A seed 43: 258 -> 280, n10 57 / n01 35, p = 0.028
#   Arm B seed 42: 240 -> 260 (52.0%, the 409/91 REVISE split of WRITEUP_B_STEP100_SEED42), n10 50 / n01 30,
#     p = 0.033
#   Arm B seed 43: 234 -> 265, n10 62 / n01 31, p = 0.0017
WRITEUP_TEST_A: dict[int, list[tuple[int, str, str]]] = {
    42: [(198, "P", "P"), (16, "P", "F"), (6, "R", "P"), (27, "R", "R"), (4, "R", "F"), (35, "F", "P"),
         (16, "F", "R"), (188, "F", "F"), (10, "N", "F")],
    43: [(223, "P", "P"), (57, "F", "P"), (35, "P", "F"), (185, "F", "F")],
}
WRITEUP_TEST_B43: list[tuple[int, str, str]] = [(203, "P", "P"), (62, "F", "P"), (31, "P", "F"), (204, "F", "F")]
WRITEUP_TEST = {  # what the statistics must give back
    "pass_at_1": {("A", "step100", 42): 282, ("B", "step100", 42): 260, ("A", "sft", 42): 251,
                  ("B", "sft", 42): 240, ("A", "step100", 43): 280, ("A", "sft", 43): 258,
                  ("B", "step100", 43): 265, ("B", "sft", 43): 234},
    "rl_vs_sft_p": {("A", 42): 0.0003, ("A", 43): 0.028, ("B", 42): 0.033, ("B", 43): 0.0017},
    "first_patch": {("A", "sft", 42): 214, ("A", "step100", 42): 239},
    "first_patch_p": 0.0013,
}


def _expand(plan: Sequence[tuple[int, str, str]], shuffle: int | None = None) -> list[tuple[str, str]]:
    """One (SFT, RL) script pair per task; `shuffle` spreads them over the tasks in a seeded order (so Arm A's
    passes do not line up with Arm B's: the writeup's A vs B pairings are not significant)."""
    tasks = [(sft, rl) for count, sft, rl in plan for _ in range(count)]
    if shuffle is not None:
        random.Random(shuffle).shuffle(tasks)
    return tasks


def writeup_test_records(seed: int, arm: str) -> dict[str, list[dict[str, Any]]]:
    """checkpoint (sft, step100) -> the 500 test rollouts of one arm and seed, built to the writeup's figures."""
    kw = {"arm": arm, "seed": seed, "split": "test"}
    if arm == "A":
        tasks = _expand(WRITEUP_TEST_A[seed], shuffle=seed)
        return {ckpt: [rollout(t, REACTIVE[pair[i]], checkpoint=ckpt, **kw) for t, pair in enumerate(tasks)]
                for i, ckpt in enumerate(("sft", "step100"))}
    if seed == 43:
        tasks = _expand(WRITEUP_TEST_B43)
        rl_fail = [[FAIL_KEEP], [FAIL_REVISE, FAIL_KEEP]]
        return {"sft": [rollout(t, PREDICTIVE_SFT[s], checkpoint="sft", **kw) for t, (s, _) in enumerate(tasks)],
                "step100": [rollout(t, [PASS_KEEP] if r == "P" else rl_fail[t % 2], checkpoint="step100", **kw)
                            for t, (_, r) in enumerate(tasks)]}
    rl = scripted_records(WRITEUP_B_STEP100_SEED42, checkpoint="step100", **kw)
    passing = [r["task_id"] for r in rl if r["final_pass"]]
    failing = [r["task_id"] for r in rl if not r["final_pass"]]
    sft_pass = set(passing[:210]) | set(failing[:30])  # n10 = 50 (RL passes, SFT fails), n01 = 30
    return {"sft": [rollout(t, [PASS_KEEP] if t in sft_pass else [FAIL_KEEP], checkpoint="sft", **kw)
                    for t in range(len(rl))], "step100": rl}


def write_writeup_evaluations(root: Path, val_tasks: int = 10) -> tuple[list[Path], list[Path]]:
    """(val files, test files) under root/{run}/{checkpoint}/{split}/seed{seed}.parquet: the writeup's test
    figures, and a small val set on which a fixed step-100 selection picks step100 for every arm and seed."""
    val, test = [], []
    for arm in ("A", "B"):
        for seed in (42, 43):
            for ckpt, rows in writeup_test_records(seed, arm).items():
                test.append(write_eval(root, arm, ckpt, seed, rows, split="test"))
                script = [PASS_KEEP if t % 2 else FAIL_KEEP for t in range(val_tasks)]
                val_rows = [rollout(t, [p if arm == "B" else (p[0], None, None)], arm=arm, seed=seed, checkpoint=ckpt)
                            for t, p in enumerate(script)]
                val.append(write_eval(root, arm, ckpt, seed, val_rows))
    return val, test


def extension_spec(run: str, arm: str, **fields: Any) -> RunSpec:
    """An extension run's `RunSpec` as `predict.runs.resolve_run` would give it, with the study's values (test cost
    1, variant none, the decision unmasked, RL) for the fields a test does not name."""
    predictive = arm == "B"
    values = {"protocol": "predictive" if predictive else "reactive", "variant": "none",
              "alpha": 1.0 if predictive else 0.0, "test_cost": 1, "mask_decision": False, "trainer": "rl"}
    return RunSpec(run=run, arm=arm, kind="extension", **{**values, **fields})


def small_test_campaign(
    root: Path,
) -> tuple[list[Path], list[dict[str, Any]], dict[str, AblationSettings], dict[str, ExtensionRun]]:
    """(test files, val selection, ablations, extensions) of a 10-task test campaign, seed 42: A and B at sft and
    step100, forced_keep and edit_on_revise at step50 and step100; step100 selected everywhere. pass@1 at step100:
    A 0.7, B 0.4, forced_keep 0.6, edit_on_revise 0.5 (one less at the other checkpoint)."""
    passes = {"A": 7, "B": 4, "forced_keep": 6, "edit_on_revise": 5}
    paths = []
    for run, n_pass in passes.items():
        for ckpt in (("sft", "step100") if run in ("A", "B") else ("step50", "step100")):
            rows = [rollout(t, [PASS_KEEP if t < n_pass - (ckpt != "step100") else FAIL_REVISE],
                            arm="A" if run == "A" else "B", checkpoint=ckpt, split="test") for t in range(10)]
            paths.append(write_eval(root, run, ckpt, 42, rows, split="test"))
    selection = [{"run": r, "seed": 42, "mode": "fixed", "step": 100, "checkpoint": "step100", "val_pass_at_1": 0.5,
                  "fallback": False} for r in passes]
    extensions = {"edit_on_revise": ExtensionRun(extension_spec("edit_on_revise", "B", variant="edit_on_revise"))}
    return paths, selection, {"forced_keep": AblationSettings(variant="forced_keep")}, extensions


def write_test_split(config: dict[str, Any], path: Path) -> Path:
    """The test split of `config`'s data section (predict.data.derive_test_split) as `predict split` writes it: the
    only tasks file a test campaign takes."""
    from predict.campaign import campaign_test_split
    from predict.data import MBPP_SCHEMA
    from predict.outputs import write_rows

    return write_rows(campaign_test_split(config).rows, MBPP_SCHEMA, path)


def record_campaign(ledger: Path, config: dict[str, Any], paths: Sequence[Path],
                    selection: Sequence[dict[str, Any]]) -> str:
    """The campaign ledger of these synthetic test files, written as the campaign writes it (predict.campaign):
    admitted under `config`'s design, then each file recorded done with its sha256, since `predict stats` on test
    reads only files its ledger knows. Returns the campaign id."""
    from predict.campaign import TestLedger
    from predict.fingerprint import file_sha256
    from predict.stats import read_evaluation

    tasks = write_test_split(config, ledger.with_name("synthetic-test-tasks.parquet"))
    plan = [(ev.run, ev.checkpoint, ev.seed) for ev in map(read_evaluation, paths)]
    # The campaign looks for history in the study's results_dir; config/local.yaml's is the checkout's results/,
    # which may hold a real campaign this ledger does not know (CI runs `all` before the tests). These files are
    # admitted after they exist, from wherever the caller wrote them: the results folder here is one of their own.
    config = {**config, "results_dir": str(ledger.with_name("synthetic-results"))}
    admitted = TestLedger(ledger).admit(config, plan, [(*e, "synthetic") for e in plan], tasks_path=tasks,
                                        selection=selection)
    for (run, checkpoint, seed), admission, path in zip(plan, admitted, paths, strict=True):
        TestLedger(ledger).record({"run": run, "checkpoint": checkpoint, "seed": seed, **admission.fields(),
                                   "sha256": file_sha256(path)}, "done")
    return admitted[0].campaign

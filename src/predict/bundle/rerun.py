"""`predict verify-bundle --rerun K`: K of the bundle's test rollouts re-executed with the checkpoints at hand and
compared row for row with the bundled rows: the "reproduced" level.

This is the one exception to "the test split is touched once" (docs/test-campaign.md): it replays rollouts the
campaign's ledger already records ``done``, for the checkpoints the campaign evaluated (their content hash must equal
the recorded one), writes nothing into a results folder or a ledger (its rows stay in memory, the server's log goes
to a scratch folder) and feeds no statistic. `replay_test_rollouts` is its one entry.

Rules:

* Which rollouts (`pick_rollouts`): K, spread over the campaign's evaluations in plan order (one each, round robin),
  the rows of each chosen with `random.Random(seed)` (``--rerun-seed``: a reviewer picks their own).
* Rows are equal when every column is, but the ones that differ between two runs of one rollout by nature
  (`predict.env.records.PER_RUN_COLUMNS`: times and a random id); floats bit for bit.
* A difference names its first column, and where the campaign evaluated on a GPU, what can make a row differ there
  without any tampering (`gpu_rerun_note`: vLLM's own attention kernels, kernels a compile chose by timing them;
  docs/repeatability.md).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the re-execution's server log, in its scratch folder: it says whether the server compiled its graphs
RERUN_LOG = "vllm.log"


@dataclass(frozen=True)
class Pick:
    """One bundled test rollout to re-execute: its evaluation (results path and key), its row and the model."""

    evaluation: str  # eval/{run}/{checkpoint}/test/seed{seed}.parquet
    run: str
    checkpoint: str
    seed: int
    row: int
    task_id: int
    sample: int


def pick_rollouts(bundle: Path, plan: Sequence[Sequence[Any]], k: int, seed: int) -> list[Pick]:
    """K rollouts of the campaign's evaluations (see the module docstring)."""
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    queues: dict[tuple[str, str, int], list[Pick]] = {}
    for run, checkpoint, seed_ in plan:
        rel = f"eval/{run}/{checkpoint}/test/seed{seed_}.parquet"
        rows = pq.read_table(bundle / rel, columns=["task_id", "sample"]).to_pylist()
        queues[(run, checkpoint, int(seed_))] = [
            Pick(rel, run, checkpoint, int(seed_), row=i, task_id=int(rows[i]["task_id"]), sample=int(rows[i]["sample"]))
            for i in rng.sample(range(len(rows)), len(rows))]
    picks: list[Pick] = []
    while len(picks) < k and any(queues.values()):
        for queue in queues.values():
            if queue and len(picks) < k:
                picks.append(queue.pop(0))
    return picks


def replay_test_rollouts(config: Mapping[str, Any], picks: Sequence[Pick], models: Mapping[tuple[str, str, int], str],
                         *, tasks_path: Path, selection: Sequence[Mapping[str, Any]], ledger: Path,
                         scratch: Path) -> list[dict[str, Any]]:
    """Re-execute these test rollouts, each as its evaluation ran it (`predict.evaluate.evaluation_job`'s settings,
    one vLLM server reloading each checkpoint in place as an evaluation job does); returns their rows, in order.
    Writes only under `scratch`. The coordinator's switch point: the test campaign's own replay entry, where there
    is one, goes here."""
    from predict.data import load_split
    from predict.env.runner import run_rollouts_sync
    from predict.evaluate import CheckpointServer, evaluation_config, evaluation_job
    from predict.rollouts import rollout_settings, sandbox_isolation
    from predict.runs import resolve_run
    from predict.serving.server import SERVED_NAME

    tasks = {int(r["task_id"]): r for r in load_split(tasks_path)}
    study = evaluation_config(config, "test")  # the test campaign's typed object
    # the sandbox layers the evaluation's checks had, or a refusal naming the missing one
    sandbox_isolation(study)
    scratch.mkdir(parents=True, exist_ok=True)
    out: dict[Pick, dict[str, Any]] = {}
    groups: dict[tuple[str, str, int], list[Pick]] = {}
    for pick in picks:
        groups.setdefault((pick.run, pick.checkpoint, pick.seed), []).append(pick)
    # Sized as the evaluation's server was (evaluate.py): the same sequences in flight, so the same rows.
    with CheckpointServer(study.serving.model_copy(update={"shared": None}), scratch / RERUN_LOG,
                          sequences=study.env.concurrency) as server:
        for (run, checkpoint, seed), mine in groups.items():
            model = models[(run, checkpoint, seed)]
            job = evaluation_job(study, run=run, checkpoint=checkpoint, split="test", seed=seed, tasks_path=tasks_path,
                                 model=model, out=scratch / "never-written.parquet", test_ledger=ledger,
                                 selection=selection)
            base_url = server.load(model, version=checkpoint)
            settings = rollout_settings(job, resolve_run(study, run).env(study), base_url=base_url, model=SERVED_NAME)
            rows = run_rollouts_sync([{**tasks[p.task_id], "sample": p.sample} for p in mine], settings)
            by_task = {(int(r["task_id"]), int(r["sample"])): r for r in rows}
            out.update({p: by_task[(p.task_id, p.sample)] for p in mine})
    return [out[p] for p in picks]


def row_difference(bundled: Mapping[str, Any], replayed: Mapping[str, Any]) -> str | None:
    """The first column (but `PER_RUN_COLUMNS`) where a replayed row differs from the bundled one, in words."""
    from predict.bundle.rederive import same
    from predict.env.records import PER_RUN_COLUMNS

    for column in bundled:
        if column in PER_RUN_COLUMNS:
            continue
        if not same(bundled[column], replayed.get(column)):
            return f"{column} is {_short(bundled[column])} in the bundle, {_short(replayed.get(column))} re-executed"
    return None


def gpu_rerun_note(serving: Any, rerun_log: Path) -> str:
    """For a difference's message where the campaign's evaluation was served on a GPU (the bundle's ``serving``):
    what can make a re-executed row differ there without any tampering; "" on the CPU, where rows repeat on any
    server (docs/repeatability.md)."""
    from predict.serving.identity import compile_cache_use, evaluation_attention_backend

    if serving.device != "gpu":
        return ""
    reasons = []
    if evaluation_attention_backend(serving) is None:
        reasons.append("the evaluation ran on vLLM's choice of attention kernels (serving.evaluation_attention_backend "
                       "is unset), whose greedy rows need not repeat even on one server")
    use = compile_cache_use(rerun_log.read_text(errors="replace")) if rerun_log.is_file() else "none"
    if use in ("compiled", "loaded"):
        did = "compiled its graphs on an empty compile cache" if use == "compiled" else "loaded its compiled graphs"
        reasons.append(f"this re-execution's server {did}, and a compile that chose kernels by timing them can give "
                       "other rows than the campaign's compile (evaluation servers compile deterministically since "
                       "issue 59: the manifest's server command and environment say whether the campaign's did)")
    return f"; on a GPU, {'; '.join(reasons)} (docs/repeatability.md)" if reasons else ""


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

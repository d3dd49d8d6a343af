"""`MbppTaskset`/`MbppTask`: MBPP rows as verifiers v1 tasks.

Rows come from a split parquet written by the data stage (columns task_id, text, code, test_list,
test_setup_code, challenge_test_list) or from a list of dicts; a row may also carry ``split`` and ``sample``
(the repeat index when one task is rolled out several times). The prompt is `protocol.task_prompt` (the MBPP
text plus its asserts); the gold ``code`` never enters the runtime.

* setup writes ``solution.py`` = `protocol.STUB` and `protocol.TASK_FILE` (the asserts the program tests with);
* finalize copies the program's result JSON into ``trace.info["agent_result"]`` and the final solution into
  ``trace.info["solution"]``;
* the reward is 1.0 iff the final solution.py passes all the task's tests (setup code + test_list) in the
  sandbox, else 0.0; the verdict goes to ``trace.info["final_verdict"]``. In process (``in_process``, the default,
  like the harness's) the check runs through the process's shared fork-server pool
  (`predict.sandbox.shared_verifier`); otherwise as ``python -m predict.env.check`` in the runtime (that module says
  why not `check_once` in the host).

The repeats of one row (``sample``) are one task to vf-eval's resume: `MbppTask.hash` leaves ``sample`` out
(`predict_mbpp.environment.MbppEnv` gives each rollout of ``-r n`` its own sample).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from predict.env.protocol import RESULT_FILE, RESULT_MAX_BYTES, SOLUTION_FILE, STUB, TASK_FILE, task_prompt
from predict.vocabulary import Outcome


class MbppTaskData(vf.TaskData):
    task_id: int
    text: str
    test_list: list[str]
    test_setup_code: str = ""
    challenge_test_list: list[str] = Field(default_factory=list)
    split: str | None = None
    sample: int = 0


class MbppTaskConfig(vf.TaskConfig):
    """Sandbox settings for grading (the same ones the program tests with)."""

    python: str = sys.executable
    timeout_s: float = 3.0
    memory_mb: int = 1024
    outcome_labels: str = "structured"
    in_process: bool = True
    """Grade through the shared sandbox pool in this process; False: ``python -m predict.env.check`` in the
    runtime (a new interpreter per rollout)."""


class MbppTask(vf.Task[MbppTaskData, vf.State, MbppTaskConfig]):
    @property
    def key(self) -> str:
        # Durable and unique even when a task is repeated (one key per sample).
        return f"mbpp-{self.data.task_id}-{self.data.sample}"

    @property
    def hash(self) -> str:
        """The content hash without ``sample``: the repeats of one row are one task to vf-eval's resume, which
        matches saved rollouts to the selected tasks by hash (`MbppEnv.slots` sets the sample per rollout)."""
        return super(MbppTask, MbppTask(self.data.model_copy(update={"sample": 0}), self.config)).hash

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        await runtime.write(SOLUTION_FILE, STUB.encode())
        task = {
            "task_id": self.data.task_id,
            "test_list": self.data.test_list,
            "test_setup_code": self.data.test_setup_code,
        }
        await runtime.write(TASK_FILE, json.dumps(task).encode())

    async def finalize(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        try:
            trace.info["agent_result"] = json.loads(await runtime.read(RESULT_FILE, max_bytes=RESULT_MAX_BYTES))
        except Exception as e:
            trace.info.setdefault("agent_result", {"missing": f"{type(e).__name__}: {e}"})
        trace.info["solution"] = (await runtime.read(SOLUTION_FILE)).decode(errors="replace")

    @vf.reward
    async def tests_pass(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        c = self.config
        if c.in_process:
            verdict = await asyncio.to_thread(self._grade, (await runtime.read(SOLUTION_FILE)).decode())
            trace.info["final_verdict"] = verdict
            return 1.0 if verdict["outcome"] == Outcome.PASS.value else 0.0
        argv = [
            c.python,
            "-m",
            "predict.env.check",
            f"--timeout-s={c.timeout_s}",
            f"--memory-mb={c.memory_mb}",
            f"--outcome-labels={c.outcome_labels}",
        ]
        result = await runtime.run(argv, {})
        if result.exit_code != 0:
            raise RuntimeError(f"grading failed (exit {result.exit_code}): {result.stderr[-2000:]}")
        verdict = json.loads(result.stdout.strip().splitlines()[-1])
        trace.info["final_verdict"] = verdict
        return 1.0 if verdict["outcome"] == Outcome.PASS.value else 0.0

    def _grade(self, solution: str) -> dict[str, Any]:
        """The final solution through the shared sandbox pool, recorded as ``python -m predict.env.check`` prints it."""
        from predict.env.check import verdict_json
        from predict.sandbox import shared_verifier

        c = self.config
        pool = shared_verifier(timeout_s=c.timeout_s, memory_mb=c.memory_mb, outcome_labels=c.outcome_labels)
        return verdict_json(pool.check(solution, self.data.test_list, self.data.test_setup_code))


def task_from_row(row: Mapping[str, Any], config: MbppTaskConfig | None = None, split: str | None = None) -> MbppTask:
    """One MBPP row (the split parquet's columns, plus optional split/sample) as a task."""
    test_list = list(row["test_list"])
    data = MbppTaskData(
        id=f"mbpp/{row['task_id']}",
        prompt=task_prompt(row["text"], test_list),
        task_id=int(row["task_id"]),
        text=row["text"],
        test_list=test_list,
        test_setup_code=row.get("test_setup_code") or "",
        challenge_test_list=list(row.get("challenge_test_list") or []),
        split=row.get("split") or split,
        sample=int(row.get("sample") or 0),
    )
    return MbppTask(data, config or MbppTaskConfig())


class MbppTasksetConfig(vf.TasksetConfig):
    id: str = "predict_mbpp"
    path: str | None = None
    """A split parquet from the data stage."""
    split: str | None = None
    """Split name recorded on the tasks (default: the parquet's file stem)."""
    order_seed: int | None = None
    """The RL seed: tasks come in `seeded_order` (prime-rl reshuffles each epoch with Random(epoch) whatever the
    seed, so without this both seeds would see one task order). None: the file's order."""
    task: MbppTaskConfig = MbppTaskConfig()


class MbppTaskset(vf.Taskset[MbppTask, MbppTasksetConfig]):
    def __init__(self, config: MbppTasksetConfig | None = None, rows: Iterable[Mapping[str, Any]] | None = None):
        super().__init__(config or MbppTasksetConfig())
        if rows is None and self.config.path is None:
            raise ValueError(
                "MbppTaskset needs a split parquet from the data stage: pass --env.taskset.path "
                "results/data/val.parquet to vf-eval (docs/vf-eval.md), path= in a prime-rl TOML's "
                "[...env.taskset], or MbppTasksetConfig(path=...) / MbppTaskset.from_rows(rows) in Python"
            )
        self._rows = list(rows) if rows is not None else None

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], config: MbppTasksetConfig | None = None) -> MbppTaskset:
        return cls(config, rows=rows)

    def load(self) -> Iterator[MbppTask]:
        split = self.config.split
        if self._rows is not None:
            rows: Iterable[Mapping[str, Any]] = self._rows
        else:
            from predict.data import load_split

            assert self.config.path is not None
            rows = load_split(self.config.path)
            split = split or Path(self.config.path).stem
        if self.config.order_seed is not None:
            rows = seeded_order(list(rows), self.config.order_seed)
        for row in rows:
            yield task_from_row(row, self.config.task, split)


def seeded_order(rows: Sequence[Mapping[str, Any]], seed: int) -> list[Mapping[str, Any]]:
    """`rows` in the local RL trainer's first-epoch order for `seed` (`predict.train.rl.step_tasks`: by task_id,
    then ``Random(f"{seed}:0")``). prime-rl then applies its own per-epoch permutation on top, so the orders of the
    two backends differ, but each depends on the seed."""
    ordered = sorted(rows, key=lambda r: r["task_id"])
    perm = list(range(len(ordered)))
    random.Random(f"{seed}:0").shuffle(perm)
    return [ordered[i] for i in perm]

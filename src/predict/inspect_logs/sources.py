"""What an Inspect log is made from (predict.inspect_logs): its parquet and, for an evaluation, the other run's log
it is read beside. Apart from the log's making (episodes), so that every input is read and checked before
inspect-ai is imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Source:
    """Where a log's rows come from: its parquet (path as given, sha256) and what the path names."""

    path: str
    sha256: str
    run: str
    split: str
    seed: int
    checkpoint: str  # an evaluation's checkpoint, or an RL step's step<N>
    kind: str = "evaluation"  # evaluation | rl_step

    @property
    def label(self) -> str:
        if self.kind == "rl_step":
            return f"{self.run} seed {self.seed} RL {self.checkpoint}"
        return f"{self.run} {self.checkpoint} {self.split} seed {self.seed}"


@dataclass(frozen=True)
class Pair:
    """The other run's log an evaluation is read beside (predict.inspect_logs: pairs)."""

    reactive: str
    predictive: str
    log: str  # the other log's path in the export folder
    rows: Mapping[tuple[int, int], Mapping[str, Any]]  # the other log's rows by (task_id, sample)

    def other(self, row: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The other run's episode of this row's task (and sample), if it has one."""
        return self.rows.get((int(row["task_id"]), int(row.get("sample") or 0)))

"""`TrainSample`: the one training record, shared by SFT, the local RL trainer and the prime-rl plugin; its parquet
schema (`SAMPLE_SCHEMA`) and reader/writer.

Rules: a module of its own that imports nothing of predict.train, so every builder of samples (`samples`,
`labels`, `sft`) and every consumer (`trainer`, the prime-rl plugin) imports it without an import cycle.

A sample is one token sequence with per-token streams aligned to ``token_ids``. The streams at position t describe
the prediction of ``token_ids[t]`` from ``token_ids[:t]``, so position 0 never carries a loss.

* ``mask``: the token carries some loss (a sampled token for RL, a target token for CE); prompt tokens are False.
* ``logprobs``: the sampling policy's logprob of a sampled token (0.0 where nothing was sampled).
* ``advantages``: the rollout's advantage at its sampled tokens (GRPO: one group-normalised value per rollout).
* ``rl_weights``: weight of the policy-gradient term (1.0 on sampled tokens; 0.0 on Arm B's sampled PREDICTION label).
* ``ce_weights``: weight of the cross-entropy term (SFT: 1.0 on assistant tokens; Arm B CE-only samples: alpha on
  the verified label tokens).

Kinds: ``sft`` (a rendered trace), ``rl`` (sampled tokens of a rollout), ``ce`` (Arm B: a prediction point's prefix
followed by the verified label). The parquet schema is `SAMPLE_SCHEMA`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.outputs import write_rows

SAMPLE_KINDS: tuple[str, ...] = ("sft", "rl", "ce")
STREAMS: tuple[str, ...] = ("mask", "logprobs", "advantages", "rl_weights", "ce_weights")


@dataclass
class TrainSample:
    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    advantages: list[float]
    rl_weights: list[float]
    ce_weights: list[float]
    kind: str
    task_id: int | None = None
    rollout_key: str | None = None
    """The rollout it came from (rl/ce samples)."""
    source: str | None = None
    """Free-form provenance, e.g. "call 3" or "prediction at step 5"."""

    def __post_init__(self) -> None:
        if self.kind not in SAMPLE_KINDS:
            raise ValueError(f"sample kind must be one of {SAMPLE_KINDS}, got {self.kind!r}")
        n = len(self.token_ids)
        for name in STREAMS:
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"{self.kind} sample ({self.source}): {name} has {len(getattr(self, name))} entries, token_ids {n}"
                )
        if n and (self.mask[0] or self.rl_weights[0] or self.ce_weights[0]):
            raise ValueError(f"{self.kind} sample ({self.source}): position 0 has no prefix and cannot carry a loss")

    @property
    def n_rl_tokens(self) -> int:
        return sum(w > 0 for w in self.rl_weights)

    @property
    def n_ce_tokens(self) -> int:
        return sum(w > 0 for w in self.ce_weights)

    @classmethod
    def ce_only(cls, token_ids: list[int], ce_weights: list[float], kind: str, *, logprobs: list[float] | None = None,
                **provenance: Any) -> TrainSample:
        """A sample trained by cross-entropy alone (SFT, RFT, Arm B's CE samples): mask = ce weight > 0, no rl
        weight, no advantage; `logprobs` (default 0.0) only for reference."""
        n = len(token_ids)
        return cls(token_ids=token_ids, mask=[w > 0 for w in ce_weights], logprobs=logprobs or [0.0] * n,
                   advantages=[0.0] * n, rl_weights=[0.0] * n, ce_weights=ce_weights, kind=kind, **provenance)


SAMPLE_SCHEMA = pa.schema(
    [
        ("token_ids", pa.list_(pa.int32())),
        ("mask", pa.list_(pa.bool_())),
        ("logprobs", pa.list_(pa.float32())),
        ("advantages", pa.list_(pa.float32())),
        ("rl_weights", pa.list_(pa.float32())),
        ("ce_weights", pa.list_(pa.float32())),
        ("kind", pa.string()),
        ("task_id", pa.int64()),
        ("rollout_key", pa.string()),
        ("source", pa.string()),
    ]
)
assert [f.name for f in fields(TrainSample)] == SAMPLE_SCHEMA.names, "TrainSample and SAMPLE_SCHEMA differ"


def write_samples(samples: Iterable[TrainSample], path: str | Path) -> Path:
    return write_rows((asdict(s) for s in samples), SAMPLE_SCHEMA, path)


def read_samples(path: str | Path) -> list[TrainSample]:
    return [TrainSample(**row) for row in pq.read_table(path, schema=SAMPLE_SCHEMA).to_pylist()]

"""`predict training-outcomes`: the training-outcome table (the writeup's "15,122 verified outcomes"), per predictive
run and seed over all its RL steps: each class's count and share of verified outcomes next to its count and share of
predictions, summed from the per-step metrics every trainer writes (`predict.train.step_metrics`: ``verified_<CLASS>``,
``pred_<CLASS>``). Reads no config (its slice is empty; it takes one like every stage)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from predict.train.step_metrics import PRED_CLASSES, read_metrics, share
from predict.vocabulary import OUTCOMES

if TYPE_CHECKING:
    from predict.stages import StageSettings

_I, _F, _S = pa.int64(), pa.float64(), pa.string()
TRAINING_OUTCOME_SCHEMA = pa.schema(
    [("run", _S), ("seed", _I), ("cls", _S), ("n_verified", _I), ("verified_share", _F), ("n_predicted", _I),
     ("predicted_share", _F), ("n_verified_total", _I), ("n_predicted_total", _I), ("n_steps", _I)]
)


def training_outcomes(runs: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The training-outcome table: for each (run, seed) whose steps logged any prediction, over all its steps,
    each class's count and share of verified outcomes and of predictions (MALFORMED as a prediction row).
    A run with no prediction (the reactive arm) has no rows; RFT's rows are left out (its rollouts are the SFT
    policy's, sampled once, not RL steps)."""
    out: list[dict[str, Any]] = []
    for (run, seed), all_rows in sorted(runs.items()):
        rows = [r for r in all_rows if r.get("backend") != "rft"]
        pred = {c: sum(int(r.get(f"pred_{c}") or 0) for r in rows) for c in PRED_CLASSES}
        verified = {c: sum(int(r.get(f"verified_{c}") or 0) for r in rows) for c in OUTCOMES}
        n_pred, n_ver = sum(pred.values()), sum(verified.values())
        if not n_pred:
            continue
        for c in PRED_CLASSES:
            v = verified.get(c)
            out.append({"run": run, "seed": int(seed), "cls": c, "n_verified": v,
                        "verified_share": share(v, n_ver), "n_predicted": pred[c],
                        "predicted_share": share(pred[c], n_pred), "n_verified_total": n_ver,
                        "n_predicted_total": n_pred, "n_steps": len(rows)})
    return out


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rl-metrics", nargs="*", default=[], help="results/rl/{run}/seed{seed}/metrics.parquet")
    p.add_argument("--out", required=True, help="results/stats/training_outcomes.parquet")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console, write_table

    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for path in args.rl_metrics:
        for row in read_metrics(path):
            runs.setdefault((row["run"], int(row["seed"])), []).append(row)
    rows = training_outcomes(runs)
    write_table(pa.Table.from_pylist(rows, schema=TRAINING_OUTCOME_SCHEMA), args.out)
    console.print(f"training outcomes: {len({(r['run'], r['seed']) for r in rows})} predictive run(s) -> {args.out}")
    return 0

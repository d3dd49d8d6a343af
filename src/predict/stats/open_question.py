"""The writeup's open question as one table: does learning to predict consequences (Arm B) improve decisions when
the consequences cannot be cheaply observed after acting (Arm A's way)? Arm B vs Arm A within each environment.

This is the `predict open-question` stage (val: ``results/extensions/open_question.parquet``) and, on test, a table
`predict stats` writes beside `predict.stats.TEST_STATS_TABLES` (``results/test/stats/open_question.parquet``) from
the test campaign's files, which `predict.campaign.statistics_inputs.check_test_inputs` holds against the ledger
first: one code path for both splits, as for the extension tables. (`predict.stats` cannot call this module: it
builds on that one.)
Rules:

* Environments come from `predict.runs.environments` (the one owner of the pairing): the study (arms A and B),
  expensive tests, irreversible, blind, each a reactive and a predictive run with the same variant and test_cost.
* Each run is read at its selected checkpoint (val: the selection over the val evaluations given, as every extension
  table makes it; test: the val selection, never re-selected). Every seed pairing of the two runs is one row (the
  study's A-vs-B pairing, `predict.stats.pair_plan`); a run of an environment missing from the inputs while its
  counterpart is there is an error, an environment with neither run is left out (logged).
* Per row the study's paired comparison (`predict.stats.compare`) with Arm B first: pass@1 of each on the tasks both
  scored (with n), the difference B - A and its paired-bootstrap CI, the discordant counts, exact McNemar p; Holm
  (`predict.stats.holm`) over the whole table, ONE family (every environment and seed pairing of the split):
  ``mcnemar_p_holm``.
* Beside it Arm B's mechanism (`predict.stats.mechanism_metrics` of its evaluation): REVISE precision (REVISEd
  patches whose verified outcome was not PASS, of the REVISEd patches) and pass@1 of never- vs ever-revised
  rollouts, each with its counts.
* Power (`with_open_question_power`): the power table's ``power_holm`` for this family (`family_size`: environments
  x seed pairings), added to the power table as ``*_open_question`` columns.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from predict.campaign import StatsInputError
from predict.runs import Environment
from predict.stats.exact import holm
from predict.stats.metrics import Evaluation, mechanism_metrics
from predict.stats.pairs import check_selection, compare, load_evaluations, pair_plan

if TYPE_CHECKING:
    from predict.stages import StageSettings

OPEN_QUESTION = "open_question"  # the table's name, on val (results/extensions/) and on test (results/test/stats/)
log = logging.getLogger(__name__)

OPEN_QUESTION_SCHEMA = pa.schema([
    ("environment", pa.string()), ("variant", pa.string()), ("test_cost", pa.int64()), ("split", pa.string()),
    ("family", pa.string()),
    *[(f"{k}_{arm}", t) for arm in ("A", "B") for k, t in (
        ("run", pa.string()), ("checkpoint", pa.string()), ("seed", pa.int64()))],
    ("n", pa.int64()), ("n_only_A", pa.int64()), ("n_only_B", pa.int64()),
    ("n_pass_A", pa.int64()), ("pass_A", pa.float64()), ("n_pass_B", pa.int64()), ("pass_B", pa.float64()),
    ("diff", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()),
    ("n_B_only_passes", pa.int64()), ("n_A_only_passes", pa.int64()), ("discordance", pa.float64()),
    ("mcnemar_p", pa.float64()), ("mcnemar_p_holm", pa.float64()),
    ("revise_precision_B", pa.float64()), ("n_revised_fail_patches_B", pa.int64()), ("n_revised_patches_B", pa.int64()),
    ("never_revised_pass_B", pa.float64()), ("never_revised_n_pass_B", pa.int64()), ("never_revised_n_B", pa.int64()),
    ("ever_revised_pass_B", pa.float64()), ("ever_revised_n_pass_B", pa.int64()), ("ever_revised_n_B", pa.int64()),
    ("selection_fallback", pa.bool_()),
])


def open_question_table(
    paths: Sequence[str | Path | Evaluation],
    selection: Sequence[Mapping[str, Any]],
    environments: Sequence[Environment],
    *,
    split: str = "val",
    resamples: int,
    seed: int,
    ci: float,
) -> pa.Table:
    """A row per environment and seed pairing: Arm B vs Arm A at their selected checkpoints (the module docstring)."""
    evals = {k: ev for k, ev in load_evaluations(paths).items() if k[2] == split}
    chosen = {(s["run"], int(s["seed"])): s for s in selection}
    rows: list[dict[str, Any]] = []
    for env in environments:
        present = [run for run in env.runs if any(k[0] == run for k in evals)]
        if not present:
            log.info("open question: environment %s (%s vs %s) has no %s evaluation: left out", env.name,
                     env.reactive, env.predictive, split)
            continue
        if len(present) < 2:
            missing = next(run for run in env.runs if run not in present)
            raise StatsInputError(f"open question, environment {env.name}: {present[0]} has {split} evaluations, its "
                                  f"counterpart {missing} none (the table compares the two)")
        mine = {k: ev for k, ev in evals.items() if k[0] in env.runs}
        check_selection(mine, selection, f"open question, environment {env.name}")
        # the study's A-vs-B pairing, with this environment's runs in the arms' places
        role = {env.reactive: "A", env.predictive: "B"}
        as_arms = {(role[k[0]], *k[1:]): ev for k, ev in mine.items()}
        selected = {(role[run], s): c["checkpoint"] for (run, s), c in chosen.items() if run in role}
        for _, arm_a, arm_b in pair_plan(as_arms, ["A", "B"], {}, None, selected):
            pair = compare(arm_b, arm_a, OPEN_QUESTION, resamples, seed, ci)  # Arm B first: the difference is B - A
            m_b = mechanism_metrics(arm_b.rows)
            rows.append({
                "environment": env.name, "variant": env.variant, "test_cost": env.test_cost, "split": split,
                "family": f"{OPEN_QUESTION}/final_pass/{split}",
                **{f"{k}_{arm}": getattr(ev, k) for arm, ev in (("A", arm_a), ("B", arm_b))
                   for k in ("run", "checkpoint", "seed")},
                "n": pair["n"], "n_only_A": pair["n_only_b"], "n_only_B": pair["n_only_a"],
                "n_pass_A": pair["n_pass_b"], "pass_A": pair["pass_b"], "n_pass_B": pair["n_pass_a"],
                "pass_B": pair["pass_a"], "diff": pair["diff"], "ci_low": pair["ci_low"], "ci_high": pair["ci_high"],
                "n_B_only_passes": pair["n10"], "n_A_only_passes": pair["n01"], "discordance": pair["discordance"],
                "mcnemar_p": pair["mcnemar_p"],
                "revise_precision_B": (m_b["n_revised_fail_patches"] / m_b["n_revised_patches"]
                                       if m_b["n_revised_patches"] else math.nan),
                "n_revised_fail_patches_B": m_b["n_revised_fail_patches"],
                "n_revised_patches_B": m_b["n_revised_patches"],
                **{f"{group}_revised_{k}_B": m_b[f"{group}_revised_{k}"] for group in ("never", "ever")
                   for k in ("pass", "n_pass", "n")},
                "selection_fallback": bool(chosen[arm_a.run, arm_a.seed]["fallback"]
                                           or chosen[arm_b.run, arm_b.seed]["fallback"]),
            })
    for row, adjusted in zip(rows, holm([r["mcnemar_p"] for r in rows]), strict=True):
        row["mcnemar_p_holm"] = adjusted  # one family: every environment and seed pairing of the split
    return pa.Table.from_pylist(rows, schema=OPEN_QUESTION_SCHEMA)


def family_size(environments: Sequence[Environment], seeds: Sequence[int]) -> int:
    """Tests in the open question's Holm family: one per environment and seed pairing."""
    return len(environments) * len(seeds) ** 2


# `predict open-question`: Arm B vs Arm A within each environment, on val.
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval", nargs="*", default=[], help="val evaluations of every environment's two runs")
    p.add_argument("--out", required=True, help="results/extensions/open_question.parquet")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console, write_table
    from predict.runs import environments
    from predict.stats.settings import bootstrap_settings, val_selection

    evals = list(load_evaluations(args.eval).values())  # read once, for the selection and the table
    table = open_question_table(evals, val_selection(config, evals), environments(config),
                                **bootstrap_settings(config))
    write_table(table, args.out)
    console.print(f"open question: {table.num_rows} environment x seed-pairing row(s) -> {args.out}")
    return 0

"""The study's tables (`predict stats`, val and test): the pair plan, the paired comparisons with Holm, recovery,
prediction shares, selection and the test campaign's card rows.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from predict.campaign import StatsInputError, select_checkpoints
from predict.config import config_default
from predict.config.models import AblationSettings, SelectionSettings
from predict.stats.ablations import ABLATION_SCHEMA, ablation_table
from predict.stats.extensions import EXTENSION_SCHEMA, ExtensionRun, extension_inputs, extension_table
from predict.stats.metrics import (
    METRICS,
    STATS_TABLES,
    TEST_STATS_TABLES,
    Evaluation,
    class_metrics,
    confusion,
    mechanism_metrics,
)
from predict.stats.pairs import (
    CLASS_SCHEMA,
    CONFUSION_SCHEMA,
    PAIR_SCHEMA,
    RECOVERY_SCHEMA,
    SELECTION_SCHEMA,
    SHARES_SCHEMA,
    Key,
    add_holm,
    check_selection,
    compare,
    load_evaluations,
    pair_plan,
    prediction_shares,
    recovery_row,
    rows_table,
)

if TYPE_CHECKING:
    from predict.stages import StageSettings

CAMPAIGN_SCHEMA = pa.schema([
    ("campaign", pa.string()), ("config_hash", pa.string()), ("time", pa.string()), ("base_model", pa.string()),
    ("reason", pa.string()), ("results_dir", pa.string()), ("run_name", pa.string()), ("vllm_version", pa.string()),
    ("device", pa.string()), ("serving", pa.string()), ("n_planned", pa.int64()), ("n_done", pa.int64()),
    ("this", pa.bool_()),
])


def share_references(evals: dict[Key, Evaluation], arms: Sequence[str], reference: str | None) -> dict[Key, Evaluation]:
    """Test: an arm's reference is evaluated once, under the first seed; it serves every seed of the arm (the same
    Evaluation under each seed's key, so its rows and its seed stay those of its one file)."""
    out = dict(evals)
    for run in arms:
        refs = sorted(k for k in evals if k[0] == run and k[1] == reference)
        for _, _, split, seed in sorted({k for k in evals if k[0] == run}):
            if refs and (run, reference, split, seed) not in out:
                out[run, reference, split, seed] = evals[refs[0]]
    return out


def evaluated_split(evals: Mapping[Key, Evaluation], selection: Sequence[Mapping[str, Any]] | None) -> str:
    """The one split these evaluations are of (val when there are none); test needs the val `selection`."""
    splits = sorted({k[2] for k in evals})
    if len(splits) > 1:
        raise StatsInputError(f"evaluations of more than one split ({', '.join(splits)}): statistics are made per "
                              "split (val: results/stats/, test: results/test/stats/)")
    split = splits[0] if splits else "val"
    if split == "test" and selection is None:
        raise StatsInputError("test evaluations are read against the val checkpoint selection: pass --selection "
                              "results/stats/selection.parquet")
    return split


def evaluation_rows(evals: Mapping[Key, Evaluation]) -> tuple[list[dict], list[dict], list[dict]]:
    """The rows each evaluation gives the metrics, confusion and classes tables, in key order."""
    metrics: list[dict] = []
    conf: list[dict] = []
    classes: list[dict] = []
    for key, ev in sorted(evals.items()):
        ident = dict(zip(("run", "checkpoint", "split", "seed"), key, strict=True))
        protocols = ",".join(sorted(filter(None, {r.get("protocol") for r in ev.rows})))
        metrics.append({**ident, "protocol": protocols, **mechanism_metrics(ev.rows)})
        counts = confusion(ev.rows)
        conf += [{**ident, "verified": t, "predicted": p, "count": c} for (t, p), c in sorted(counts.items())]
        if counts:
            classes += [{**ident, **c} for c in class_metrics(counts)]
    return metrics, conf, classes


def selected_shares(evals: Mapping[Key, Evaluation], selected: Mapping[tuple[str, int], str], split: str,
                    reference: str | None) -> list[dict]:
    """The prediction-shares rows of each selected checkpoint that predicts, against its run's reference."""
    shares: list[dict] = []
    for (run, seed_), ckpt in sorted(selected.items()):
        sel, ref = evals.get((run, ckpt, split, seed_)), evals.get((run, reference or "", split, seed_))
        if sel is not None and ref is not None and ref is not sel and confusion(sel.rows):
            shares += prediction_shares(ref, sel)
    return shares


def study_stats(
    paths: Sequence[str | Path | Evaluation],
    *,
    arms: Sequence[str],
    ablations: Mapping[str, AblationSettings] | None = None,
    extensions: Mapping[str, ExtensionRun] | None = None,
    reference: str | None,
    selection_mode: str = config_default(SelectionSettings, "mode"),
    selection_step: int | None = config_default(SelectionSettings, "step"),
    selection: Sequence[Mapping[str, Any]] | None = None,
    campaigns: Sequence[Mapping[str, Any]] = (),
    default_test_cost: int,
    resamples: int,
    seed: int,
    ci: float,
) -> dict[str, pa.Table]:
    """Every statistics table from a set of evaluation files of ONE split, keyed and ordered as `STATS_TABLES`
    (val: the selection is made here) or `TEST_STATS_TABLES` (test: `selection` is the val selection, required;
    the ablation and extension tables are made here too, and `campaigns`, the ledger's campaigns on this split from
    `predict.campaign.statistics_inputs.check_test_inputs`, becomes the campaigns table). `extensions`: name ->
    its `ExtensionRun` (see `extension_table`)."""
    evals = load_evaluations(paths)
    split = evaluated_split(evals, selection)
    test = split == "test"
    metrics, conf, classes = evaluation_rows(evals)
    files = list(evals.values())  # one per file: the per-run tables read these (a shared reference is no second file)
    if test:
        evals = share_references(evals, arms, reference)
    if selection is None:
        selection = select_checkpoints(metrics, selection_mode, selection_step)
    else:
        selection = [dict(s) for s in selection]
        check_selection(evals, selection, f"{split} statistics")
    selected = {(s["run"], s["seed"]): s["checkpoint"] for s in selection}
    for m in metrics:
        m["selected"] = selected.get((m["run"], m["seed"])) == m["checkpoint"]
    plan = pair_plan(evals, arms, ablations or {}, reference, selected if test else None)
    pairs = [compare(a, b, kind, resamples, seed, ci, metric)
             for kind, a, b in plan for metric in (METRICS if kind == "vs_reference" else ("final_pass",))]
    add_holm(pairs, selected)
    recovery = [recovery_row(a, b) for kind, a, b in plan if kind == "vs_reference"]
    tables = {
        "metrics": rows_table(metrics),
        "pairs": rows_table(pairs, PAIR_SCHEMA),
        "recovery": rows_table(recovery, RECOVERY_SCHEMA),
        "confusion": rows_table(conf, CONFUSION_SCHEMA),
        "classes": rows_table(classes, CLASS_SCHEMA),
        "prediction_shares": rows_table(selected_shares(evals, selected, split, reference), SHARES_SCHEMA),
        "selection": rows_table(selection, SELECTION_SCHEMA),
    }
    if test:
        runs = {k[0] for k in evals}
        bootstrap = {"split": split, "resamples": resamples, "seed": seed, "ci": ci}
        tables["ablations"] = pa.concat_tables([ABLATION_SCHEMA.empty_table()] + [
            ablation_table(name, files, selection, base_arm=ablation.base_arm, **bootstrap)
            for name, ablation in (ablations or {}).items() if name in runs])
        tables["extensions"] = pa.concat_tables([EXTENSION_SCHEMA.empty_table()] + [
            extension_table(name, files, selection, spec=ext.spec, counterpart=ext.counterpart,
                            default_test_cost=default_test_cost, **bootstrap)
            for name, ext in (extensions or {}).items() if name in runs])
        tables["campaigns"] = rows_table(campaigns, CAMPAIGN_SCHEMA)
    names = TEST_STATS_TABLES if test else STATS_TABLES
    assert tuple(tables) == names, (tuple(tables), names)  # the constants the rules read stay true
    return tables




# `predict stats`: val evaluations, or (with --selection) the test campaign's.
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval", nargs="+", required=True, help=".../{run}/{checkpoint}/{split}/seed{seed}.parquet")
    p.add_argument("--out-dir", required=True,
                   help="writes predict.stats.STATS_TABLES (val) or TEST_STATS_TABLES (test) as {name}.parquet")
    p.add_argument("--selection", default=None,
                   help="test evaluations only: the val statistics' selection.parquet (the checkpoints compared)")
    p.add_argument("--test-ledger", default=None,
                   help="test evaluations only: the campaign ledger they are held against (default: the checkout's); "
                        "read for analysis, never created (docs/test-campaign.md: re-analysing given files)")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    import pyarrow.parquet as pq

    from predict.campaign import check_test_inputs, registry_ledger
    from predict.config import ConfigError
    from predict.config.models import plain_data
    from predict.outputs import print_table, write_table
    from predict.runs import environments
    from predict.stages import STAGES
    from predict.stats.open_question import OPEN_QUESTION, open_question_table
    from predict.stats.settings import bootstrap_settings

    selection = config.evaluation.selection
    extensions = {name: extension_inputs(config, name) for name in config.extensions}
    if args.selection and not Path(args.selection).exists():
        raise ConfigError(f"--selection {args.selection}: file not found (the val statistics' selection.parquet)")
    campaigns: list[dict] = []
    selection_rows = pq.read_table(args.selection).to_pylist() if args.selection else None
    if args.selection:  # test evaluations: only the campaign's files, under its selection and statistics settings
        ledger = Path(args.test_ledger) if args.test_ledger else registry_ledger()
        campaigns = check_test_inputs(ledger, args.eval, selection_rows, plain_data(config), STAGES["stats"].reads)
    evals = list(load_evaluations(args.eval).values())  # read once: the study's tables and the open question's
    tables = study_stats(
        evals,
        arms=sorted(config.arms),
        ablations=config.ablations,
        extensions=extensions,
        reference=config.evaluation.reference,
        selection_mode=selection.mode,
        selection_step=selection.step,
        selection=selection_rows,
        campaigns=campaigns,
        default_test_cost=config.env.test_cost,
        **bootstrap_settings(config),
    )
    if args.selection:  # the test's open question, from the same campaign files under the same selection
        tables[OPEN_QUESTION] = open_question_table(evals, selection_rows, environments(config),
                                                    split="test", **bootstrap_settings(config))
    out = Path(args.out_dir)
    for name, table in tables.items():
        write_table(table, out / f"{name}.parquet")
    print_table("greedy pass@1", ("run", "checkpoint", "split", "seed", "pass@1", "n"),
                [(m["run"], m["checkpoint"], m["split"], m["seed"], f"{m['pass_at_1']:.3f}",
                  f"{m['n_pass']}/{m['n_scored']}") for m in tables["metrics"].to_pylist()])
    return 0

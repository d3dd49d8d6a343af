"""A small synthetic study in a results folder laid out as the workflow lays it out, and its bundle, for the bundle's
tests (tests/test_bundle.py): no rollout, no training, no server.

The config is the embedded default's with fewer runs (arms A and B, the forced_keep and alpha0 ablations, the
mask_decision and edit_on_revise extensions, neither in sorted order) and 8 evaluation tasks. The split is `predict split`'s; every evaluation is rows of `tests.synthetic`
(played through the real protocol) for the tasks its split and the evaluation settings plan; each checkpoint is a
small folder of its own; the test campaign is admitted and recorded by the real ledger (`predict.campaign`); every
table and the report come from the project's stages (predict.bundle.rederive, which runs them as the rules do);
the bundle from `predict.bundle.build.build_bundle`."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.synthetic import A_FAIL, A_PASS, FAIL_KEEP, FAIL_REVISE, PASS_KEEP, rollout, write_eval

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "eval/B/step2/test/seed42.parquet"
# pass@1 of each run's checkpoints, so that the tables hold numbers other than 0 (val and test alike)
PASS_RATE = {("A", "sft"): 0.4, ("A", "step2"): 0.6, ("B", "sft"): 0.3, ("B", "step2"): 0.7,
             ("forced_keep", "step2"): 0.5, ("alpha0", "step2"): 0.4, ("mask_decision", "step2"): 0.5,
             ("edit_on_revise", "step2"): 0.6}


def study_config(root: Path) -> dict[str, Any]:
    from predict.config import validate_config, with_defaults

    config = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    config |= {"run_name": "synthetic", "results_dir": str(root / "results"),
               # not in sorted order: the report keeps the config's, which the stages' slices do not
               "ablations": {"forced_keep": {"base_arm": "B", "variant": "forced_keep"},
                             "alpha0": {"base_arm": "B", "alpha": 0.0}},
               "extensions": {"mask_decision": {"base_arm": "B", "mask_decision": True},
                              "edit_on_revise": {"base_arm": "B", "variant": "edit_on_revise"}}}
    config["data"]["mbpp_path"] = str(REPO / config["data"]["mbpp_path"])
    config["evaluation"] |= {"tasks": 8, "bootstrap": {"resamples": 1000, "seed": 0, "ci": 0.95}}
    validate_config(config)
    return with_defaults(config)


def val_checkpoints(config: Mapping[str, Any], run: str) -> list[str]:
    """As common.smk's RUN_CHECKPOINTS plans them: the arms' evaluation.checkpoints, an ablation's without sft, an
    extension's evaluation.extension_checkpoints."""
    ev = config["evaluation"]
    if run in config["extensions"]:
        return list(ev["extension_checkpoints"] or ev["checkpoints"])
    return list(ev["checkpoints"]) if run in config["arms"] else [c for c in ev["checkpoints"] if c != "sft"]


@contextmanager
def registry(ledger: Path):
    """`predict split` registers the test split with this ledger (predict.campaign.ledger.registry_ledger)."""
    old = os.environ.get("PREDICT_TEST_CAMPAIGNS")
    os.environ["PREDICT_TEST_CAMPAIGNS"] = str(ledger)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PREDICT_TEST_CAMPAIGNS")
        else:
            os.environ["PREDICT_TEST_CAMPAIGNS"] = old


def evaluation_rows(config: Mapping[str, Any], run: str, checkpoint: str, seed: int, split: str,
                    tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One synthetic rollout per planned task: passing with the run's pass rate, seeded by the evaluation."""
    from predict.rollouts import select_tasks
    from predict.runs import resolve_run

    spec = resolve_run(config, run)
    ev = config["evaluation"]
    rng = random.Random(f"{run}/{checkpoint}/{split}/{seed}")
    rows = []
    for task in select_tasks(tasks, ev["tasks"], ev["samples"]):
        passed = rng.random() < PASS_RATE[(run, checkpoint)]
        if spec.arm == "A":
            patches = [A_PASS] if passed else [A_FAIL, A_FAIL]
        else:
            patches = [PASS_KEEP] if passed else ([FAIL_KEEP] if spec.variant == "forced_keep" else [FAIL_REVISE, FAIL_KEEP])
        rows.append(rollout(task["task_id"], patches, arm=spec.arm, seed=seed, checkpoint=checkpoint, split=split,
                            variant=spec.variant))
    return rows


def checkpoint_folder(config: Mapping[str, Any], run: str, checkpoint: str, seed: int) -> str:
    """The checkpoint's folder where the workflow would have it (predict.runs.checkpoint_path), made on first use."""
    from predict.runs import checkpoint_path

    folder = Path(checkpoint_path(config, config["results_dir"], run, checkpoint, seed))
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "model.safetensors"
    if not weights.exists():
        weights.write_text(f"weights of {folder.relative_to(config['results_dir'])}")
    return str(folder)


def bundled_files(config: Mapping[str, Any]) -> list[str]:
    """The results files the bundle rule hands `predict bundle`, in its order (common.smk BUNDLED): the report, the
    evaluations, the statistics tables, the ablations and extensions in config order, the test statistics."""
    from predict.stats import STATS_TABLES, TEST_STATS_TABLES
    from predict.stats.open_question import OPEN_QUESTION

    results = Path(config["results_dir"])
    return ["report/index.html", *sorted(p.relative_to(results).as_posix() for p in results.glob("eval/*/*/*/*.parquet")),
            *(f"stats/{t}.parquet" for t in (*STATS_TABLES, "power", "training_outcomes")),
            *(f"ablations/{a}.parquet" for a in config["ablations"]),
            *(f"extensions/{e}.parquet" for e in config["extensions"]), f"extensions/{OPEN_QUESTION}.parquet",
            *(f"test/stats/{t}.parquet" for t in (*TEST_STATS_TABLES, OPEN_QUESTION))]


def synthetic_study(root: Path, ledger: Path) -> dict[str, Any]:
    """The results folder of a whole synthetic study under `root` (its test campaign in `ledger`); its config."""
    from predict.bundle.rederive import (
        handed_config,
        handed_lists,
        rederive_report,
        rederive_test,
        rederive_val,
        run_stage,
    )
    from predict.campaign import TestLedger, campaign_from_stats, read_selection
    from predict.config.models import plain_data
    from predict.data import load_split
    from predict.fingerprint import file_sha256
    from predict.runs import study_runs

    config = study_config(root)
    results = Path(config["results_dir"])
    with registry(ledger):
        run_stage("split", config, ["--out-dir", results / "data"], work=root)
    tasks = {split: load_split(results / "data" / f"{split}.parquet") for split in ("val", "test")}
    for run in study_runs(config):
        for checkpoint in val_checkpoints(config, run):
            for seed in config["seeds"]:
                checkpoint_folder(config, run, checkpoint, seed)
                write_eval(results / "eval", run, checkpoint, seed,
                           evaluation_rows(config, run, checkpoint, seed, "val", tasks["val"]))
    inputs = handed_lists(bundled_files(config))
    rederive_val(config, results, results, inputs=inputs)
    stats = results / "stats"
    # as the test campaign's stage sees it, as the plain data the campaign module takes (the stage is typed)
    campaign_config = plain_data(handed_config(config, "evaluate-test", root))
    plan = campaign_from_stats(campaign_config, stats / "metrics.parquet", stats / "selection.parquet")
    selection = read_selection(stats / "selection.parquet")
    models = {entry: checkpoint_folder(config, *entry) for entry in plan}
    admitted = TestLedger(ledger).admit(
        campaign_config, plan, [(*entry, models[entry]) for entry in plan], tasks_path=results / "data" / "test.parquet",
        selection=selection, depends_on={"vllm_version": "synthetic", "device": "cpu", "device_name": "synthetic CPU",
                                         "batch_invariant": False, "concurrency": 1},
        origin={"results_dir": str(results), "run_name": config["run_name"]})
    for (run, checkpoint, seed), admission in zip(plan, admitted, strict=True):
        path = write_eval(results / "eval", run, checkpoint, seed,
                          evaluation_rows(config, run, checkpoint, seed, "test", tasks["test"]), split="test")
        TestLedger(ledger).record({"run": run, "checkpoint": checkpoint, "seed": seed, **admission.fields(),
                                   "sha256": file_sha256(path)}, "done")
    rederive_test(config, results, results, ledger=ledger)
    rederive_report(config, results, results, inputs=inputs, test_tasks=results / "data" / "test.parquet",
                    example=EXAMPLE)
    return config


def bundle_study(root: Path, ledger: Path) -> tuple[dict[str, Any], Path]:
    """A synthetic study and its bundle (`results/bundle`, `results/bundle.tar.gz`): (config, bundle folder)."""
    from predict.bundle.build import build_bundle

    config = synthetic_study(root, ledger)
    results = Path(config["results_dir"])
    build_bundle(config, files=[results / rel for rel in bundled_files(config)],
                 data_manifest=results / "data" / "manifest.json", out_dir=results / "bundle",
                 archive=results / "bundle.tar.gz", example=results / EXAMPLE, ledger=ledger)
    return config, results / "bundle"

"""`predict <stage>`: the one command line of the pipeline. Each Snakemake rule calls exactly one stage.

Stages take explicit paths and values (the rule passes them from the config), so they also run
by hand outside Snakemake, and every stage's output is a parquet file written atomically.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from predict.config import ConfigError, config_from_json, load_config, load_config_slice
from predict.env.protocol import VARIANTS
from predict.fingerprint import ResultsDirError, claim_results_dir, mark_finished
from predict.rollouts import SplitGuardError
from predict.serving.server import VLLMServerError

log = logging.getLogger("predict")
console = Console(stderr=True)


def _cmd_check_config(args: argparse.Namespace) -> int:
    for path in args.configs:
        load_config(path)
        console.print(f"[green]ok[/green] {path}")
    return 0


def _cmd_split(args: argparse.Namespace) -> int:
    from predict.campaign import register_split, registry_ledger
    from predict.data import file_sha256, load_mbpp, split_tasks, write_split

    source = Path(args.mbpp)
    rows = load_mbpp(source, hf_fallback=args.hf_fallback, sha256=args.mbpp_sha256)
    splits = split_tasks(rows, args.seed, {"sft": args.sft, "rl": args.rl, "test": args.test})
    manifest = write_split(
        splits,
        args.out_dir,
        seed=args.seed,
        source=str(source) if source.exists() else "hf:mbpp/full",
        source_sha256=file_sha256(source) if source.exists() else None,
    )
    # The checkout's campaign registry learns the test task ids: no rollout outside the campaign may touch one.
    register_split(registry_ledger(), splits["test"], manifest["splits"]["test"]["content_sha256"])
    _print_table(f"MBPP split (seed {args.seed})", ("split", "tasks", "content sha256"),
                 [(name, entry["count"], entry["content_sha256"][:16]) for name, entry in manifest["splits"].items()])
    return 0


def _cmd_verify_gold(args: argparse.Namespace) -> int:
    from predict.sandbox.gold import check_gold, summarize, write_gold_report

    isolation: dict = {}
    rows = check_gold(
        args.data_dir,
        args.splits,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        workers=args.workers,
        outcome_labels=args.outcome_labels,
        require="auto" if args.require_layers == "auto" else args.require_layers.split(","),
        accept_weaker=args.accept_weaker,
        isolation=isolation,
    )
    write_gold_report(rows, args.out, args.summary_out, isolation)
    if isolation["missing"]:
        log.warning("weaker sandbox isolation accepted: %s not active", ", ".join(isolation["missing"]))
    _print_table("Verifier report: gold solutions by class", ("split", "outcome", "gold solutions"),
                 [(e["split"], e["outcome"], e["count"]) for e in summarize(rows) if e["count"]])
    for r in rows:
        if r["outcome"] != "PASS":
            log.warning("gold solution of task %s (%s) is %s: %s", r["task_id"], r["split"], r["outcome"], r["detail"])
    return 0


def _cmd_build_tiny_model(args: argparse.Namespace) -> int:
    from predict.tiny_model import build_tiny_qwen3

    out = build_tiny_qwen3(
        Path(args.out_dir),
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        tie_word_embeddings=args.tie_word_embeddings,
        dtype=args.dtype,
    )
    size_mb = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    console.print(f"tiny Qwen3 (hidden {args.hidden_size}, {args.num_layers} layers, seed {args.seed}): {out} [{size_mb:.1f} MB]")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from predict.serving.cli import serve_main

    return serve_main(args.serve_args)


def _cmd_check_serving(args: argparse.Namespace) -> int:
    from predict.io import write_json
    from predict.serving.check import check_serving_python

    config = _config(args)
    serving = config["serving"]
    result = check_serving_python(serving.get("python"), serving["device"], timeout_s=args.timeout_s)
    if args.out:
        write_json(result, args.out)
    console.print(
        f"[green]ok[/green] serving.python ({result['serving.python']}) = {result['interpreter']}: "
        f"vllm {result['vllm_version']} imports ({result['import_s']:.1f} s)"
    )
    return 0


def with_env(config: Mapping[str, Any], **values: Any) -> Mapping[str, Any]:
    """The config with these ``env`` keys replaced (None = keep the config's): one run's protocol knobs, e.g. the
    expensive-tests extension's test_cost."""
    values = {k: v for k, v in values.items() if v is not None}
    return {**config, "env": {**config["env"], **values}} if values else config


def _cmd_rollout(args: argparse.Namespace) -> int:
    from predict.rollouts import RolloutJob, run_job

    config = with_env(_config(args), test_cost=args.test_cost, max_chained_revisions=args.max_chained_revisions)
    job = RolloutJob(
        tasks_path=Path(args.tasks_file),
        split=args.split,
        out=Path(args.out),
        model=args.model,
        checkpoint=args.checkpoint,
        arm=args.arm,
        seed=args.seed,
        n_tasks=args.n_tasks,
        samples=args.samples,
        variant=args.variant,
        protocol=args.protocol,
        client=args.client,
        base_url=args.base_url,
    )  # no test ledger: the test split belongs to the test campaign (`predict evaluate --split test`)
    if args.arm not in config["arms"]:
        raise ConfigError(f"{args.config or 'config'}: arms: no arm {args.arm!r} (have {', '.join(config['arms'])})")
    summary = run_job(job, config)
    _print_summary(f"rollouts: arm {job.arm}, {job.checkpoint}, {job.split}, seed {job.seed}", summary)
    return 0


def _cmd_traces(args: argparse.Namespace) -> int:
    import time

    from predict.data import load_split
    from predict.traces.stage import run_stage

    config = _config(args)
    started = time.perf_counter()
    summary = run_stage(load_split(args.tasks_file), config, args.out_dir)
    for arm, mix in summary["arms"].items():
        _print_table(f"SFT traces, arm {arm}: the mix", ("role", "verified class", "traces"),
                     [(e["role"], e["verified_class"], e["count"]) for e in mix])
    tasks = ", ".join(f"{role} {n}" for role, n in sorted(summary["tasks"].items()))
    console.print(f"sft tasks: {tasks}; {summary['n_checks']} sandbox checks in {time.perf_counter() - started:.1f} s")
    return 0


def _cmd_run_traces(args: argparse.Namespace) -> int:
    from predict.data import load_split
    from predict.traces.stage import run_traces_stage

    mix = run_traces_stage(_config(args), args.run, args.arm_traces, load_split(args.tasks_file), args.out)
    _print_table(f"SFT traces, run {args.run}: the mix", ("role", "verified class", "traces"),
                 [(e["role"], e["verified_class"], e["count"]) for e in mix])
    return 0


def _print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table on stderr: each cell as str() shows it, None as an empty cell."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(None if cell is None else str(cell) for cell in row))
    console.print(table)


def _print_summary(title: str, summary: dict[str, Any], float_format: str = ".3f") -> None:
    """A stage's summary as a two-column table on stderr."""
    _print_table(title, ("measure", "value"), [(key, format(value, float_format) if isinstance(value, float)
                                               else str(value)) for key, value in summary.items()])


# The arguments through which a stage writes (a scratch folder outside results_dir claims nothing).
OUTPUT_ARGS = ("out", "out_dir", "metrics_out", "state_dir", "output_dir", "dataset_dir")


def _config(args: argparse.Namespace) -> dict:
    """The stage's slice of its config (predict.stages): whole config files (--config, --config-json) are cut to the
    slice too, so a stage reads only what the stage table lists, however it is run. A stage run with a whole config
    refuses a results_dir that another run_name made (`predict.fingerprint.claim_results_dir`; under Snakemake the
    workflow's onstart checks it once, since a slice holds neither name nor folder)."""
    from predict.stages import stage_config

    if getattr(args, "config_slice", None):
        config = load_config_slice(args.config_slice)
    else:
        config = load_config(args.config) if getattr(args, "config", None) else config_from_json(args.config_json)
        outputs = [getattr(args, name, None) for name in OUTPUT_ARGS]
        claim_results_dir(config, [p for o in outputs for p in (o if isinstance(o, list) else [o]) if p])
    # the test campaign's ledger records the frozen design (the whole config): a stage table entry of its own
    stage = "evaluate-test" if args.stage == "evaluate" and getattr(args, "split", None) == "test" else args.stage
    return stage_config(config, stage)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from predict.evaluate import CheckpointEval, evaluate_checkpoints

    config = _config(args)
    if not (len(args.checkpoint) == len(args.model) == len(args.out)):
        raise SystemExit(f"evaluate: give one --model and one --out per --checkpoint (got {len(args.checkpoint)} "
                         f"--checkpoint, {len(args.model)} --model, {len(args.out)} --out)")
    summaries = evaluate_checkpoints(
        config,
        run=args.run,
        split=args.split,
        seed=args.seed,
        tasks_path=Path(args.tasks_file),
        checkpoints=[CheckpointEval(c, m, Path(o)) for c, m, o in zip(args.checkpoint, args.model, args.out,
                                                                         strict=True)],
        base_url=args.base_url,
        test_ledger=Path(args.test_ledger) if args.test_ledger else None,
        selection_path=Path(args.selection) if args.selection else None,
        val_metrics=Path(args.val_metrics) if args.val_metrics else None,
        new_campaign=args.new_campaign or ((config.get("evaluation") or {}).get("new_campaign")
                                           if args.split == "test" else None),
    )
    for summary in summaries:
        checkpoint = summary.pop("checkpoint")
        _print_summary(f"greedy evaluation: {args.run}, {checkpoint}, {args.split}, seed {args.seed}", summary)
    return 0


def _bootstrap(config: dict) -> dict:
    return {"resamples": 10_000, "seed": 0, "ci": 0.95, **(config.get("evaluation", {}).get("bootstrap") or {})}


def _extension(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """An extension run as the statistics read it: its run spec (with its arm as base_arm) and its counterpart."""
    from dataclasses import asdict

    from predict.runs import extension_counterpart, resolve_run

    spec = resolve_run(config, name)
    return {"spec": {**asdict(spec), "base_arm": spec.arm}, "counterpart": extension_counterpart(config, name)}


def _cmd_stats(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from predict.campaign import check_test_inputs, registry_ledger, selection_settings
    from predict.io import write_table
    from predict.runs import environments
    from predict.stages import STAGES
    from predict.stats import load_evaluations, study_stats
    from predict.stats.open_question import OPEN_QUESTION, open_question_table

    config = _config(args)
    ev = config.get("evaluation") or {}
    selection = selection_settings(config)
    extensions = {name: _extension(config, name) for name in config.get("extensions") or {}}
    if args.selection and not Path(args.selection).exists():
        raise ConfigError(f"--selection {args.selection}: file not found (the val statistics' selection.parquet)")
    campaigns: list[dict] = []
    selection_rows = pq.read_table(args.selection).to_pylist() if args.selection else None
    if args.selection:  # test evaluations: only the campaign's files, under its selection and statistics settings
        ledger = Path(args.test_ledger) if args.test_ledger else registry_ledger()
        campaigns = check_test_inputs(ledger, args.eval, selection_rows, config, STAGES["stats"].reads)
    evals = list(load_evaluations(args.eval).values())  # read once: the study's tables and the open question's
    tables = study_stats(
        evals,
        arms=sorted(config["arms"]),
        ablations=config.get("ablations") or {},
        extensions=extensions,
        reference=ev.get("reference", "sft"),
        selection_mode=selection["mode"],
        selection_step=selection.get("step"),
        selection=selection_rows,
        campaigns=campaigns,
        default_test_cost=int(config["env"].get("test_cost", 1)),
        **_bootstrap(config),
    )
    if args.selection:  # the test's open question, from the same campaign files under the same selection
        tables[OPEN_QUESTION] = open_question_table(evals, selection_rows, environments(config),
                                                    split="test", **_bootstrap(config))
    out = Path(args.out_dir)
    for name, table in tables.items():
        write_table(table, out / f"{name}.parquet")
    _print_table("greedy pass@1", ("run", "checkpoint", "split", "seed", "pass@1", "n"),
                 [(m["run"], m["checkpoint"], m["split"], m["seed"], f"{m['pass_at_1']:.3f}",
                   f"{m['n_pass']}/{m['n_scored']}") for m in tables["metrics"].to_pylist()])
    return 0


def _selection(config: dict, evals: Iterable[Any]) -> Any:
    """The checkpoint selection (`predict.campaign.select`, config evaluation.selection) over these val evaluations:
    the same function `predict stats` writes selection.parquet with. (Not that file: it needs every run's
    evaluations, and one ablation's or extension's table builds only what it compares.)"""
    from predict.campaign import select
    from predict.stats import mechanism_metrics

    return select(config, [{"run": ev.run, "checkpoint": ev.checkpoint, "split": ev.split, "seed": ev.seed,
                            **mechanism_metrics(ev.rows)} for ev in evals])  # fmt: skip


def _cmd_run_table(args: argparse.Namespace) -> int:
    """`predict ablations` and `predict extensions`: one ablation's or extension's table, a row per seed."""
    from predict.io import write_table
    from predict.stats import ablation_table, extension_table, load_evaluations

    config = _config(args)
    section, name = args.stage, args.ablation if args.stage == "ablations" else args.extension
    runs = config.get(section) or {}
    if name not in runs:
        raise ConfigError(f"{section}: no {section[:-1]} {name!r} (have {', '.join(runs) or 'none'})")
    evals = list(load_evaluations(args.eval).values())  # read once, for the selection and the table
    if section == "ablations":
        table = ablation_table(name, evals, _selection(config, evals),
                               base_arm=(runs[name] or {}).get("base_arm", "B"), **_bootstrap(config))
    else:
        table = extension_table(name, evals, _selection(config, evals), **_extension(config, name),
                                default_test_cost=int(config["env"].get("test_cost", 1)), **_bootstrap(config))
    write_table(table, args.out)
    console.print(f"{name}: {table.num_rows} seed row(s) -> {args.out}")
    return 0


def _cmd_open_question(args: argparse.Namespace) -> int:
    """`predict open-question`: Arm B vs Arm A within each environment, on val (`predict.stats.open_question`)."""
    from predict.io import write_table
    from predict.runs import environments
    from predict.stats import load_evaluations
    from predict.stats.open_question import open_question_table

    config = _config(args)
    evals = list(load_evaluations(args.eval).values())  # read once, for the selection and the table
    table = open_question_table(evals, _selection(config, evals), environments(config), **_bootstrap(config))
    write_table(table, args.out)
    console.print(f"open question: {table.num_rows} environment x seed-pairing row(s) -> {args.out}")
    return 0


def _cmd_power(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from predict.io import write_table
    from predict.stats import observed_discordance, power_table
    from predict.stats.open_question import with_open_question_power

    config = _config(args)
    p = {"deltas": [0.02, 0.03, 0.05], "discordance": [0.2], "tasks": [500], "significance": 0.05, "target": 0.8,
         **(config.get("power") or {})}
    discordances = {"config": p["discordance"]}
    sizes = config["data"]["sizes"]
    val_tasks = sizes.get("val")
    if args.pairs:
        pairs = pq.read_table(args.pairs)
        if observed := observed_discordance(pairs):
            discordances["observed A vs B"] = observed
        val_tasks = val_tasks or max((int(n) for n in pairs.column("n").to_pylist()), default=None)  # val's n
    # The report Holm-adjusts A vs B over every seed pairing: that family's size.
    grid = {"deltas": p["deltas"], "discordances": discordances, "tasks": p["tasks"], "significance": p["significance"],
            "target": p["target"], "study_tasks": sizes["test"], "val_tasks": val_tasks}
    table = power_table(**grid, family_size=len(config["seeds"]) ** 2)
    # and of one test of the open question's family (its size: the rule's flag, from the run matrix)
    table = with_open_question_power(table, args.open_question_family, **grid)
    write_table(table, args.out)
    console.print(f"power: {table.num_rows} rows -> {args.out}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from predict.report import build_report

    config = _config(args)
    out = build_report(
        config,
        stats_dir=Path(args.stats_dir),
        test_stats_dir=Path(args.test_stats) if args.test_stats else None,
        ablations=[Path(p) for p in args.ablations],
        extensions=[Path(p) for p in args.extensions],
        open_question=Path(args.open_question) if args.open_question else None,
        power=Path(args.power),
        example=Path(args.example) if args.example else None,
        rl_metrics=[Path(p) for p in args.rl_metrics],
        tasks=Path(args.tasks_file) if args.tasks_file else None,
        training_outcomes=Path(args.training_outcomes) if args.training_outcomes else None,
        out=Path(args.out),
    )
    console.print(f"report: {out}")
    return 0


def _cmd_training_outcomes(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from predict.io import write_table
    from predict.train.metrics import TRAINING_OUTCOME_SCHEMA, read_metrics, training_outcomes

    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for path in args.rl_metrics:
        for row in read_metrics(path):
            runs.setdefault((row["run"], int(row["seed"])), []).append(row)
    rows = training_outcomes(runs)
    write_table(pa.Table.from_pylist(rows, schema=TRAINING_OUTCOME_SCHEMA), args.out)
    console.print(f"training outcomes: {len({(r['run'], r['seed']) for r in rows})} predictive run(s) -> {args.out}")
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from predict.train.sft import SFTConfig, run_sft
    from predict.train.tracking import TrackingSettings

    config = _config(args)
    cfg = SFTConfig.from_config(config["sft"])  # no sft section: MissingKey names the stage and the key
    summary = run_sft(
        traces=Path(args.traces),
        base_model=args.base_model,
        out_dir=Path(args.out_dir),
        metrics_out=Path(args.metrics_out),
        state_dir=Path(args.state_dir),
        cfg=cfg,
        arm=args.arm,
        enable_thinking=config["model"].get("enable_thinking", True),
        max_steps=args.max_steps if args.max_steps is not None else config["sft"].get("max_steps"),
        threads=args.threads,
        tracking=TrackingSettings.from_config(config),
        tracking_config=config,
    )
    _print_summary(f"SFT arm {args.arm}: {args.out_dir}", summary, float_format=".4g")
    return 0


def _cmd_train_run(args: argparse.Namespace) -> int:
    """`predict rl` and `predict rft`: one run and seed with the local trainer the run's config names."""
    from predict.runs import resolve_run
    from predict.train.driver import RLJob
    from predict.train.rft import run_rft
    from predict.train.rl import run_rl
    from predict.train.tracking import TrackingSettings

    config = _config(args)
    if "rl" not in config:
        raise ConfigError("config: no rl section" + (" (RFT takes its steps and checkpoints from it)"
                                                     if args.stage == "rft" else ""))
    if (trainer := resolve_run(config, args.run).trainer) != args.stage:
        raise ConfigError(f"run {args.run}: trainer {trainer}; run it with `predict {trainer}`")
    job = RLJob(run=args.run, seed=args.seed, init=Path(args.init), tasks=Path(args.tasks_file),
                out_dir=Path(args.out_dir), base_url=args.base_url, tracking=TrackingSettings.from_config(config))
    if not job.init.is_dir():
        raise FileNotFoundError(f"--init {job.init}: not a checkpoint folder")
    summary = (run_rl if args.stage == "rl" else run_rft)(job, config)
    _print_summary(f"{args.stage.upper()}: {job.run}, seed {job.seed}", summary)
    return 0


def _cmd_prime_rl_setup(args: argparse.Namespace) -> int:
    from predict.train.prime_rl.cluster import PATCH, setup_prime_rl

    summary = setup_prime_rl(
        args.repo, args.commit, args.dir, patch=args.patch or PATCH, python=args.python, extras=args.extra, out=args.out
    )
    console.print(f"prime-rl at {summary['commit'][:12]} in {args.dir}, PredictAlgorithm registered")
    return 0


def _cmd_prime_rl_config(args: argparse.Namespace) -> int:
    from predict.train.prime_rl import configs

    config = _config(args)
    if args.kind == "rl":
        if args.run is None or args.seed is None or args.tasks_file is None:
            raise ValueError("prime-rl-config rl needs --run, --seed and --tasks-file")
        table = configs.rl_config(
            config, args.run, args.seed, model=args.model, tasks=args.tasks_file, output_dir=args.output_dir
        )
    else:
        if args.arm is None or args.traces is None or args.dataset_dir is None:
            raise ValueError("prime-rl-config sft needs --arm, --traces and --dataset-dir")
        data = configs.write_sft_dataset(args.traces, args.dataset_dir)
        console.print(f"SFT dataset: {data}")
        table = configs.sft_config(
            config, args.arm, model=args.model, dataset_dir=args.dataset_dir, output_dir=args.output_dir
        )
    configs.write_toml(table, args.out)
    console.print(f"prime-rl {args.kind} config: {args.out}")
    return 0


def _cmd_prime_rl_train(args: argparse.Namespace) -> int:
    from predict.train.prime_rl import configs
    from predict.train.prime_rl.cluster import launch

    launch(args.kind, args.toml, args.dir)
    output_dir = configs.read_toml(args.toml)["output_dir"]
    if args.kind == "rl":
        if args.run_dir is None or args.checkpoints_out is None:
            raise ValueError("prime-rl-train rl needs --run-dir and --checkpoints-out")
        summary = configs.collect_rl_checkpoints(output_dir, args.run_dir, args.checkpoints_out)
        console.print(f"RL checkpoints: steps {summary['steps']} under {args.run_dir}")
        run_dir = Path(args.run_dir)
        run, seed = args.run or run_dir.parent.name, args.seed
        if seed is None and not run_dir.name.removeprefix("seed").isdigit():
            raise ValueError(f"--run-dir {run_dir}: not results/rl/<run>/seed<N>; pass --run and --seed")
        seed = int(run_dir.name.removeprefix("seed")) if seed is None else seed
        metrics = Path(args.metrics_out or run_dir / "metrics.parquet")
        raw = Path(args.raw_metrics_out or run_dir / "prime-rl-metrics.parquet")
        n = configs.write_rl_metrics(output_dir, metrics, raw, run=run, seed=seed)
        console.print(f"metrics: {n} steps -> {metrics} (prime-rl's own: {raw})")
        if args.tensorboard_dir:  # prime-rl wrote its curves live to W&B; TensorBoard gets them at collection
            configs.mirror_metrics(metrics, Path(args.tensorboard_dir), run=run, seed=seed)
            console.print(f"TensorBoard: {args.tensorboard_dir}")
    else:
        if args.checkpoint is None:
            raise ValueError("prime-rl-train sft needs --checkpoint")
        step = configs.collect_sft_checkpoint(output_dir, args.checkpoint)
        console.print(f"SFT checkpoint (step {step}): {args.checkpoint}")
        metrics = Path(args.metrics_out or Path(args.toml).parent / "metrics.parquet")
        n = configs.write_metrics(output_dir, metrics)
        console.print(f"metrics: {n} values -> {metrics}")
    mark_finished(output_dir)  # collected: a later run of this job trains again (predict.fingerprint)
    return 0


def _cmd_signal(args: argparse.Namespace) -> int:
    from predict.train.learning_signal import SANITY_NOTE, SignalSettings, print_curves, run_signal

    overrides = {k: v for k, v in {
        "seeds": tuple(args.seeds) if args.seeds else None, "rl_steps": args.rl_steps, "rl_lr": args.rl_lr,
        "group_size": args.group_size, "n_tasks": args.n_tasks, "k": args.k, "target_path_prob": args.target_path_prob,
        "label_steps": args.label_steps,
    }.items() if v is not None}  # fmt: skip
    from predict.train.tracking import TrackingSettings

    settings = SignalSettings(**overrides)
    config = _config(args)
    result = run_signal(config, Path(args.out_dir), settings, tracking=TrackingSettings.from_config(config))
    print_curves(result, console)
    console.print(f"{SANITY_NOTE}; {result['wall_s']:.0f} s; figure: {Path(args.out_dir) / 'signal.png'}")
    if not result["passed"]:  # a finding, not a failed stage: the verdicts are written (and a test asserts them)
        console.print("[red]the learning signal does not hold[/red] (verdicts.parquet)")
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="predict", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="<stage>")

    def stage(name: str, func: Callable[[argparse.Namespace], int], help: str, config: bool = True
              ) -> argparse.ArgumentParser:
        """A stage's subcommand; ``config``: it reads the study config (from one of three sources)."""
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        if config:
            source = p.add_mutually_exclusive_group(required=True)
            source.add_argument("--config", help="study config file")
            source.add_argument("--config-json", help="the same, inline")
            source.add_argument("--config-slice", help="this stage's slice of the config (JSON; what Snakemake passes)")
        return p

    p = stage("check-config", _cmd_check_config, "validate config files against config/schema.yaml", config=False)
    p.add_argument("configs", nargs="+")

    p = stage("split", _cmd_split, "read MBPP, split it with a seed, write {sft,rl,val,test}.parquet + manifest.json",
              config=False)
    p.add_argument("--mbpp", required=True, help="MBPP jsonl or parquet")
    p.add_argument("--hf-fallback", action="store_true", help="load HF mbpp/full if --mbpp does not exist")
    p.add_argument("--mbpp-sha256", default=None, help="the file must have this sha256 (config data.mbpp_sha256)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--sft", type=int, required=True)
    p.add_argument("--rl", type=int, required=True)
    p.add_argument("--test", type=int, required=True)
    p.add_argument("--out-dir", required=True)

    p = stage("verify-gold", _cmd_verify_gold, "run the gold solutions through the sandbox: the verifier report",
              config=False)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--splits", nargs="+", required=True, choices=["sft", "rl", "val"])
    p.add_argument("--timeout-s", type=float, default=3.0)
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--outcome-labels", choices=["structured", "original"], default="structured")
    p.add_argument("--require-layers", default="auto",
                   help="sandbox layers that must be active: 'auto' or a comma-separated list (verifier.isolation)")
    p.add_argument("--accept-weaker", action="store_true", help="run even if a required layer is missing (recorded)")
    p.add_argument("--out", required=True, help="per-task parquet")
    p.add_argument("--summary-out", required=True, help="counts by split and class, parquet")

    p = stage("build-tiny-model", _cmd_build_tiny_model, "build a random tiny Qwen3 with the real tokenizer",
              config=False)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--tie-word-embeddings", action="store_true", help="smaller, but see tiny_model.py on reloads")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")

    p = stage("serve", _cmd_serve, "serve a checkpoint with vLLM on 127.0.0.1 until interrupted", config=False)
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="see `predict serve -- --help`")

    p = stage("check-serving", _cmd_check_serving, "check that serving.python imports vLLM (before any serving job)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long the import may take")
    p.add_argument("--out", default=None, help="write what was checked here (json)")

    p = stage("rollout", _cmd_rollout, "roll a checkpoint out over a split's tasks into parquet (resumes)")
    p.add_argument("--tasks-file", required=True, help="split parquet from `predict split`")
    p.add_argument("--split", required=True, choices=["sft", "rl", "val", "test"])
    p.add_argument("--model", required=True, help="checkpoint folder or HF id")
    p.add_argument("--checkpoint", required=True, help="the name records carry, e.g. base")
    p.add_argument("--arm", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--n-tasks", type=int, default=None, help="first N tasks by task_id (default: all)")
    p.add_argument("--samples", type=int, default=1, help="rollouts per task")
    p.add_argument("--protocol", choices=["reactive", "predictive"], default=None, help="default: the arm's")
    p.add_argument("--variant", choices=list(VARIANTS), default="none",
                   help="protocol variant (src/predict/env/protocol.py)")
    p.add_argument("--test-cost", type=positive_int, default=None,
                   help="budget calls per python_test (default: env.test_cost)")
    p.add_argument("--max-chained-revisions", type=positive_int, default=None,
                   help="edit_on_revise: replacement patches in a row (default: env.max_chained_revisions)")
    p.add_argument("--client", choices=["eval", "train"], default="eval", help="train = record token ids")
    p.add_argument("--base-url", default=None, help="use this running endpoint instead of starting vLLM")
    p.add_argument("--out", required=True)

    p = stage("traces", _cmd_traces, "synthesize both arms' SFT traces (gold + verified mutants) into parquet")
    p.add_argument("--tasks-file", required=True, help="the sft split parquet from `predict split`")
    p.add_argument("--out-dir", required=True, help="writes {arm}.parquet for every arm and tasks.parquet")

    p = stage("run-traces", _cmd_run_traces,
              "render a run's own SFT traces (irreversible, blind: predict.runs) from its base arm's traces")
    p.add_argument("--run", required=True, help="a run whose SFT is its own (RunSpec.sft_run)")
    p.add_argument("--arm-traces", required=True, help="its base arm's traces, results/sft/traces/{arm}.parquet")
    p.add_argument("--tasks-file", required=True, help="the sft split parquet from `predict split`")
    p.add_argument("--out", required=True)

    p = stage("evaluate", _cmd_evaluate,
              "greedy pass@1 of a run/seed's checkpoints on a split, one vLLM server (evaluation settings)")
    p.add_argument("--run", required=True, help="an arm (A, B) or an ablation (alpha0, forced_keep, ...)")
    p.add_argument("--split", required=True, choices=["val", "test"])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--tasks-file", required=True, help="split parquet from `predict split`")
    p.add_argument("--checkpoint", action="append", required=True,
                   help="base, sft or step<N>; repeat with --model and --out for each checkpoint, in order")
    p.add_argument("--model", action="append", required=True, help="checkpoint folder or HF id (per --checkpoint)")
    p.add_argument("--out", action="append", required=True, help="its parquet (per --checkpoint)")
    p.add_argument("--base-url", default=None, help="use this running endpoint instead of starting vLLM")
    p.add_argument("--test-ledger", default=None,
                   help="test only: the campaign ledger (default: the checkout's, .test-campaigns/ledger.jsonl)")
    p.add_argument("--selection", default=None, help="test only: selection.parquet from `predict stats` on val")
    p.add_argument("--val-metrics", default=None, help="test only: metrics.parquet from `predict stats` on val")
    p.add_argument("--new-campaign", default=None, metavar="WHY",
                   help="test only: declare a second campaign on this split and base model, and why (config "
                        "evaluation.new_campaign); the report lists every campaign with its reason")

    p = stage("stats", _cmd_stats, "pass@1, paired tests, mechanism metrics and selection from evaluations")
    p.add_argument("--eval", nargs="+", required=True, help=".../{run}/{checkpoint}/{split}/seed{seed}.parquet")
    p.add_argument("--out-dir", required=True,
                   help="writes predict.stats.STATS_TABLES (val) or TEST_STATS_TABLES (test) as {name}.parquet")
    p.add_argument("--selection", default=None,
                   help="test evaluations only: the val statistics' selection.parquet (the checkpoints compared)")
    p.add_argument("--test-ledger", default=None,
                   help="test evaluations only: the campaign ledger they are held against (default: the checkout's)")

    p = stage("ablations", _cmd_run_table, "one ablation's table: a row per seed vs its base arm")
    p.add_argument("--ablation", required=True)
    p.add_argument("--eval", nargs="+", required=True, help="val evaluations of the ablation, its base arm and A")
    p.add_argument("--out", required=True)

    p = stage("extensions", _cmd_run_table, "one extension's table: a row per seed vs Arm A and Arm B + mechanism")
    p.add_argument("--extension", required=True)
    p.add_argument("--eval", nargs="+", required=True, help="val evaluations of the extension, A, B, counterpart")
    p.add_argument("--out", required=True)

    p = stage("open-question", _cmd_open_question,
              "the open question: Arm B vs Arm A within each environment (study, expensive, irreversible, blind)")
    p.add_argument("--eval", nargs="*", default=[], help="val evaluations of every environment's two runs")
    p.add_argument("--out", required=True, help="results/extensions/open_question.parquet")

    p = stage("power", _cmd_power,
              "exact power of one seed pairing (exact McNemar) per difference, discordance and number of tasks")
    p.add_argument("--pairs", default=None, help="pairs.parquet: adds the observed A vs B discordance rates")
    p.add_argument("--open-question-family", type=int, default=0,
                   help="tests in the open question's Holm family (predict.stats.open_question.family_size); 0: none")
    p.add_argument("--out", required=True)

    p = stage("training-outcomes", _cmd_training_outcomes,
              "per predictive run and seed, over all RL steps: verified vs predicted class counts and shares",
              config=False)
    p.add_argument("--rl-metrics", nargs="*", default=[], help="results/rl/{run}/seed{seed}/metrics.parquet")
    p.add_argument("--out", required=True, help="results/stats/training_outcomes.parquet")

    p = stage("report", _cmd_report, "the study report: one self-contained HTML page from parquet")
    p.add_argument("--stats-dir", required=True, help="the val statistics (results/stats/)")
    p.add_argument("--test-stats", default=None,
                   help="the test statistics (results/test/stats/): the report then opens with the test")
    p.add_argument("--training-outcomes", default=None, help="results/stats/training_outcomes.parquet")
    p.add_argument("--ablations", nargs="*", default=[])
    p.add_argument("--extensions", nargs="*", default=[], help="results/extensions/{name}.parquet")
    p.add_argument("--open-question", default=None, help="results/extensions/open_question.parquet (val)")
    p.add_argument("--power", required=True)
    p.add_argument("--example", default=None, help="an evaluation parquet to render one rollout from")
    p.add_argument("--rl-metrics", nargs="*", default=[], help="results/rl/{run}/seed{seed}/metrics.parquet")
    p.add_argument("--tasks-file", default=None, help="the example's split parquet, for the task text")
    p.add_argument("--out", required=True)
    for name, summary, run_help, init_help in (
        ("rl", "RL (GRPO) of one run and seed on the rl split: step checkpoints + metrics (resumes)",
         "an arm (A, B) or an ablation (alpha0, forced_keep, ...)", "starting checkpoint: the run's SFT folder"),
        ("rft", "rejection-sampling fine-tuning of one RFT extension run and seed (resumes)",
         "an extension with trainer rft (rft_A, rft_B)", "the run's SFT folder (sampled from, fine-tuned)"),
    ):
        p = stage(name, _cmd_train_run, summary)
        p.add_argument("--run", required=True, help=run_help)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--init", required=True, help=init_help)
        p.add_argument("--tasks-file", required=True, help="the rl split parquet")
        p.add_argument("--out-dir", required=True, help="results/rl/<run>/seed<seed>")
        p.add_argument("--base-url", default=None, help="roll out against this endpoint (no weight sync; tests)")

    p = stage("sft", _cmd_sft, "supervised fine-tuning on rendered traces -> an HF checkpoint (resumes after a kill)")
    p.add_argument("--arm", required=True)
    p.add_argument("--traces", required=True, help="traces parquet with a messages column")
    p.add_argument("--base-model", required=True, help="checkpoint folder or HF id to start from")
    p.add_argument("--out-dir", required=True, help="the HF checkpoint folder written at the end")
    p.add_argument("--metrics-out", required=True, help="per-step loss log (parquet)")
    p.add_argument("--state-dir", required=True, help="resumable trainer state (removed when done)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps (smoke tests)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (the rule's threads:); default all")
    p = stage("signal", _cmd_signal, "the learning-signal run: RL visibly raises reward, CE teaches the label")
    p.add_argument("--out-dir", required=True, help="curves.parquet, verdicts.parquet, signal.png and the runs")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="Arm A seeds (default 1 2)")
    p.add_argument("--rl-steps", type=int, default=None, help="Arm A's RL steps")
    p.add_argument("--label-steps", type=int, default=None, help="Arm B's RL steps (alpha 1 and alpha 0)")
    p.add_argument("--rl-lr", type=float, default=None)
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--n-tasks", type=int, default=None)
    p.add_argument("--k", type=int, default=None, help="steps averaged at each end of the reward curve")
    p.add_argument("--target-path-prob", type=float, default=None,
                   help="SFT stops when the gold trace or the faulty prefix is sampled with this probability")

    p = stage("prime-rl-setup", _cmd_prime_rl_setup,
              "clone prime-rl at the pinned commit, register PredictAlgorithm, uv sync", config=False)
    p.add_argument("--repo", required=True, help="URL or local clone of prime-rl")
    p.add_argument("--commit", required=True, help="40-hex commit (config prime_rl.commit)")
    p.add_argument("--dir", required=True, help="where the checkout and its .venv live")
    p.add_argument("--python", default="3.12")
    p.add_argument("--patch", default=None, help="default: workflow/prime-rl/predict-algorithm.patch")
    p.add_argument("--extra", action="append", default=[], help="prime-rl extra for uv sync (repeatable)")
    p.add_argument("--out", required=True, help="setup.json")

    p = stage("prime-rl-config", _cmd_prime_rl_config, "render a prime-rl rl/sft TOML (and the SFT dataset)")
    p.add_argument("kind", choices=["rl", "sft"])
    p.add_argument("--model", required=True, help="start checkpoint: folder or HF id")
    p.add_argument("--output-dir", required=True, help="prime-rl's output_dir")
    p.add_argument("--out", required=True, help="the TOML to write")
    p.add_argument("--run", help="rl: an arm or an ablation (alpha0, forced_keep, budget_neutral)")
    p.add_argument("--seed", type=int, help="rl")
    p.add_argument("--tasks-file", help="rl: the rl split parquet")
    p.add_argument("--arm", help="sft")
    p.add_argument("--traces", help="sft: results/sft/traces/{arm}.parquet (column messages)")
    p.add_argument("--dataset-dir", help="sft: where to write the messages dataset")

    p = stage("prime-rl-train", _cmd_prime_rl_train, "run prime-rl rl/sft on a rendered TOML, collect checkpoints",
              config=False)
    p.add_argument("kind", choices=["rl", "sft"])
    p.add_argument("--toml", required=True)
    p.add_argument("--dir", required=True, help="the prime-rl checkout (prime-rl-setup --dir)")
    p.add_argument("--run-dir", help="rl: results/rl/{run}/seed{seed}: steps land in step{N}/")
    p.add_argument("--checkpoints-out", help="rl: checkpoints.json")
    p.add_argument("--checkpoint", help="sft: results/checkpoints/{arm}/sft")
    p.add_argument("--tensorboard-dir", default=None,
                   help="rl: mirror the collected metrics into this TensorBoard root (results/tensorboard)")
    p.add_argument("--metrics-out", help="rl: the per-step metrics table; sft: prime-rl's metrics as parquet "
                   "(default: next to --run-dir / the TOML)")
    p.add_argument("--raw-metrics-out", help="rl: prime-rl's metrics as a long table (default: "
                   "<run-dir>/prime-rl-metrics.parquet)")
    p.add_argument("--run", help="rl: the run (default: the --run-dir's parent folder's name)")
    p.add_argument("--seed", type=int, help="rl: the seed (default: from the --run-dir's name, seed<N>)")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(words)
    if args.stage == "serve":
        # serve_main parses everything after the word itself: argparse's REMAINDER refuses a leading --option
        # (`predict serve --stop-shared` failed with "unrecognized arguments").
        args.serve_args = words[words.index("serve") + 1 :]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError, SplitGuardError, ResultsDirError) as e:
        # Bad input is the user's to fix: one clear line, no traceback.
        # soft_wrap: the message stays one line (paths and row numbers intact), escape: brackets are not markup
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2
    except VLLMServerError as e:
        # The server's own log tail is in the message; a Python traceback would only bury it.
        console.print(f"[red]vLLM server failed:[/red] {escape(str(e))}", soft_wrap=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())

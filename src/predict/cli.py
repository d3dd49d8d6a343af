"""`predict <stage>`: the one command line of the pipeline. Each Snakemake rule calls exactly one stage.

Stages take explicit paths and values (the rule passes them from the config), so they also run
by hand outside Snakemake, and every stage's output is a parquet file written atomically.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from predict.config import ConfigError, config_from_json, load_config
from predict.evaluate import SplitGuardError
from predict.serve import VLLMServerError

log = logging.getLogger("predict")
console = Console(stderr=True)


def _cmd_check_config(args: argparse.Namespace) -> int:
    for path in args.configs:
        load_config(path)
        console.print(f"[green]ok[/green] {path}")
    return 0


def _cmd_split(args: argparse.Namespace) -> int:
    from predict.data import file_sha256, load_mbpp, split_tasks, write_split

    source = Path(args.mbpp)
    rows = load_mbpp(source, hf_fallback=args.hf_fallback)
    splits = split_tasks(rows, args.seed, {"sft": args.sft, "rl": args.rl, "test": args.test})
    manifest = write_split(
        splits,
        args.out_dir,
        seed=args.seed,
        source=str(source) if source.exists() else "hf:mbpp/full",
        source_sha256=file_sha256(source) if source.exists() else None,
    )
    table = Table("split", "tasks", "content sha256", title=f"MBPP split (seed {args.seed})")
    for name, entry in manifest["splits"].items():
        table.add_row(name, str(entry["count"]), entry["content_sha256"][:16])
    console.print(table)
    return 0


def _cmd_verify_gold(args: argparse.Namespace) -> int:
    from predict.gold import check_gold, summarize, write_gold_report

    rows = check_gold(
        args.data_dir,
        args.splits,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        workers=args.workers,
        outcome_labels=args.outcome_labels,
    )
    write_gold_report(rows, args.out, args.summary_out)
    table = Table("split", "outcome", "gold solutions", title="Verifier report: gold solutions by class")
    for entry in summarize(rows):
        if entry["count"]:
            table.add_row(entry["split"], entry["outcome"], str(entry["count"]))
    console.print(table)
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
    from predict.serve import serve_main

    return serve_main(args.serve_args)


def _cmd_check_serving(args: argparse.Namespace) -> int:
    from predict.io import write_json
    from predict.serving_check import check_serving_python

    config = load_config(args.config) if args.config else config_from_json(args.config_json)
    serving = config["serving"]
    result = check_serving_python(serving.get("python"), serving["device"], timeout_s=args.timeout_s)
    if args.out:
        write_json(result, args.out)
    console.print(
        f"[green]ok[/green] serving.python ({result['serving.python']}) = {result['interpreter']}: "
        f"vllm {result['vllm_version']} imports ({result['import_s']:.1f} s)"
    )
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    from predict.evaluate import RolloutJob, run_job

    config = load_config(args.config) if args.config else config_from_json(args.config_json)
    job = RolloutJob(
        tasks_path=Path(args.tasks),
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
        test_ledger=Path(args.test_ledger) if args.test_ledger else None,
    )
    if args.arm not in config["arms"]:
        raise ConfigError(f"{args.config or 'config'}: arms: no arm {args.arm!r} (have {', '.join(config['arms'])})")
    summary = run_job(job, config)
    table = Table("measure", "value", title=f"rollouts: arm {job.arm}, {job.checkpoint}, {job.split}, seed {job.seed}")
    for key, value in summary.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="predict", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="<stage>")

    def stage(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    p = stage("check-config", _cmd_check_config, "validate config files against config/schema.yaml")
    p.add_argument("configs", nargs="+")

    p = stage("split", _cmd_split, "read MBPP, split it with a seed, write {sft,rl,val,test}.parquet + manifest.json")
    p.add_argument("--mbpp", required=True, help="MBPP jsonl or parquet")
    p.add_argument("--hf-fallback", action="store_true", help="load HF mbpp/full if --mbpp does not exist")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--sft", type=int, required=True)
    p.add_argument("--rl", type=int, required=True)
    p.add_argument("--test", type=int, required=True)
    p.add_argument("--out-dir", required=True)

    p = stage("verify-gold", _cmd_verify_gold, "run the gold solutions through the sandbox: the verifier report")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--splits", nargs="+", required=True, choices=["sft", "rl", "val"])
    p.add_argument("--timeout-s", type=float, default=3.0)
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--outcome-labels", choices=["structured", "original"], default="structured")
    p.add_argument("--out", required=True, help="per-task parquet")
    p.add_argument("--summary-out", required=True, help="counts by split and class, parquet")

    p = stage("build-tiny-model", _cmd_build_tiny_model, "build a random tiny Qwen3 with the real tokenizer")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--tie-word-embeddings", action="store_true", help="smaller, but see tiny_model.py on reloads")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")

    p = stage("serve", _cmd_serve, "serve a checkpoint with vLLM on 127.0.0.1 until interrupted")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="see `predict serve -- --help`")

    p = stage("check-serving", _cmd_check_serving, "check that serving.python imports vLLM (before any serving job)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="study config file")
    source.add_argument("--config-json", help="the same, inline (Snakemake passes its merged config)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long the import may take")
    p.add_argument("--out", default=None, help="write what was checked here (json)")

    p = stage("rollout", _cmd_rollout, "roll a checkpoint out over a split's tasks into parquet (resumes)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="study config file (env, verifier, serving sections)")
    source.add_argument("--config-json", help="the same, inline (Snakemake passes its merged config)")
    p.add_argument("--tasks", required=True, help="split parquet from `predict split`")
    p.add_argument("--split", required=True, choices=["sft", "rl", "val", "test"])
    p.add_argument("--model", required=True, help="checkpoint folder or HF id")
    p.add_argument("--checkpoint", required=True, help="the name records carry, e.g. base")
    p.add_argument("--arm", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--n-tasks", type=int, default=None, help="first N tasks by task_id (default: all)")
    p.add_argument("--samples", type=int, default=1, help="rollouts per task")
    p.add_argument("--protocol", choices=["reactive", "predictive"], default=None, help="default: the arm's")
    p.add_argument("--variant", choices=["none", "forced_keep", "budget_neutral"], default="none")
    p.add_argument("--client", choices=["eval", "train"], default="eval", help="train = record token ids")
    p.add_argument("--base-url", default=None, help="use this running endpoint instead of starting vLLM")
    p.add_argument("--test-ledger", default=None, help="only for the evaluate_test target")
    p.add_argument("--out", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError, SplitGuardError) as e:
        # Bad input is the user's to fix: one clear line, no traceback.
        console.print(f"[red]error:[/red] {e}")
        return 2
    except VLLMServerError as e:
        # The server's own log tail is in the message; a Python traceback would only bury it.
        console.print(f"[red]vLLM server failed:[/red] {e}")
        return 3


if __name__ == "__main__":
    sys.exit(main())

"""`predict <stage>`: the one command line of the pipeline. Each Snakemake rule calls exactly one stage.

Every stage reads its slice of the study config (--config, --config-json or --config-slice, cut to what the stage
table lists) and takes only paths and run choices as flags, so it also runs by hand outside Snakemake; every
stage's output is written atomically.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from rich.logging import RichHandler
from rich.markup import escape

from predict.config import ConfigError, config_from_json, load_config, load_config_slice, merge_config_files
from predict.fingerprint import ResultsDirError, claim_results_dir
from predict.outputs import console
from predict.rollouts import SplitGuardError
from predict.serving.server import VLLMServerError
from predict.stages import STAGES, StageSettings, stage_settings

# The arguments through which a stage writes (a scratch folder outside results_dir claims nothing).
OUTPUT_ARGS = ("out", "out_dir", "metrics_out", "state_dir", "output_dir", "dataset_dir")


def _config(args: argparse.Namespace) -> StageSettings:
    """The stage's typed object (predict.stages.stage_settings) of its slice: whole config files (--config,
    --config-json) are cut to the slice too, so a stage reads only what the stage table lists, however it is run.
    Then, before anything is written: the test split's seal (`predict.campaign.seal.seal_stage`: the stage's task files hold no test task). A stage run
    with a whole config refuses a results_dir that another run_name made (`predict.fingerprint.claim_results_dir`;
    under Snakemake the workflow's onstart checks it once, since a slice holds neither name nor folder)."""
    from predict.campaign import seal_stage

    if getattr(args, "config_slice", None):
        config, whole = load_config_slice(args.config_slice), False
    else:
        config = load_config(args.config) if getattr(args, "config", None) else config_from_json(args.config_json)
        whole = True
    # the test campaign's ledger records the frozen design (the whole config): a stage table entry of its own
    stage = "evaluate-test" if args.stage == "evaluate" and getattr(args, "split", None) == "test" else args.stage
    typed = stage_settings(stage, config, source=f"stage {stage!r}")
    seal_stage(STAGES[stage], args, typed)  # before the results folder is claimed or anything else written
    if whole:
        outputs = [getattr(args, name, None) for name in OUTPUT_ARGS]
        claim_results_dir(config, [p for o in outputs for p in (o if isinstance(o, list) else [o]) if p])
    return typed


def _check_config(args: argparse.Namespace) -> int:
    for spec in args.configs:
        if "+" not in spec:
            load_config(spec)
        else:  # files read in turn, each over the ones before, as Snakemake merges a profile's configfile list
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump(merge_config_files(*map(Path, spec.split("+"))), f)
            try:
                load_config(f.name)
            except ConfigError as e:
                raise ConfigError(str(e).replace(f.name, spec)) from None
            finally:
                os.unlink(f.name)
        console.print(f"[green]ok[/green] {spec}")
    return 0


def _config_schema(args: argparse.Namespace) -> int:
    from predict.config.schema import write_schema

    return write_schema(check=args.check)


def _serve(args: argparse.Namespace) -> int:
    from predict.serving.stage import serve_main

    return serve_main(args.serve_args)


def _verify_bundle(args: argparse.Namespace) -> int:
    from predict.bundle.verify import main as verify_main

    return verify_main(args)


def _plan(args: argparse.Namespace) -> int:
    from predict.plan.command import main as plan_main

    return plan_main(args)


def _stage_command(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[..., int]]:
    """The stage's `arguments` and `main`, from the module its stage table entry names (imported only when run)."""
    module, arguments, main = STAGES[name].command_functions()
    loaded = importlib.import_module(module)
    return getattr(loaded, arguments), getattr(loaded, main)


def _run_stage(args: argparse.Namespace) -> int:
    from predict.plan.limits import watch_planned
    from predict.serving.gpu_memory import watch_gpu_memory

    # on a GPU node the job's log ends with its peak GPU memory; under Snakemake a job that outlives its plan by more
    # than the margin says so in its log (predict.plan.limits)
    with watch_gpu_memory(), watch_planned(args.planned, name=f"predict {args.stage}"):
        return args.stage_main(args, _config(args))


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Every command, from the stage table; only the stage named in ``words`` (all of them when None) gets its
    flags, so `predict --help` and `predict <stage>` import no other stage's module."""
    parser = argparse.ArgumentParser(prog="predict", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="<stage>")

    p = sub.add_parser("check-config", help="validate config files against the config models (predict.config.models)")
    p.add_argument("configs", nargs="+", help="a file, or files joined by + read in turn (a profile's list)")
    p.set_defaults(func=_check_config)
    p = sub.add_parser("config-schema", help="write config/schema.yaml from the config models (--check: is it current)")
    p.add_argument("--check", action="store_true", help="exit 1 when config/schema.yaml is not current")
    p.set_defaults(func=_config_schema)
    p = sub.add_parser("serve", help="serve a checkpoint with vLLM on 127.0.0.1 until interrupted")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="see `predict serve -- --help`")
    p.set_defaults(func=_serve)

    named = set(STAGES) if words is None else {next((w for w in words if not w.startswith("-")), "")}
    p = sub.add_parser("verify-bundle", help="check a study bundle without the cluster: its files, the split, the "
                       "ledger, every statistic and the report's numbers (docs/verify.md)")
    if words is None or "verify-bundle" in named:
        from predict.bundle.verify import arguments as verify_arguments

        verify_arguments(p)
        p.set_defaults(func=_verify_bundle)
    p = sub.add_parser("plan", help="what the study costs before it runs: GPU-hours, wall time, memory and disk per "
                       "job and in total, from Snakemake's dry-run and a device kind's calibration (docs/plan.md)")
    if words is None or "plan" in named:
        from predict.plan.command import arguments as plan_arguments

        plan_arguments(p)
        p.set_defaults(func=_plan)
    for stage in STAGES.values():
        if stage.command is None:
            continue
        p = sub.add_parser(stage.name, help=stage.help, description=stage.help)
        if stage.name not in named:
            continue
        source = p.add_mutually_exclusive_group(required=True)  # every stage reads its slice of the config
        source.add_argument("--config", help="study config file")
        source.add_argument("--config-json", help="the same, inline")
        source.add_argument("--config-slice", help="this stage's slice of the config (JSON; what Snakemake passes)")
        p.add_argument("--planned", default=None, metavar="SECONDS",
                       help="the job's planned time (Snakemake passes it): a warning once it runs past it x the margin")
        arguments, main = _stage_command(stage.name)
        arguments(p)
        p.set_defaults(func=_run_stage, stage_main=main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
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

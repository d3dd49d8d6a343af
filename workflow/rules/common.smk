# Shared by all the rules files: config validation, paths, and how jobs reach the `predict` CLI.
import json
import os
import sys
from pathlib import Path

from predict.config import ConfigError, validate_config

try:
    validate_config(config, source=", ".join(map(str, workflow.overwrite_configfiles or workflow.configfiles)))
except ConfigError as e:
    raise WorkflowError(f"invalid config: {e}") from None

RESULTS = Path(config["results_dir"])


envvars:
    "PATH",


# Jobs run `predict`; put the interpreter that runs Snakemake first on PATH so a virtualenv that was
# not activated still provides it (a rule's `conda:` env, where used, takes precedence).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def R(*parts):
    """A path under the configured results folder."""
    return str(RESULTS.joinpath(*parts))


def LOG(stage, *wildcards):
    return str(Path("logs", config["run_name"], stage, *wildcards)) + ".log"


def BENCH(stage, *wildcards):
    return str(RESULTS.joinpath("benchmarks", stage, *wildcards)) + ".tsv"


# The effective config (files and --config overrides merged) travels to stages as JSON, so what a
# stage sees is exactly what Snakemake validated, and a change to it reruns the affected jobs.
CONFIG_JSON = json.dumps(config, sort_keys=True)
TINY = {"seed": 0, "hidden_size": 64, "num_layers": 2, **config["model"].get("tiny", {})}
N_TASKS_ARG = f"--n-tasks {config['env']['rollout_tasks']}" if config["env"].get("rollout_tasks") else ""

# GPU jobs ask SLURM for one GPU. Every job that starts a vLLM server also takes one `vllm_server`
# slot, so a profile can cap how many servers share a machine (the local profile allows one).
SERVING_RESOURCES = (
    {"gpu": 1, "mem_mb": 64000, "runtime": 240, "cpus_per_task": 8, "vllm_server": 1}
    if config["serving"]["device"] == "gpu"
    else {"mem_mb": 8000, "runtime": 120, "vllm_server": 1}
)


def isolation_args(config):
    """`predict verify-gold` flags for config verifier.isolation (rollouts read it from the config they are given)."""
    iso = config["verifier"].get("isolation", {})
    require = iso.get("require", "auto")
    flags = f"--require-layers {require if isinstance(require, str) else ','.join(require)}"
    return flags + (" --accept-weaker" if iso.get("accept_weaker") else "")


def base_model_path():
    return R("models", "tiny") if config["model"]["base"] == "tiny" else config["model"]["base"]


def checkpoint_model(wildcards):
    """The folder or HF id vLLM serves for a checkpoint name (later stages add sft/rl checkpoints)."""
    if wildcards.checkpoint == "base":
        return base_model_path()
    raise WorkflowError(f"unknown checkpoint {wildcards.checkpoint!r}")


def checkpoint_inputs(wildcards):
    """Files a checkpoint depends on: the tiny model folder when it is built here, else nothing."""
    model = checkpoint_model(wildcards)
    return [model] if model == R("models", "tiny") else []


def ROLLOUTS(split, checkpoint="base"):
    return expand(
        R("rollouts", "{arm}", checkpoint, split, "seed{seed}.parquet"), arm=sorted(config["arms"]), seed=config["seeds"]
    )

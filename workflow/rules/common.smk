# Shared by all the rules files: config validation, paths, and how jobs reach the `predict` CLI.
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

"""Dump what the stages see of config/config.yaml and config/local.yaml: the README stage table, every stage's
config_slice and slice_params, and the RESUME_KEYS fingerprint digests (predict.fingerprint). Run it on two
checkouts (PYTHONPATH=<checkout>/src) and diff the outputs to see which keys a change touched:

    PYTHONPATH=src python benchmarks/config_views_dump.py > /tmp/views.json
"""

from __future__ import annotations

import json
import sys

from predict.config import REPO_ROOT, load_config
from predict.fingerprint import RESUME_KEYS, fingerprint
from predict.stages import STAGES, config_slice, readme_table, slice_params


def views(name: str) -> dict:
    config = load_config(REPO_ROOT / "config" / name)
    return {
        "slices": {stage: config_slice(config, stage) for stage in STAGES},
        "params": {stage: slice_params(config, stage) for stage in STAGES},
        "fingerprints": {stage: fingerprint(config, keys, inputs={}, seed=0).digest for stage, keys in RESUME_KEYS.items()},
    }


def main() -> None:
    out = {"readme_table": readme_table().splitlines(), **{name: views(name) for name in ("config.yaml", "local.yaml")}}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

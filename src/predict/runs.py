"""The study's runs: every arm, and every ablation (its base arm with one factor changed). The one place a run name
becomes what it trains and how it rolls out; RL, evaluation, statistics and the workflow all ask here.

Rules:

* A run named like an arm (``A``, ``B``) is that arm: its protocol, variant ``none``, its ``alpha`` (predictive
  arms only; 0 for a reactive arm).
* An ablation (config ``ablations: {name: {base_arm, variant, alpha}}``) is its ``base_arm`` (default: the
  predictive arm) with ``variant`` (default ``none``) and ``alpha`` (default: the base arm's) replaced. Its SFT
  checkpoint is its base arm's.
* Run order: the arms sorted, then the ablations in config order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from predict.config import ConfigError


@dataclass(frozen=True)
class RunSpec:
    """What one run trains and how it rolls out: the arm's protocol, the environment variant and the CE weight."""

    run: str
    arm: str
    protocol: str
    variant: str
    alpha: float

    @property
    def predictive(self) -> bool:
        return self.protocol == "predictive"


def predictive_arm(config: Mapping[str, Any]) -> str:
    arms = [a for a, spec in sorted(config["arms"].items()) if spec["protocol"] == "predictive"]
    if not arms:
        raise ConfigError("arms: ablations need a predictive arm, there is none")
    return arms[0]


def study_runs(config: Mapping[str, Any]) -> list[str]:
    """Every run of the matrix: the arms, then the ablations."""
    return sorted(config["arms"]) + list(config.get("ablations") or {})


def resolve_run(config: Mapping[str, Any], run: str) -> RunSpec:
    arms, ablations = config["arms"], config.get("ablations") or {}
    if run in arms:
        arm, over = run, {}
    elif run in ablations:
        over = dict(ablations[run] or {})
        arm = over.get("base_arm") or predictive_arm(config)
        if arm not in arms:
            raise ConfigError(f"ablations.{run}.base_arm: no arm {arm!r} (have {', '.join(arms)})")
    else:
        known = [*arms, *ablations]
        raise ConfigError(f"run {run!r} is neither an arm nor an ablation (have {', '.join(known)})")
    protocol = arms[arm]["protocol"]
    alpha = float(over.get("alpha", arms[arm].get("alpha", 0.0))) if protocol == "predictive" else 0.0
    return RunSpec(run=run, arm=arm, protocol=protocol, variant=over.get("variant", "none"), alpha=alpha)

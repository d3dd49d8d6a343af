"""What the statistics commands (`predict stats`, `ablations`, `extensions`, `open-question`) read from their config
slice: the bootstrap settings and the checkpoint selection over val evaluations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predict.stages import StageSettings


def bootstrap_settings(config: StageSettings) -> dict[str, Any]:
    """resamples, seed and ci of config evaluation.bootstrap, as keyword arguments."""
    return config.evaluation.bootstrap.model_dump()


def val_selection(config: StageSettings, evals: Iterable[Any]) -> Any:
    """The checkpoint selection (`predict.campaign.selection.select`, config evaluation.selection) over these val
    evaluations: the same function `predict stats` writes selection.parquet with. (Not that file: it needs every run's
    evaluations, and one ablation's or extension's table builds only what it compares.)"""
    from predict.campaign import select
    from predict.stats.metrics import mechanism_metrics

    return select(config, [{"run": ev.run, "checkpoint": ev.checkpoint, "split": ev.split, "seed": ev.seed,
                            **mechanism_metrics(ev.rows)} for ev in evals])


def run_evaluations(runs: Mapping[str, Any], section: str, name: str, paths: Iterable[str]) -> list[Any]:
    """The val evaluations of one ablation's or extension's table (read once: for the selection and the table),
    after checking that `runs` (the config's `section`: ablations or extensions) has the run `name`."""
    from predict.config import ConfigError
    from predict.stats.pairs import load_evaluations

    if name not in runs:
        raise ConfigError(f"{section}: no {section[:-1]} {name!r} (have {', '.join(runs) or 'none'})")
    return list(load_evaluations(paths).values())

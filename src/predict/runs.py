"""The study's runs: every arm, every ablation and every extension (each its base arm with some factors changed).
The one place a run name becomes what it trains and how it rolls out; RL, RFT, evaluation, statistics and the
workflow all ask here.

Rules:

* A run named like an arm (``A``, ``B``) is that arm: its protocol, variant ``none``, its ``alpha`` (predictive
  arms only; 0 for a reactive arm), ``env.test_cost``, ``rl.mask_decision``, trainer ``rl``.
* An ablation (config ``ablations: {name: {base_arm, variant, alpha}}``) is its ``base_arm`` (default ``B``;
  defaults: predict.config.models) with ``variant`` (default ``none``) and ``alpha`` (default: the base arm's)
  replaced.
* An extension (config ``extensions: {name: {base_arm, variant, alpha, test_cost, mask_decision, trainer, sft}}``,
  issue #11) is the same overlay with the environment's ``test_cost`` (budget calls per python_test), the RL
  ``mask_decision`` switch (Arm B's DECISION tokens out of RL credit), the ``trainer`` (``rl``: GRPO, the
  ``rl`` stage; ``rft``: rejection-sampling fine-tuning, the ``rft`` stage) and ``sft`` (below) replaced. Keys
  left out keep the base arm's values. ``kind`` tells the two overlays apart (``arm``, ``ablation``,
  ``extension``).
* Variants: the predictive ones (`predict.vocabulary.PREDICTIVE_VARIANTS`: forced_keep, budget_neutral, edit_on_revise)
  need a predictive base arm; the environment ones (`predict.vocabulary.ENVIRONMENT_VARIANTS`: irreversible, blind) take
  either arm, so ``irreversible_A``/``irreversible_B`` and ``blind_A``/``blind_B`` are one environment under both
  protocols (statistics pair runs of one ``variant`` and ``test_cost`` across base arms). A run has one variant.
* SFT (``RunSpec.sft_run``, the run whose SFT checkpoint ``checkpoints/{sft_run}/sft`` the run starts from; the
  workflow asks only this): the base arm's, unless the run trains from its own (extension key ``sft: own``; the
  default for the environment variants, whose SFT traces take other actions than the base arm's: a blind trace
  never calls python_test, an irreversible one tests once, at the end). A run with its own SFT gets its own traces,
  ``sft/traces/{run}.parquet``, rendered from its base arm's under its own protocol (`predict.traces.stage`).
  ``sft: own`` needs a variant whose traces render (`predict.vocabulary.TRACE_VARIANTS`); ``sft: base`` keeps the
  base arm's SFT whatever the variant (config/local.yaml does, to keep the local run short).
* An environment (`environments`, the open question of issue 28) is one (variant, test_cost) played by both
  protocols: the reactive and the predictive run that share it and change nothing else (trainer ``rl``, the
  default ``rl.mask_decision``, their arm's alpha; ablations never). The study's own is ``study`` (arms A and B);
  ``expensive`` is a test_cost other than ``env.test_cost``; any other is named by its variant (``irreversible``,
  ``blind``; a variant at a raised cost: ``irreversible+expensive``). Two runs of one protocol in one environment
  are refused, naming both. An environment run's counterpart (`extension_counterpart`) is the other protocol's run.
* Run order: the arms sorted, then the ablations, then the extensions, each in config order. A name may appear
  once across arms, ablations and extensions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predict.config import ConfigError
from predict.config.models import ExtensionSettings
from predict.stages import CHECKPOINTS_VIEW, RUN_NAMES_VIEW, RUNS_VIEW, StageSettings, stage_settings
from predict.vocabulary import ENVIRONMENT_VARIANTS, PREDICTIVE_VARIANTS, TRACE_VARIANTS


@dataclass(frozen=True)
class RunSpec:
    """What one run trains and how it rolls out: the arm's protocol, the environment variant, the CE weight, the
    cost of a test, the decision mask, the trainer and the run whose SFT checkpoint it starts from."""

    run: str
    arm: str
    protocol: str
    variant: str
    alpha: float
    test_cost: int
    mask_decision: bool
    trainer: str
    kind: str = "arm"
    sft_run: str = ""
    """The run whose SFT checkpoint this run starts from: its base arm, or itself (its own traces); "" = the arm."""

    def __post_init__(self) -> None:
        if not self.sft_run:
            object.__setattr__(self, "sft_run", self.arm)

    @property
    def predictive(self) -> bool:
        return self.protocol == "predictive"

    @property
    def own_sft(self) -> bool:
        """Whether the run trains from its own SFT (its own traces) rather than its base arm's."""
        return self.sft_run == self.run != self.arm

    def env(self, config: StageSettings) -> StageSettings:
        """The typed config (a stage's object) with this run's environment knobs (``env.test_cost``) in place."""
        return with_env(config, test_cost=self.test_cost)


def run_matrix(config: Mapping[str, Any] | StageSettings) -> StageSettings:
    """The run matrix (`predict.stages.RUN_MATRIX`) as typed objects: a stage's own object as it is (every stage that
    resolves runs lists the matrix), a config mapping (the workflow's, a test's) read through the matrix's keys."""
    if isinstance(config, StageSettings):
        return config
    return stage_settings(RUNS_VIEW, config)


def with_env(config: StageSettings, **values: Any) -> StageSettings:
    """The typed config (a stage's object, whose row gives ``env``) with these ``env`` keys replaced, its env a copy
    with the keys replaced; a value None or equal to the config's keeps it (the config itself is returned when
    nothing changes)."""
    changed = {key: value for key, value in values.items() if value is not None and getattr(config.env, key) != value}
    return config.model_copy(update={"env": config.env.model_copy(update=changed)}) if changed else config


def checkpoint_steps(steps: int, every: int) -> list[int]:
    """Steps whose weights an RL or RFT run keeps as HF checkpoints (``step{N}/``, every backend): every
    ``rl.checkpoint_every`` steps (`every`) and the last of ``rl.steps``."""
    return sorted({*range(every, steps + 1, every), steps})


def checkpoint_path(config: Mapping[str, Any] | StageSettings, results_dir: str | Path, run: str, checkpoint: str,
                    seed: int) -> str:
    """The folder (under `results_dir`) or HF id vLLM serves for a run's checkpoint: ``base`` (``model.base``: the
    embedded default's tiny model, ``models/tiny``, else its HF id), ``sft`` (the run's SFT, `RunSpec.sft_run`: its
    arm's, shared by its ablations, or its own) or ``step<N>`` (the run's RL checkpoint for that seed). The one place
    checkpoint names become paths: the workflow (common.smk's checkpoint_model) and the bundle ask here."""
    results = Path(results_dir)
    if checkpoint == "base":
        base = (config if isinstance(config, StageSettings) else stage_settings(CHECKPOINTS_VIEW, config)).model.base
        return str(results / "models" / "tiny") if base == "tiny" else base
    if checkpoint == "sft":
        return str(results / "checkpoints" / resolve_run(config, run).sft_run / "sft")
    if re.fullmatch(r"step\d+", checkpoint):
        return str(results / "rl" / run / f"seed{seed}" / checkpoint)
    raise ConfigError(f"unknown checkpoint {checkpoint!r} (base, sft or step<N>)")


def default_mask_decision(config: Mapping[str, Any] | StageSettings) -> bool:
    """rl.mask_decision: the config's, or its default where the config has no `rl` section."""
    return run_matrix(config).rl.mask_decision


def study_runs(config: Mapping[str, Any] | StageSettings) -> list[str]:
    """Every run of the matrix: the arms, then the ablations, then the extensions."""
    runs = config if isinstance(config, StageSettings) else stage_settings(RUN_NAMES_VIEW, config)
    return sorted(runs.arms) + list(runs.ablations) + list(runs.extensions)


def runs_of_kind(config: Mapping[str, Any] | StageSettings, kind: str, trainer: str | None = None) -> list[str]:
    """The study runs of one kind (``arm``, ``ablation``, ``extension``), optionally of one trainer."""
    matrix = run_matrix(config)
    specs = [resolve_run(matrix, r) for r in study_runs(matrix)]
    return [s.run for s in specs if s.kind == kind and (trainer is None or s.trainer == trainer)]


def sft_runs(config: Mapping[str, Any] | StageSettings) -> list[str]:
    """The runs with an SFT checkpoint of their own: the arms (sorted), then the study runs with ``sft_run`` = the
    run itself, in run order."""
    matrix = run_matrix(config)
    return sorted(matrix.arms) + [r for r in study_runs(matrix) if resolve_run(matrix, r).own_sft]


def resolve_run(config: Mapping[str, Any] | StageSettings, run: str) -> RunSpec:
    """What `run` trains and how it rolls out (the module docstring's rules), from the config's typed run matrix."""
    matrix = run_matrix(config)
    arms, ablations, extensions = matrix.arms, matrix.ablations, matrix.extensions
    for name in set(arms) & set(ablations) | set(arms) & set(extensions) | set(ablations) & set(extensions):
        raise ConfigError(f"run {name!r} is named twice (arms, ablations, extensions need distinct names)")
    over: Any
    if run in arms:
        arm, over, kind = run, None, "arm"
    elif run in ablations or run in extensions:
        kind = "ablation" if run in ablations else "extension"
        over = ablations[run] if run in ablations else extensions[run]
        arm = over.base_arm
        if arm not in arms:
            raise ConfigError(f"{kind}s.{run}.base_arm: no arm {arm!r} (have {', '.join(arms)})")
    else:
        known = [*arms, *ablations, *extensions]
        raise ConfigError(f"run {run!r} is neither an arm, an ablation nor an extension (have {', '.join(known)})")
    protocol = arms[arm].protocol
    alpha = arms[arm].ce_weight if over is None or over.alpha is None or protocol != "predictive" else over.alpha
    variant = "none" if over is None else over.variant
    extension = over if isinstance(over, ExtensionSettings) else None
    mask_decision = matrix.rl.mask_decision if extension is None or extension.mask_decision is None \
        else extension.mask_decision
    trainer = "rl" if extension is None else extension.trainer
    if protocol != "predictive" and (variant in PREDICTIVE_VARIANTS or bool(extension and extension.mask_decision)):
        what = f"variant {variant}" if variant in PREDICTIVE_VARIANTS else "mask_decision"
        raise ConfigError(f"{kind}s.{run}: {what} needs a predictive base arm, {arm} is {protocol}")
    sft = extension.sft if extension is not None and extension.sft is not None \
        else ("own" if variant in ENVIRONMENT_VARIANTS else "base")
    if sft == "own" and variant not in TRACE_VARIANTS:
        raise ConfigError(f"{kind}s.{run}.sft: own needs SFT traces of its variant, and {variant} traces are not "
                          f"rendered (only {', '.join(TRACE_VARIANTS)}): use sft: base")
    return RunSpec(
        run=run,
        arm=arm,
        protocol=protocol,
        variant=variant,
        alpha=alpha,
        test_cost=matrix.env.test_cost if extension is None or extension.test_cost is None else extension.test_cost,
        mask_decision=mask_decision,
        trainer=trainer,
        kind=kind,
        sft_run=run if kind != "arm" and sft == "own" else arm,
    )


@dataclass(frozen=True)
class Environment:
    """One environment of the open question: the reactive and the predictive run that play it."""

    name: str
    variant: str
    test_cost: int
    reactive: str
    predictive: str

    @property
    def runs(self) -> tuple[str, str]:
        return (self.reactive, self.predictive)


def environment_name(variant: str, test_cost: int, default_test_cost: int) -> str:
    """``study``, ``expensive``, the variant, or the variant ``+expensive`` (see the module docstring)."""
    parts = [variant] if variant != "none" else []
    parts += ["expensive"] if test_cost != default_test_cost else []
    return "+".join(parts) or "study"


def environments(config: Mapping[str, Any] | StageSettings) -> list[Environment]:
    """Every environment both protocols play (the module docstring's rule), the study's first, then in run order."""
    matrix = run_matrix(config)
    default_mask = matrix.rl.mask_decision
    sides: dict[tuple[str, int], dict[str, list[str]]] = {}
    for run in study_runs(matrix):
        spec = resolve_run(matrix, run)
        arm_alpha = matrix.arms[spec.arm].ce_weight
        if spec.kind == "ablation" or spec.trainer != "rl" or spec.mask_decision != default_mask \
                or spec.alpha != arm_alpha:
            continue  # it changes more than the environment
        sides.setdefault((spec.variant, spec.test_cost), {}).setdefault(spec.protocol, []).append(run)
    default_cost = matrix.env.test_cost
    out = []
    for (variant, cost), by_protocol in sides.items():
        name = environment_name(variant, cost, default_cost)
        for protocol, runs in by_protocol.items():
            if len(runs) > 1:
                raise ConfigError(f"environment {name} (variant {variant}, test_cost {cost}) has two {protocol} runs "
                                  f"({', '.join(runs)}): the open question pairs one reactive with one predictive run")
        if "reactive" in by_protocol and "predictive" in by_protocol:
            out.append(Environment(name, variant, cost, by_protocol["reactive"][0], by_protocol["predictive"][0]))
    return sorted(out, key=lambda e: e.name != "study")  # stable: the rest keep run order


def extension_counterpart(config: Mapping[str, Any] | StageSettings, run: str) -> str | None:
    """The run an extension's calls per solved task are compared with: for an extension that is one side of an
    environment (`environments`: expensive tests, irreversible, blind), the other protocol's run there; None
    otherwise (statistics then use the other base arm)."""
    matrix = run_matrix(config)
    if run in matrix.arms:
        return None
    for env in environments(matrix):
        if run in env.runs:
            return env.predictive if run == env.reactive else env.reactive
    return None

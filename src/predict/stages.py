"""The stage table: for every `predict <stage>`, its rules, rules file, module, outputs and the config it reads.

Rules this module keeps:
* ONE table (``STAGES``) says which config sections or keys each stage reads. A key is a dotted path
  (``evaluation.bootstrap``); a section (``rl``) means every key below it.
* A stage is handed exactly its slice (``config_slice``) as ONE typed object: its own pydantic model
  (``stage_model``: composed from the study's section models, holding exactly the keys its row lists; issue 61),
  read as attributes all the way down (``config.rl.lr``). Reading anything the row does not give raises
  ``SliceError`` naming the stage and the key (so does the workflow's own object, ``workflow_config``): the table
  cannot go stale silently. Fingerprints, JSON and hashes take its plain data
  (``predict.config.models.plain_data``: the slice's very bytes), so no state or ledger changes with the types.
  A key the row gives but the config leaves out (and that has no default) reads as None.
* The workflow passes a slice as a small content-addressed JSON file (``slice_file``) and tracks it as one short
  param per entry (``slice_params``: ``rl.lr=0.0001`` or ``rl#1a2b3c4d``), so an edit reruns only the stages that
  read it and Snakemake's "Params have changed" reason names the changed entry, not the whole config.
* Rules files read config values for their flags through a stage's typed object too (``stage_settings``), so every
  read is in the table; what the workflow itself reads to plan the DAG (run matrix, seeds, backend, resources) it
  reads through ONE typed object, ``workflow_config`` over ``WORKFLOW`` (workflow/rules/common.smk:
  ``WORKFLOW_CONFIG.rl.steps``), never ``config`` directly.
* A key in ``UNTRACKED`` says how a job runs, not what it computes (``serving.shared``: one server for the run's
  jobs, or one per job): it is in the slices of the stages that read it, but not in their tracked params, so
  changing it reruns nothing (the test campaign's design hash leaves it out too: `predict.campaign`).
* Each stage's command (its flags and its ``main``) lives in its own module (``Stage.command``); predict.cli only
  registers them.
* A stage that reads tasks names the flags that hold them (``Stage.task_files``) and reads ``data`` (`SPLIT`,
  untracked: it shapes no result): `predict.campaign.seal.seal_stage` checks those files against the test split before
  the stage starts.
* The README's stage table is rendered from here (``readme_table``) and a test keeps the two equal.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pydantic

from predict.config import ConfigError, config_problems, sections_in
from predict.config.models import Section, StudyConfig, plain_data

# What resolving a study run reads (predict.runs.resolve_run): the run matrix, the default test cost, the decision mask.
RUN_MATRIX = ("arms", "ablations", "extensions", "env.test_cost", "rl.mask_decision")
# What one rollout in the coding environment reads (predict.rollouts, env/runner.py): the protocol, the sandbox, the
# chat template, the server.
ROLLOUT = ("arms", "env", "verifier", "model.enable_thinking", "serving")
# The frozen design the test campaign's ledger hashes (predict.campaign.design.design_config): every section of
# the config models but its NOT_RESULT_SHAPING keys (names, paths, power, cluster sizes), so a power edit never reruns
# the campaign (tests/test_stages.py: the slice's hash is the whole config's). The bootstrap is in it:
# the test's statistics settings are frozen with the campaign.
DESIGN = ("data", "verifier", "model", "sft", "serving", "env", "traces", "arms", "backend", "prime_rl", "seeds",
          "ablations", "extensions", "rft", "rl", *(f"evaluation.{k}" for k in (
              "temperature", "max_tokens", "samples", "tasks", "checkpoints", "extension_checkpoints", "reference",
              "test_checkpoints", "selection", "bootstrap")))

# What the test split's seal reads (predict.campaign.seal.seal_stage): the split's definition, to derive the test
# task ids in any clone.
# Untracked where a stage reads it for the seal alone (`Stage.untracked`): the tasks file it checks already carries
# the split, so an edit here reruns nothing a new split would not.
SPLIT = ("data",)

# The whole config, every top-level key (the bundle's manifest records it filled in).
STUDY = tuple(StudyConfig.model_fields)

# How long the scheduler lets a job run (SLURM's time limit for prime-rl's jobs): scheduling, not design (issue 60;
# the plan says how long a job takes). Out of the test campaign's design hash (predict.campaign.design, which still
# finds ledgers written while they were in it), and an edit reruns nothing.
SCHEDULING = ("prime_rl.rl.runtime", "prime_rl.sft.runtime")
# Keys a stage reads that shape no result (see the rules above): how jobs are served, a declared test campaign's
# reason (predict.campaign: declaring it, or leaving it out once the campaign is recorded, must replan nothing), and
# where training curves go live.
UNTRACKED = ("serving.shared", "evaluation.new_campaign", "tracking", "rl.activation_checkpointing",
             "rl.activation_checkpointing_layers", "rl.offload_optimizer", *SCHEDULING)
# Where a training job's curves go live (predict.train.tracking): the section, the log root under results_dir, the
# W&B group. A training stage reads run_name and results_dir for that alone, so they are untracked there
# (`Stage.untracked`): adding tracking reran no finished training job.
TRACKING = ("tracking", "run_name", "results_dir")


@dataclass(frozen=True)
class Stage:
    name: str  # the `predict` subcommand
    rules: tuple[str, ...]
    rules_file: str
    module: str
    outputs: str
    reads: tuple[str, ...]
    untracked: tuple[str, ...] = ()
    """Keys of `reads` this stage reads for how it runs only (like `UNTRACKED`, for this stage alone)."""
    command: str | None = ""
    """`predict <name>` is `module`'s `arguments(parser)` and `main(args, config)` (""), or its `<command>_arguments`
    and `<command>_main` (a module with two stages' commands); None: no command of its own (evaluate-test is
    `predict evaluate --split test`). predict.cli registers them from here."""
    help: str = ""
    """The command's one line in `predict --help` (here, so that listing the stages imports none of them)."""
    task_files: tuple[str, ...] = ()
    """The flags (argparse names) whose files hold the tasks the stage reads (``task_id`` rows: a split, traces):
    `predict.campaign.seal.seal_stage` checks them before the stage starts. The stage must read `SPLIT`."""

    def command_functions(self) -> tuple[str, str, str]:
        """The command's module and the names of its two functions: (module, arguments, main)."""
        if self.command is None:
            raise ConfigError(f"stage {self.name!r} has no command of its own")
        prefix = f"{self.command}_" if self.command else ""
        return "predict." + self.module.removesuffix(".py").replace("/", "."), prefix + "arguments", prefix + "main"


def _reads(*groups: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(key for group in groups for key in group))


STAGES: dict[str, Stage] = {
    s.name: s
    for s in [
        Stage("split", ("split_mbpp",), "data.smk", "split.py", "data/{sft,rl,val,test}.parquet, manifest.json",
              ("data",),
              help="read MBPP, split it with a seed, write {sft,rl,val,test}.parquet + manifest.json"),
        Stage("verify-gold", ("verify_gold",), "verifier.smk", "sandbox/gold.py", "verifier/gold.parquet, gold_summary.parquet",
              ("verifier",),
              help="run the gold solutions through the sandbox: the verifier report"),
        Stage("build-tiny-model", ("build_tiny_model",), "models.smk", "tiny_model.py", "models/tiny/",
              ("model.tiny",),
              help="build a random tiny Qwen3 with the real tokenizer"),
        Stage("check-serving", ("check_serving",), "serving.smk", "serving/stage.py", "serving/check.json",
              ("serving.python", "serving.device"),
              help="check that serving.python imports vLLM (before any serving job)"),
        Stage("rollout", ("rollout",), "rollouts.smk", "rollouts.py", "rollouts/{arm}/{checkpoint}/{split}/seed{seed}.parquet",
              _reads(ROLLOUT, SPLIT), SPLIT, task_files=("tasks_file",),
              help="roll a checkpoint out over a split's tasks into parquet (resumes)"),
        Stage("traces", ("sft_traces",), "traces.smk", "traces/stage.py", "sft/traces/{arm}.parquet, tasks.parquet",
              ("traces", "arms", "env", "verifier", *SPLIT), SPLIT, task_files=("tasks_file",),
              command="traces", help="synthesize both arms' SFT traces (gold + verified mutants) into parquet"),
        # A run with its own SFT (predict.runs: irreversible, blind): its base arm's traces under its own protocol.
        Stage("run-traces", ("run_traces",), "traces.smk", "traces/stage.py", "sft/traces/{run}.parquet",
              _reads(RUN_MATRIX, ("traces", "env"), SPLIT), SPLIT, task_files=("tasks_file", "arm_traces"),
              command="run_traces", help="render a run's own SFT traces (irreversible, blind: predict.runs) from its base arm's traces"),
        Stage("sft", ("train_sft",), "train.smk", "train/sft.py", "checkpoints/{arm}/sft/, sft/{arm}/metrics.parquet",
              _reads(("sft", "model.enable_thinking"), TRACKING, SPLIT), (*TRACKING, *SPLIT), task_files=("traces",),
              help="supervised fine-tuning on rendered traces -> an HF checkpoint (resumes after a kill)"),
        Stage("rl", ("rl",), "rl.smk", "train/rl.py", "rl/{run}/seed{seed}/step{N}/, metrics.parquet",
              _reads(RUN_MATRIX, ROLLOUT, ("rl",), TRACKING, SPLIT), (*TRACKING, *SPLIT), task_files=("tasks_file",),
              help="RL (GRPO) of one run and seed on the rl split: step checkpoints + metrics (resumes)"),
        Stage("rft", ("rft",), "rft.smk", "train/rft.py", "rl/{run}/seed{seed}/step{N}/, metrics.parquet",
              _reads(RUN_MATRIX, ROLLOUT, ("rl", "rft"), TRACKING, SPLIT), (*TRACKING, *SPLIT),
              task_files=("tasks_file",),
              help="rejection-sampling fine-tuning of one RFT extension run and seed (resumes)"),
        Stage("evaluate", ("evaluate_{run}",), "evaluation.smk", "evaluate.py",
              "eval/{run}/{checkpoint}/val/seed{seed}.parquet",
              _reads(RUN_MATRIX, ROLLOUT, ("evaluation.temperature", "evaluation.max_tokens", "evaluation.samples",
                                           "evaluation.tasks"), SPLIT), SPLIT, task_files=("tasks_file",),
              help="greedy pass@1 of a run/seed's checkpoints on a split, one vLLM server (evaluation settings)"),
        # The test campaign (`predict evaluate --split test`) records the frozen design in the checkout's ledger,
        # and a declared campaign's reason. It reads results_dir for one thing, untracked: the study's results
        # folder, where a fresh campaign looks for the history of one the ledger does not record
        # (predict.campaign.history); the design hash leaves it out.
        Stage("evaluate-test", ("evaluate_test_{run}", "evaluate_test_reference_{run}", "evaluate_test_campaign",
                               "evaluate_test"),
              "evaluation.smk", "evaluate.py",
              "eval/{run}/{checkpoint}/test/seed{seed}.parquet, ../.test-campaigns/ledger.jsonl",
              (*DESIGN, "evaluation.new_campaign", "results_dir"), ("results_dir",), task_files=("tasks_file",),
              command=None),
        Stage("stats", ("stats", "test_stats"), "stats.smk", "stats/study.py",
              "stats/*.parquet (STATS_TABLES), test/stats/*.parquet (TEST_STATS_TABLES)",
              _reads(RUN_MATRIX, ("evaluation.reference", "evaluation.selection", "evaluation.bootstrap")),
              help="pass@1, paired tests, mechanism metrics and selection from evaluations"),
        Stage("ablations", ("ablation",), "stats.smk", "stats/ablations.py", "ablations/{ablation}.parquet",
              ("ablations", "evaluation.selection", "evaluation.bootstrap"),
              help="one ablation's table: a row per seed vs its base arm"),
        Stage("extensions", ("extension",), "stats.smk", "stats/extensions.py", "extensions/{extension}.parquet",
              _reads(RUN_MATRIX, ("evaluation.selection", "evaluation.bootstrap")),
              help="one extension's table: a row per seed vs Arm A and Arm B + mechanism"),
        # The open question (issue 28): Arm B vs Arm A within each environment (predict.runs.environments), on val;
        # the test's is a table of `predict stats` (TEST_STATS_TABLES).
        Stage("open-question", ("open_question",), "stats.smk", "stats/open_question.py", "extensions/open_question.parquet",
              _reads(RUN_MATRIX, ("evaluation.selection", "evaluation.bootstrap")),
              help="the open question: Arm B vs Arm A within each environment (study, expensive, irreversible, blind)"),
        Stage("power", ("power",), "stats.smk", "stats/power.py", "stats/power.parquet",
              ("power", "data.sizes", "seeds"),
              help="exact power of one seed pairing (exact McNemar) per difference, discordance and number of tasks"),
        Stage("training-outcomes", ("training_outcomes",), "report.smk", "stats/training_outcomes.py",
              "stats/training_outcomes.parquet", (),
              help="per predictive run and seed, over all RL steps: verified vs predicted class counts and shares"),
        Stage("report", ("report",), "report.smk", "report/stage.py", "report/index.html",
              _reads(("run_name", "model.base", "seeds"), RUN_MATRIX, ("power", "data.sizes.test")),
              help="the study report: one self-contained HTML page from parquet"),
        # Every episode browsable in Inspect's viewer (issue 62): reads the runs (their pairs) and the split (the seal).
        # Its --tasks-file only renders the prompts of the files it admitted (predict.inspect_logs: the seal).
        Stage("inspect-logs", ("inspect_logs",), "report.smk", "inspect_logs/stage.py",
              "inspect/{run}/{checkpoint}/{split}/seed{seed}.eval, logs.json", _reads(RUN_MATRIX, SPLIT), SPLIT,
              help="every evaluation (and RL step, on request) as an Inspect log for `inspect view`, the arms paired"),
        # Beside `all` (workflow/rules/bundle.smk says why): everything the report rests on, for a second party.
        Stage("bundle", ("bundle",), "bundle.smk", "bundle/build.py", "bundle/ (manifest.json), bundle.tar.gz",
              STUDY,
              help="bundle the report, its rows, tables, ledger lines and a manifest for `predict verify-bundle`"),
        # The learning-signal run (issue 17): its own traces, SFT and RL runs on a handful of sft tasks.
        Stage("signal", ("signal",), "signal.smk", "train/learning_signal.py", "signal/curves.parquet, verdicts.parquet, signal.png",
              _reads(RUN_MATRIX, ROLLOUT, ("data", "traces", "rl"), TRACKING), TRACKING,
              help="the learning-signal run: RL visibly raises reward, CE teaches the label"),
        Stage("prime-rl-setup", ("prime_rl_setup",), "prime_rl.smk", "train/prime_rl/cluster.py", ".prime-rl/setup.json",
              ("prime_rl.repo", "prime_rl.commit", "prime_rl.python", "prime_rl.extras", "prime_rl.attn",
               "prime_rl.dir"),
              command="setup", help="clone prime-rl at the pinned commit, register PredictAlgorithm, uv sync"),
        Stage("prime-rl-config", ("prime_rl_sft_config", "prime_rl_rl_config"), "prime_rl.smk",
              "train/prime_rl/cluster.py", "sft/{arm}/prime-rl.toml, rl/{run}/seed{seed}/prime-rl.toml",
              _reads(RUN_MATRIX, ROLLOUT, ("prime_rl", "rl", "sft", "model", "seeds", "results_dir"), TRACKING, SPLIT),
              ("tracking", "run_name", *SPLIT), task_files=("tasks_file", "traces"),
              command="config", help="render a prime-rl rl/sft TOML (and the SFT dataset)"),
        Stage("prime-rl-train", ("prime_rl_sft", "prime_rl_rl"), "prime_rl.smk", "train/prime_rl/cluster.py",
              "checkpoints/{arm}/sft/, rl/{run}/seed{seed}/step{N}/, metrics.parquet, prime-rl-metrics.parquet",
              ("tracking",),
              command="train", help="run prime-rl rl/sft on a rendered TOML, collect checkpoints"),
    ]
}


# What the Snakefile and the rules files read to plan jobs (not a stage's computation): names and paths, the run
# matrix and seeds, the backend, the checkpoints evaluated and the test campaign, and what sizes jobs (cluster GPUs,
# the devices, prime-rl's GPUs and run times). Read through `workflow_config`, so a rules file reading any other
# key fails naming it.
WORKFLOW = ("run_name", "results_dir", "backend", "seeds", *RUN_MATRIX, "evaluation", "cluster", "serving.device",
            "sft.device", "model.base", "verifier.workers", "rl.steps", "rl.checkpoint_every", "prime_rl.dir",
            "prime_rl.sft", "prime_rl.rl",
            # the disk a run needs, checked before its first job (predict.train.disk.check_workflow_disk)
            "model.tiny", "sft.dtype", "sft.save_every", "sft.max_steps", "rl.state_every", "rl.keep_state", "rl.dtype")
WORKFLOW_VIEW = "workflow"
"""The name `workflow_config`'s view reports in its errors (not a `predict` stage)."""
RUNS_VIEW = "runs"
"""The run matrix as its own model (`predict.runs.run_matrix`: a config mapping's runs, read as typed sections)."""
CHECKPOINTS_VIEW = "checkpoints"
"""What a checkpoint's path reads (`predict.runs.checkpoint_path`): the runs and the base model."""
RUN_NAMES_VIEW = "run-names"
"""The runs' names alone (`predict.runs.study_runs`): a stage that lists the runs but not the whole matrix (report)."""
RESULTS_VIEW = "results"
"""Whose results folder it is (`predict.fingerprint.claim_results_dir`): the run's name and its folder."""
TRACKING_VIEW = "tracking"
"""Where a training job's curves go (`predict.train.tracking.TrackingTargets`): `TRACKING`."""
EPISODE_VIEW = "episode"
"""What one rollout's settings read (`predict.env.runner.RolloutSettings.from_study_config`): `ROLLOUT`."""
VIEWS = {WORKFLOW_VIEW: WORKFLOW, RUNS_VIEW: RUN_MATRIX, CHECKPOINTS_VIEW: (*RUN_MATRIX, "model.base"),
         EPISODE_VIEW: ROLLOUT, RUN_NAMES_VIEW: ("arms", "ablations", "extensions"), TRACKING_VIEW: TRACKING,
         RESULTS_VIEW: ("run_name", "results_dir")}
"""Models of the config that are no stage's: their names (never a `predict` stage) and the keys they hold."""


class SliceError(ConfigError):
    """A stage read a config key its entry in the stage table does not list."""


class StageSettings(Section):
    """What a stage's model is: its own pydantic model (`stage_model`), composed from the study's section models,
    holding exactly the keys its row of the stage table lists. A section the row gives whole is its section model
    (``rl``: `RLSettings`); a section it gives keys of (``model.enable_thinking``) is a model of those keys alone.
    Reading a key the row does not give raises SliceError naming the stage and the key: the table cannot go stale
    silently."""

    stage_name: ClassVar[str] = ""
    stage_path: ClassVar[str] = ""
    stage_reads: ClassVar[tuple[str, ...]] = ()
    stage_section: ClassVar[type[Section]] = StudyConfig
    """The study's section model this part holds keys of (its keys outside the row raise SliceError, others are typos)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # type: ignore[misc]
        except AttributeError:
            if name.startswith("_"):
                raise
        path = f"{self.stage_path}.{name}" if self.stage_path else name
        if name not in self.stage_section.model_fields:
            raise AttributeError(f"{self.stage_section.__name__} has no key {path!r}")
        raise SliceError(
            f"stage {self.stage_name!r} read config key {path!r}, which its entry in the stage table "
            f"(src/predict/stages.py) does not list: add it there (it reads {', '.join(self.stage_reads) or 'nothing'})"
        )

    def __contains__(self, name: str) -> bool:
        """Whether the config sets this key (a key outside the row raises SliceError, as reading it does)."""
        return getattr(self, name) is not None

    def __setattr__(self, name: str, value: Any) -> None:
        path = f"{self.stage_path}.{name}" if self.stage_path else name
        raise AttributeError(f"a stage's config is read-only ({path!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its stage, its place and its plain data (its class is built at run time: `stage_model`)."""
        return (_stage_part, (self.stage_name, self.stage_path, plain_data(self)))


def _stage_part(stage: str, path: str, data: Any) -> StageSettings:
    """The part at `path` of the stage's model, read from its plain data (how a pickled `StageSettings` comes back)."""
    model: Any = stage_model(stage)
    for key in filter(None, path.split(".")):
        model = sections_in(model.model_fields[key].annotation)[0]
    return model.model_validate(data)


_WHOLE: dict[str, Any] = {}
"""A key of `_key_tree` that the table gives whole."""


def _key_tree(reads: Iterable[str]) -> dict[str, Any]:
    """The table entry's dotted keys as a tree: {section: {key: _WHOLE}}; a key given whole covers the ones below."""
    tree: dict[str, Any] = {}
    for path in reads:
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            if node.get(part) is _WHOLE:
                break
            node = node.setdefault(part, {})
        else:
            node[leaf] = _WHOLE
    return tree


def _part_model(model: type[Section], tree: Mapping[str, Any], name: str, stage: str, path: str,
                reads: tuple[str, ...]) -> type[StageSettings]:
    fields: dict[str, Any] = {}
    for key, below in tree.items():
        field = model.model_fields[key]
        if below is _WHOLE:
            fields[key] = (field.annotation, copy.copy(field))
            continue
        section = sections_in(field.annotation)[0]
        if section is None:
            raise ConfigError(f"stage table: {stage!r} lists keys below {path + key!r}, which is no section")
        part = _part_model(section, below, f"{name}_{key}", stage, path + key + ".", reads)
        if all(not f.is_required() for f in part.model_fields.values()):  # its defaults, where the slice has none
            fields[key] = (part, pydantic.Field(default_factory=part, description=field.description))
        elif field.is_required():
            fields[key] = (part, pydantic.Field(description=field.description))
        else:
            fields[key] = (part | None, pydantic.Field(default=None, description=field.description))
    built = pydantic.create_model(name, __base__=StageSettings, **fields)
    built.stage_name, built.stage_path, built.stage_reads, built.stage_section = stage, path.rstrip("."), reads, model
    return built


@functools.cache
def stage_model(stage: str) -> type[StageSettings]:
    """The stage's own config model (`StageSettings`), built from its row of the stage table (the one source of what
    a stage reads) and the study's section models (the one source of every key's type and default): the typed
    object its ``main`` receives. ``workflow`` (`WORKFLOW_VIEW`): what the workflow reads to plan jobs."""
    reads = STAGES[stage].reads if stage in STAGES else VIEWS.get(stage)
    if reads is None:
        raise ConfigError(f"no stage {stage!r} in the stage table (src/predict/stages.py)")
    title = "".join(word.capitalize() for word in re.split(r"[-_]", stage)) + "Config"
    return _part_model(StudyConfig, _key_tree(reads), title, stage, "", reads)


def stage_settings(stage: str, config: Mapping[str, Any], source: str = "config") -> StageSettings:
    """The stage's typed object from a (defaults-filled) config or its slice: only the keys its row lists are read.
    Raises ConfigError naming `source` and the key."""
    try:
        return stage_model(stage).model_validate(config_slice(config, stage) if stage in STAGES
                                                 else _keys(config, VIEWS[stage]))
    except pydantic.ValidationError as e:
        raise ConfigError(f"{source}: {config_problems(e, dict(config), stage_model(stage))[0]}") from None


def pick(config: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _keys(config: Mapping[str, Any], reads: Iterable[str]) -> dict[str, Any]:
    """These keys of the config (plain dicts), keys the config leaves out left out."""
    out: dict[str, Any] = {}
    for path in reads:
        found, value = pick(config, path)
        if not found:
            continue
        *parents, last = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = json.loads(json.dumps(value))
    return out


def config_slice(config: Mapping[str, Any], stage: str) -> dict[str, Any]:
    """The part of the config a stage reads (plain dicts), keys the config leaves out left out."""
    if stage not in STAGES:
        raise ConfigError(f"no stage {stage!r} in the stage table (src/predict/stages.py)")
    return _keys(config, STAGES[stage].reads)


def workflow_config(config: Mapping[str, Any]) -> StageSettings:
    """The workflow's own typed object of a (defaults-filled) config: the `WORKFLOW` keys, read as attributes
    (``WORKFLOW_CONFIG.rl.steps``); any other key raises SliceError naming it."""
    return stage_settings(WORKFLOW_VIEW, config, source="workflow")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def without_keys(config: Any, dotted: Iterable[str]) -> Any:
    """A plain-JSON copy of `config` without the `dotted` keys (``a.b.c``); keys it does not set are skipped."""
    config = json.loads(json.dumps(config))
    for key in dotted:
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return config


def slice_params(config: Mapping[str, Any], stage: str) -> dict[str, str]:
    """One short, tracked Snakemake param per table entry: ``key=value`` for a short value, ``key#hash`` for a
    section. A changed entry changes only its own param, so the rerun reason names it."""
    params = {}
    for path in STAGES[stage].reads:
        if path in UNTRACKED or path in STAGES[stage].untracked:
            continue
        found, value = pick(config, path)
        untracked_below = [key.removeprefix(path + ".") for key in UNTRACKED if key.startswith(path + ".")]
        if untracked_below and isinstance(value, Mapping):
            value = without_keys(value, untracked_below)
        text = _canonical(value) if found else "unset"
        shown = f"{path}={text}" if len(text) <= 40 else f"{path}#{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        params["config_" + path.replace(".", "_")] = shown
    return params


def slice_file(config: Mapping[str, Any], stage: str, folder: str | Path) -> str:
    """Write the stage's slice as ``{folder}/{stage}-{hash}.json`` (once: the name is its content's hash, so the
    file never changes under a job and two configs never share one) and return its path."""
    text = _canonical(config_slice(config, stage))
    path = Path(folder, f"{stage}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json")
    if not path.exists():
        from predict.outputs import write_text

        write_text(text + "\n", path)
    return str(path)


def readme_table() -> str:
    """The README's table: stage | rule | rules file | module | outputs (under results/) | config it reads."""
    lines = ["| stage | rule | rules file | module | outputs (under `results/`) | config it reads |",
             "|---|---|---|---|---|---|"]
    for s in STAGES.values():
        rules = ", ".join(f"`{r}`" for r in s.rules)
        reads = ", ".join(f"`{r}`" for r in s.reads) or "(nothing)"
        lines.append(f"| `predict {s.name}` | {rules} | [{s.rules_file}](workflow/rules/{s.rules_file}) | "
                     f"[{s.module}](src/predict/{s.module}) | `{s.outputs}` | {reads} |")
    return "\n".join(lines)

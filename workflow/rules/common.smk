# Shared by all the rules files: config validation, paths, and how jobs reach the `predict` CLI.
import os
import re
import shlex
import sys
from pathlib import Path

from predict.config import ConfigError, with_defaults
from predict.plan.limits import WorkflowLimits
from predict.campaign import campaign_from_stats, campaign_plan, planned_selection, selection_settings
from predict.runs import checkpoint_path, extension_counterpart, resolve_run, sft_runs, study_runs
from predict.stages import slice_file, slice_params, stage_settings, workflow_config

_CONFIG_SOURCE = ", ".join(map(str, workflow.overwrite_configfiles or workflow.configfiles))
try:
    # Validated against the config models and every default filled in, once, in place, before anything slices the
    # config: the stage slices, their tracked params and the fingerprints see the same config `predict` stages load.
    config.update(with_defaults(config, source=_CONFIG_SOURCE))
except ConfigError as e:
    raise WorkflowError(f"invalid config: {e}") from None

# The rules files reach the config three ways, and `config` itself only here:
#   WORKFLOW_CONFIG.key     what the workflow reads to plan jobs (run matrix, seeds, backend, evaluation, sizes), its
#                           one typed object (predict.stages.WORKFLOW): a key it does not list fails naming it;
#   **SLICE("stage")        a job's params: its stage's slice file (--config-slice) and one tracked param per key;
#   CONFIG("stage").key     a value a rule passes or plans by, read through that stage's typed object.
# (tests/test_workflow_config_reads.py holds them to it.)
WORKFLOW_CONFIG = workflow_config(config)
RESULTS = Path(WORKFLOW_CONFIG.results_dir)


# results/ records which run_name made it; a run of another config stops here, before any job, naming both (its
# stages get slices without the name, so the workflow checks once). Dry-runs never claim: onstart is skipped there.
# Then the disk: a run whose checkpoints, states and served copies cannot fit stops here, naming each and its bytes
# (predict.train.disk; the jobs check their own again as they start).
onstart:
    from predict.fingerprint import claim_results_dir
    from predict.train.disk import check_workflow_disk

    claim_results_dir(WORKFLOW_CONFIG, [RESULTS])
    check_workflow_disk(WORKFLOW_CONFIG, RESULTS)


envvars:
    "PATH",


# Jobs run `predict`; put the interpreter that runs Snakemake first on PATH so a virtualenv that was
# not activated still provides it (a rule's `conda:` env, where used, takes precedence).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def R(*parts):
    """A path under the configured results folder."""
    return str(RESULTS.joinpath(*parts))


def LOG(stage, *wildcards):
    return str(Path("logs", WORKFLOW_CONFIG.run_name, stage, *wildcards)) + ".log"


def BENCH(stage, *wildcards):
    return str(RESULTS.joinpath("benchmarks", stage, *wildcards)) + ".tsv"


# Each stage gets only the config it reads (the stage table, src/predict/stages.py): its slice of the effective
# config (files and --config overrides merged, validated above) as a small JSON file, `--config-slice
# {params.config:q}`, plus one tracked param per table entry. An edit therefore reruns the jobs whose stages read
# the edited key, and what depends on their outputs; Snakemake's reason names the key ("rl.lr=0.0005").
SLICES = RESULTS / ".slices"


def SLICE(stage):
    """Params for the job of `predict <stage>`, namely `config` (the slice file; derived, so not tracked itself)
    and one `config_<key>` per key the stage reads."""
    path = slice_file(config, stage, SLICES)
    return {"config": lambda wildcards, output: path, **slice_params(config, stage)}


def CONFIG(stage):
    """The stage's typed object of the study configuration (its defaults filled in), for values a rules file passes:
    a key outside its table entry fails."""
    return stage_settings(stage, config, source=_CONFIG_SOURCE)


# GPU rules. Every rule that serves a checkpoint (rollouts, evaluation) or trains one (SFT, RL) takes its
# `resources:` from GPU_RESOURCES: the ONE place a GPU request comes from. It asks for `cluster.gpus_per_job`
# GPUs (the `gpu` resource; the slurm executor turns it into `sbatch --gpus`): 1 in the paper design
# (config/config.yaml), 0 in the embedded default (config/local.yaml), 1 on the local test cluster
# (workflow/profiles/slurm-local/overlay.yaml: its one fake GPU lets SLURM schedule and record the request
# while the model runs on the CPU). Memory, CPUs and time follow the device the work runs on
# (`serving.device` unless `device=` says).
#   resources: **TRAIN_RESOURCES                      (an SFT/RL job)
#   resources: **GPU_RESOURCES(on_gpu={...}, on_cpu={...}, vllm_server=1)   (a new class of GPU job)
# Every job that starts a vLLM server also takes one `vllm_server` slot, so a profile can cap how many servers
# share a machine (the local profiles allow one), and depends on SERVING_CHECK (see workflow/rules/serving.smk).
# Without a `cluster` section: one GPU per job when serving on the GPU, none on the CPU.
GPUS_PER_JOB = (
    WORKFLOW_CONFIG.cluster.gpus_per_job
    if "cluster" in WORKFLOW_CONFIG
    else int(WORKFLOW_CONFIG.serving.device == "gpu")
)


def GPU_RESOURCES(on_gpu, on_cpu, device=None, **extra):
    """Resources of a GPU rule: `cluster.gpus_per_job` GPUs, sized for the device the work runs on."""
    sizes = on_gpu if (device or WORKFLOW_CONFIG.serving.device) == "gpu" else on_cpu
    return {**sizes, **({"gpu": GPUS_PER_JOB} if GPUS_PER_JOB else {}), **extra}


SERVING_RESOURCES = GPU_RESOURCES(
    on_gpu={"mem_mb": 64000, "runtime": 240, "cpus_per_task": 8},
    on_cpu={"mem_mb": 8000, "runtime": 120},
    vllm_server=1,
)
# Our trainer beside a vLLM server (local RL, RFT): one GPU for both; runtime for the paper's 100 steps.
RL_RESOURCES = GPU_RESOURCES(
    on_gpu={"mem_mb": 128000, "runtime": 1440, "cpus_per_task": 16},
    on_cpu={"mem_mb": 8000, "runtime": 240},
    vllm_server=1,
)
# The SFT trainer on one GPU, or the CPU for the local run: sized for the device it trains on, sft.device, whose
# `auto` (the default) takes the job's GPU when it has one, i.e. where serving.device puts the jobs.
def SFT_DEVICE():
    device = WORKFLOW_CONFIG.sft.device  # `auto` too where the config has no sft section (the prime_rl backend)
    return WORKFLOW_CONFIG.serving.device if device == "auto" else device


TRAIN_RESOURCES = GPU_RESOURCES(
    on_gpu={"mem_mb": 128000, "disk_mb": 80000, "runtime": 480, "cpus_per_task": 8},
    on_cpu={"mem_mb": 8000, "runtime": 120},
    device=SFT_DEVICE(),
)
# SLURM's time limit (`runtime`) and memory of these rules come from the plan of each job on the device kind's
# calibration, with the margin predict.plan.limits states (runtime = planned x 2, at least 15 min; memory = the
# calibrated peak x 2, where the job's process holds it all); the hand-set sizes above stay where no calibration
# gives the job (the workflow says which, once per rule). The kind: cluster.device_kind, else cpu where serving.device
# is cpu. Each job also gets its planned seconds, `--planned {resources.planned_s}`: its log warns once it
# outlives its plan by more than the margin.
#   resources: **PLANNED(RL_RESOURCES)                 resources: **PLANNED(SERVING_RESOURCES, checkpoints=n)
LIMITS = WorkflowLimits(config, Path(workflow.basedir), say=logger.info)


def PLANNED(hand_set, checkpoints=1):
    """A GPU rule's resources: `hand_set` with runtime, mem_mb and planned_s from the plan of each of its jobs
    (an evaluation job serving `checkpoints` checkpoints)."""
    return LIMITS.resources(hand_set, checkpoints)


# CPU threads of an SFT job (`predict sft --threads`, torch's intra-op threads): the job's cpus_per_task on a GPU
# node; one on the CPU, where both arms' SFT jobs train side by side (the embedded default's 2 cores) and torch's
# default of every core per job oversubscribed them.
TRAIN_THREADS = TRAIN_RESOURCES.get("cpus_per_task", 1)
# serving.shared (the embedded default): the serving jobs of a run lease ONE vLLM server, each loading its
# checkpoint's weights in place (src/predict/serving/: SharedServer); it stops by itself after serving.shared.idle_s
# without a lease, and at once when the run ends (serving.smk's onsuccess/onerror call this).
def STOP_SHARED_SERVER():
    if CONFIG("rollout").serving.shared is not None:
        from predict.serving.server import stop_shared_server

        logger.info(stop_shared_server())


# Written by the check_serving rule once serving.python was seen to import vLLM. Serving rules take it as
# `ancient(SERVING_CHECK)`: it must exist before they are submitted, but re-checking never reruns them.
SERVING_CHECK = R("serving", "check.json")


def base_model_path():
    """The base model's folder (the embedded default's tiny model) or HF id."""
    return checkpoint_model("", "base", 0)


def run_arm(run):
    """The arm a study run trains and rolls out as (predict.runs): an arm itself, or an ablation's base arm."""
    return resolve_run(WORKFLOW_CONFIG, run).arm


def checkpoint_model(run, checkpoint, seed):
    """The folder or HF id vLLM serves for a run's checkpoint (base, sft or step<N>): predict.runs.checkpoint_path,
    the one place checkpoint names become paths (the bundle's manifest asks it too)."""
    try:
        return checkpoint_path(WORKFLOW_CONFIG, RESULTS, run, checkpoint, seed)
    except ConfigError as e:
        raise WorkflowError(str(e)) from None


def checkpoint_inputs(wildcards):
    """Files a checkpoint depends on: its folder when this workflow builds it (the tiny model, SFT, RL)."""
    model = checkpoint_model(wildcards.get("run", wildcards.get("arm")), wildcards.checkpoint, wildcards.seed)
    return [model] if model.startswith(str(RESULTS)) else []


def checkpoint_available(path):
    """A checkpoint is evaluated when some rule produces it or it is already there. (A training rule whose output is
    a folder holding every step's checkpoint is not a producer of one step's path: then make checkpoint_model and
    checkpoint_inputs point at that rule's output.)"""
    return Path(path).exists() or any(rule.is_producer(path) for rule in workflow.rules)


def EVAL_RUNS():
    """Every study run: the arms, then the ablations, then the extensions."""
    return study_runs(WORKFLOW_CONFIG)


def RUN_CHECKPOINTS(run):
    """The configured checkpoints of a run that exist or are built here, for every seed (one evaluation job serves
    them all, so a seed cannot have its own list); `base`, the untrained stand-in, when none is (a branch or config
    without trained checkpoints). Wiring new checkpoints in is evaluation.checkpoints (evaluation.extension_checkpoints
    for the extension runs: the statistics read their selected RL step, and most share their base arm's SFT)."""
    wanted = WORKFLOW_CONFIG.evaluation.checkpoints
    if run in WORKFLOW_CONFIG.extensions and WORKFLOW_CONFIG.evaluation.extension_checkpoints:
        wanted = WORKFLOW_CONFIG.evaluation.extension_checkpoints
    elif run not in WORKFLOW_CONFIG.arms:
        # An ablation's SFT checkpoint is its base arm's, already evaluated there; the statistics pair an ablation
        # with its base arm at the selected RL step only, so its own evaluations start after SFT.
        wanted = [c for c in wanted if c != "sft"]
    have = [
        c
        for c in wanted
        if c == "base" or all(checkpoint_available(checkpoint_model(run, c, seed)) for seed in WORKFLOW_CONFIG.seeds)
    ]
    return have or ["base"]


def EVAL_CHECKPOINTS(run, seed):
    """The checkpoints a run/seed is evaluated at on val (the same for every seed: RUN_CHECKPOINTS)."""
    return RUN_CHECKPOINTS(run)


def EVALS(runs=None, split="val"):
    """The greedy val evaluation files of these runs (default: all), every seed and checkpoint."""
    return [
        R("eval", run, checkpoint, split, f"seed{seed}.parquet")
        for run in (runs or EVAL_RUNS())
        for seed in WORKFLOW_CONFIG.seeds
        for checkpoint in EVAL_CHECKPOINTS(run, seed)
    ]


# The test campaign (src/predict/campaign/plan.py): per run and seed the checkpoint selection chose on val and
# evaluation.test_checkpoints; for the arms also evaluation.reference, once, under the first seed. With
# evaluation.selection.mode `fixed` the choice is known now: each run/seed's test checkpoints are one job, and each
# arm's reference another; with `best_val` it is known once the val statistics exist: the `stats` checkpoint, then
# one job per test checkpoint.
SELECTION_MODE = selection_settings(CONFIG("evaluate-test")).mode
# Serving on the CPU (the embedded default): one machine's cores serve every job, one request at a time in evaluation,
# so with fixed selection the test campaign is one job (workflow/rules/evaluation.smk: evaluate_test_campaign). Keyed
# on serving.device, which the campaign's design already records (so no edit flips the layout of a frozen campaign
# without changing its design); serving.shared says only how jobs are served and changes no job (stages.UNTRACKED).
CPU_SERVING = WORKFLOW_CONFIG.serving.device == "cpu"


def VAL_CHECKPOINTS():
    """{(run, seed): its val checkpoints}. A function: which checkpoints some rule builds is known only once the
    training rules are included (after this file)."""
    return {(run, seed): RUN_CHECKPOINTS(run) for run in EVAL_RUNS() for seed in WORKFLOW_CONFIG.seeds}


def PLANNED_CAMPAIGN():
    """fixed selection: every (run, checkpoint, seed) of the test campaign, known before any evaluation."""
    val_checkpoints = VAL_CHECKPOINTS()
    return campaign_plan(WORKFLOW_CONFIG, val_checkpoints, planned_selection(WORKFLOW_CONFIG, val_checkpoints))


def TEST_REFERENCE(run):
    """fixed selection: the arm's reference checkpoint where the campaign evaluates it (once, under the first seed),
    else None."""
    reference, first = WORKFLOW_CONFIG.evaluation.reference, WORKFLOW_CONFIG.seeds[0]
    return reference if (run, reference, first) in PLANNED_CAMPAIGN() else None


def CAMPAIGN_CHECKPOINTS(run):
    """fixed selection: the checkpoints the campaign evaluates a run at on test for every seed (the reference apart:
    TEST_REFERENCE)."""
    plan, reference = PLANNED_CAMPAIGN(), TEST_REFERENCE(run)
    per_seed = {seed: [c for r, c, s in plan if (r, s) == (run, seed) and c != reference] for seed in WORKFLOW_CONFIG.seeds}
    first = per_seed[WORKFLOW_CONFIG.seeds[0]]
    if any(checkpoints != first for checkpoints in per_seed.values()):
        raise WorkflowError(f"run {run}: the test campaign's checkpoints differ between seeds: {per_seed}")
    return first


def TEST_EVALS(wildcards=None):
    """Every test evaluation file of the campaign."""
    if SELECTION_MODE == "fixed":
        plan = PLANNED_CAMPAIGN()
    else:
        val_stats = checkpoints.stats.get().output
        plan = campaign_from_stats(WORKFLOW_CONFIG, Path(val_stats.metrics), Path(val_stats.selection))
    return [R("eval", run, checkpoint, "test", f"seed{seed}.parquet") for run, checkpoint, seed in plan]


def EXTENSION_EVALS(extension):
    """The val evaluations one extension's table reads: the run, Arm A, Arm B and its counterpart (expensive tests:
    the other arm at the same test cost)."""
    counterpart = extension_counterpart(WORKFLOW_CONFIG, extension)
    runs = [extension, *[a for a in ("A", "B") if a in WORKFLOW_CONFIG.arms], *([counterpart] if counterpart else [])]
    return EVALS(list(dict.fromkeys(runs)))


def RL_METRICS():
    """The RL metrics tables the report plots, where they exist or are built here."""
    paths = [R("rl", run, f"seed{seed}", "metrics.parquet") for run in EVAL_RUNS() for seed in WORKFLOW_CONFIG.seeds]
    return [p for p in paths if checkpoint_available(p)]


def TRAINING_METRICS():
    """The training metrics tables: every RL run's (RL_METRICS) and every SFT's, where they exist or are built here."""
    sft = [R("sft", run, "metrics.parquet") for run in sft_runs(WORKFLOW_CONFIG)]
    return RL_METRICS() + [p for p in sft if checkpoint_available(p)]


def BUNDLED(wildcards):
    """Every results file the bundle holds (workflow/rules/bundle.smk): the report, the val and test evaluations,
    every statistics table and the training metrics."""
    return [
        *rules.report.output,
        *EVALS(),
        *TEST_EVALS(wildcards),
        *rules.stats.output,
        *rules.power.output,
        *rules.training_outcomes.output,
        *expand(R("ablations", "{ablation}.parquet"), ablation=list(WORKFLOW_CONFIG.ablations)),
        *expand(R("extensions", "{extension}.parquet"), extension=list(WORKFLOW_CONFIG.extensions)),
        *rules.open_question.output,
        *rules.test_stats.output,
        *TRAINING_METRICS(),
    ]


def ROLLOUTS(split, checkpoint="base"):
    return expand(
        R("rollouts", "{arm}", checkpoint, split, "seed{seed}.parquet"), arm=sorted(WORKFLOW_CONFIG.arms), seed=WORKFLOW_CONFIG.seeds
    )


def REPORT_EXAMPLE(wildcards=None):
    """The evaluation a rollout is rendered from: the test campaign's evaluation of Arm B (else the first run) at
    its selected checkpoint, first seed (the writeup's example is a test task)."""
    run = "B" if "B" in WORKFLOW_CONFIG.arms else EVAL_RUNS()[0]
    reference = WORKFLOW_CONFIG.evaluation.reference
    evals = TEST_EVALS(wildcards)
    # .../{run}/{checkpoint}/test/seed{seed}.parquet: the run's, not its reference's
    mine = [p for p in evals if Path(p).parts[-4] == run and Path(p).parts[-3] != reference] or evals
    return mine[0]


# The evaluation jobs (workflow/rules/evaluation.smk): one per run, seed and split, all of its checkpoints (the test
# campaign: one job in all when serving on the CPU, CPU_SERVING). The test
# campaign's jobs find the checkout's one campaign ledger themselves (src/predict/campaign/ledger.py: registry_ledger): it
# is no param, so where it lives (PREDICT_TEST_CAMPAIGNS in the tests) never replans a job.


def evaluation_models(run, checkpoints):
    """Input function: the checkpoint folders this workflow builds, of a run's checkpoints for the job's seed."""
    return lambda w: [
        model
        for checkpoint in checkpoints
        for model in [checkpoint_model(run, checkpoint, w.seed)]
        if model.startswith(str(RESULTS))
    ]


def evaluation_args(run, checkpoints):
    """Params function: `--checkpoint C --model M --out O` per checkpoint, in the order of the rule's outputs."""
    return lambda w, output: " ".join(
        f"--checkpoint {checkpoint} --model {shlex.quote(checkpoint_model(run, checkpoint, w.seed))}"
        f" --out {shlex.quote(out)}"
        for checkpoint, out in zip(checkpoints, output, strict=True)
    )

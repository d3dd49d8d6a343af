# The cluster backend (config `backend: prime_rl`): SFT and RL on prime-rl at the pinned commit, under SLURM.
# Included by the Snakefile only for that backend, so the local DAG never sees these rules. Every rule calls one
# `predict prime-rl-*` stage; the logic is in src/predict/train/prime_rl/.
#   setup (clone + patch + uv sync) -> sft config (+ messages dataset) -> sft -> rl config -> rl (per run, seed)

from predict.runs import checkpoint_steps, resolve_run, study_runs

PRIME_RL = WORKFLOW_CONFIG.prime_rl
PRIME_RL_SETUP = str(Path(PRIME_RL.dir, "setup.json"))  # the checkout and its .venv live next to it
PRIME_RL_PATCH = "workflow/prime-rl/predict-algorithm.patch"
PRIME_RL_ATTENTION_PATCH = "workflow/prime-rl/torch-attention.patch"  # applied for prime_rl.attn flash_attention_2_torch
# The study's GRPO runs: the arms, the ablations, the RL extensions (RFT extensions run on our trainer: rft.smk).
PRIME_RL_RUNS = [r for r in study_runs(WORKFLOW_CONFIG) if resolve_run(WORKFLOW_CONFIG, r).trainer == "rl"]

# The GPU job resources of common.smk, with prime-rl's GPU count and run time (hand-set: prime-rl's jobs have run on
# no calibrated device, so PLANNED keeps them and says so).
_SFT, _RL = PRIME_RL.sft, PRIME_RL.rl
_SFT_GPUS = _SFT.gpus
# colocated (prime_rl.rl.colocate), inference and trainer share the train_gpus GPUs
_RL_GPUS = _RL.train_gpus if _RL.colocate else _RL.train_gpus + _RL.infer_gpus
PRIME_RL_SFT_RESOURCES = {
    **SERVING_RESOURCES,
    "gpu": _SFT_GPUS,
    "runtime": _SFT.runtime,
    "mem_mb": 64000 * _SFT_GPUS,
    "cpus_per_task": 8 * _SFT_GPUS,
}
PRIME_RL_RL_RESOURCES = {
    **SERVING_RESOURCES,
    "gpu": _RL_GPUS,
    "runtime": _RL.runtime,
    "mem_mb": 64000 * _RL_GPUS,
    "cpus_per_task": 8 * _RL_GPUS,
}


rule prime_rl_setup:
    input:
        patch=PRIME_RL_PATCH,
        attention_patch=PRIME_RL_ATTENTION_PATCH,
    output:
        PRIME_RL_SETUP,
    params:
        **SLICE("prime-rl-setup"),  # prime_rl.repo, commit, python, extras, attn
        dir=lambda w, output: str(Path(output[0]).parent),
    resources:
        **PLANNED({"mem_mb": 16000, "runtime": 120, "cpus_per_task": 8}),
    log:
        LOG("prime_rl_setup"),
    benchmark:
        BENCH("prime_rl_setup")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict prime-rl-setup --planned {resources.planned_s} --config-slice {params.config:q}"
        " --dir {params.dir:q} --patch {input.patch:q}"
        " --out {output:q} > {log:q} 2>&1"


rule prime_rl_sft_config:
    input:
        traces=R("sft", "traces", "{arm}.parquet"),
        model=lambda w: [base_model_path()] if WORKFLOW_CONFIG.model.base == "tiny" else [],
    output:
        toml=R("sft", "{arm}", "prime-rl.toml"),
        data=R("sft", "{arm}", "prime-rl-data", "train.parquet"),
    params:
        **SLICE("prime-rl-config"),
        model=base_model_path(),
        output_dir=lambda w, output: str(Path(output.toml).parent / "prime-rl"),
        dataset_dir=lambda w, output: str(Path(output.data).parent),
    log:
        LOG("prime_rl_sft_config", "{arm}"),
    benchmark:
        BENCH("prime_rl_sft_config", "{arm}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict prime-rl-config sft --config-slice {params.config:q} --arm {wildcards.arm}"
        " --traces {input.traces:q} --dataset-dir {params.dataset_dir:q} --model {params.model:q}"
        " --output-dir {params.output_dir:q} --out {output.toml:q} > {log:q} 2>&1"


rule prime_rl_sft:
    input:
        toml=rules.prime_rl_sft_config.output.toml,
        data=rules.prime_rl_sft_config.output.data,
        setup=PRIME_RL_SETUP,
    output:
        checkpoint=directory(R("checkpoints", "{arm}", "sft")),
        metrics=R("sft", "{arm}", "metrics.parquet"),
    params:
        **SLICE("prime-rl-train"),
        dir=lambda w, input: str(Path(input.setup).parent),
    resources:
        **PLANNED(PRIME_RL_SFT_RESOURCES),
    log:
        LOG("prime_rl_sft", "{arm}"),
    benchmark:
        BENCH("prime_rl_sft", "{arm}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict prime-rl-train sft --planned {resources.planned_s} --config-slice {params.config:q}"
        " --toml {input.toml:q} --dir {params.dir:q} --checkpoint {output.checkpoint:q}"
        " --metrics-out {output.metrics:q} > {log:q} 2>&1"


rule prime_rl_rl_config:
    input:
        tasks=R("data", "rl.parquet"),
        # an RL run starts from its SFT checkpoint (RunSpec.sft_run: its arm's, an ablation the predictive arm's, or
        # its own)
        model=lambda w: R("checkpoints", resolve_run(WORKFLOW_CONFIG, w.run).sft_run, "sft"),
    output:
        R("rl", "{run}", "seed{seed}", "prime-rl.toml"),
    wildcard_constraints:
        run="|".join(PRIME_RL_RUNS),
        seed=r"\d+",
    params:
        **SLICE("prime-rl-config"),
        output_dir=lambda w, output: str(Path(output[0]).parent / "prime-rl"),
    log:
        LOG("prime_rl_rl_config", "{run}", "seed{seed}"),
    benchmark:
        BENCH("prime_rl_rl_config", "{run}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict prime-rl-config rl --config-slice {params.config:q} --run {wildcards.run} --seed {wildcards.seed}"
        " --tasks-file {input.tasks:q} --model {input.model:q} --output-dir {params.output_dir:q}"
        " --out {output:q} > {log:q} 2>&1"


rule prime_rl_rl:
    input:
        toml=rules.prime_rl_rl_config.output[0],
        setup=PRIME_RL_SETUP,
    output:
        checkpoints=R("rl", "{run}", "seed{seed}", "checkpoints.json"),
        metrics=R("rl", "{run}", "seed{seed}", "metrics.parquet"),
        raw_metrics=R("rl", "{run}", "seed{seed}", "prime-rl-metrics.parquet"),
        steps=[directory(R("rl", "{run}", "seed{seed}", f"step{n}")) for n in checkpoint_steps(WORKFLOW_CONFIG.rl.steps, WORKFLOW_CONFIG.rl.checkpoint_every)],
    wildcard_constraints:
        run="|".join(PRIME_RL_RUNS),
        seed=r"\d+",
    params:
        **SLICE("prime-rl-train"),
        run_dir=lambda w, output: str(Path(output.checkpoints).parent),
        dir=lambda w, input: str(Path(input.setup).parent),
        # the collected metrics mirrored into the study's TensorBoard root (predict.train.tracking), unless config
        # tracking.tensorboard is off (the stage reads it from its slice)
        tensorboard=R("tensorboard"),
    resources:
        **PLANNED(PRIME_RL_RL_RESOURCES),
    log:
        LOG("prime_rl_rl", "{run}", "seed{seed}"),
    benchmark:
        BENCH("prime_rl_rl", "{run}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict prime-rl-train rl --planned {resources.planned_s} --config-slice {params.config:q}"
        " --toml {input.toml:q} --dir {params.dir:q} --run-dir {params.run_dir:q}"
        " --checkpoints-out {output.checkpoints:q} --metrics-out {output.metrics:q}"
        " --raw-metrics-out {output.raw_metrics:q} --run {wildcards.run} --seed {wildcards.seed}"
        " --tensorboard-dir {params.tensorboard:q} > {log:q} 2>&1"


localrules:
    prime_rl_sft_config,
    prime_rl_rl_config,
    prime_rl_all,


# Every RL run of the study on prime-rl: `snakemake --profile slurm prime_rl_all`.
rule prime_rl_all:
    input:
        expand(R("rl", "{run}", "seed{seed}", "checkpoints.json"), run=PRIME_RL_RUNS, seed=WORKFLOW_CONFIG.seeds),

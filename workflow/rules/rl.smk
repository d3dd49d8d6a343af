# RL (GRPO) of every run in the matrix: the arms (A, B), the ablations of Arm B (config `ablations:`) and the RL
# extensions (config `extensions:` with trainer rl), each seed, each from its arm's SFT checkpoint; and the RFT
# extensions (trainer rft: `predict rft`, same outputs). One job per run and seed; it resumes after a kill.
from predict.train.rl import checkpoint_steps

RL_RUNS = [r for r in study_runs(config) if resolve_run(config, r).trainer == "rl"]
RFT_RUNS = [r for r in study_runs(config) if resolve_run(config, r).trainer == "rft"]
RL_STEPS = checkpoint_steps(config["rl"])

# One GPU for the trainer and the colocated vLLM server; runtime for the paper's 100 steps.
# The GPU request itself comes from GPU_RESOURCES (common.smk: cluster.gpus_per_job), like every GPU rule's.
RL_RESOURCES = GPU_RESOURCES(
    on_gpu={"mem_mb": 128000, "runtime": 1440, "cpus_per_task": 16},
    on_cpu={"mem_mb": 8000, "runtime": 240},
    vllm_server=1,
)

RL_RESULTS = expand(
    R("rl", "{run}", "seed{seed}", "metrics.parquet"), run=RL_RUNS + RFT_RUNS, seed=config["seeds"]
)


rule rl:
    input:
        tasks=R("data", "rl.parquet"),
        init=lambda w: R("checkpoints", resolve_run(config, w.run).arm, "sft"),  # the run's arm's SFT folder
        serving=ancient(SERVING_CHECK),  # the colocated vLLM server's interpreter imports vLLM
    output:
        metrics=R("rl", "{run}", "seed{seed}", "metrics.parquet"),
        checkpoints=[directory(R("rl", "{run}", "seed{seed}", f"step{n}")) for n in RL_STEPS],
    wildcard_constraints:
        run="|".join(RL_RUNS),
        seed=r"\d+",
    params:
        config=CONFIG_JSON,
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        **RL_RESOURCES,
    log:
        LOG("rl", "{run}", "seed{seed}"),
    benchmark:
        BENCH("rl", "{run}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rl --config-json {params.config:q} --run {wildcards.run} --seed {wildcards.seed}"
        " --init {input.init:q} --tasks {input.tasks:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# Rejection-sampling fine-tuning (src/predict/train/rft.py): G rollouts per rl task from the arm's SFT checkpoint
# (vLLM), SFT on the reward-1 ones for rl.steps optimizer steps; checkpoints and metrics where an RL run has them.
rule rft:
    input:
        tasks=R("data", "rl.parquet"),
        init=lambda w: R("checkpoints", resolve_run(config, w.run).arm, "sft"),
    output:
        metrics=R("rl", "{run}", "seed{seed}", "metrics.parquet"),
        checkpoints=[directory(R("rl", "{run}", "seed{seed}", f"step{n}")) for n in RL_STEPS],
    wildcard_constraints:
        run="|".join(RFT_RUNS) or "^$",
        seed=r"\d+",
    params:
        config=CONFIG_JSON,
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        **RL_RESOURCES,
    log:
        LOG("rft", "{run}", "seed{seed}"),
    benchmark:
        BENCH("rft", "{run}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rft --config-json {params.config:q} --run {wildcards.run} --seed {wildcards.seed}"
        " --init {input.init:q} --tasks {input.tasks:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"

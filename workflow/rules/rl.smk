# RL (GRPO) of every run in the matrix with the local trainer: the arms (A, B), the ablations of Arm B (config
# `ablations:`) and the RL extensions (config `extensions:` with trainer rl), each seed, each from its SFT
# checkpoint (predict.runs RunSpec.sft_run: its arm's, or its own). One job per run and seed; it resumes after a
# kill. (The RFT extensions: rft.smk.)
from predict.runs import checkpoint_steps

RL_RUNS = [r for r in study_runs(WORKFLOW_CONFIG) if resolve_run(WORKFLOW_CONFIG, r).trainer == "rl"]
RL_STEPS = checkpoint_steps(WORKFLOW_CONFIG.rl.steps, WORKFLOW_CONFIG.rl.checkpoint_every)

RL_RESULTS = expand(R("rl", "{run}", "seed{seed}", "metrics.parquet"), run=RL_RUNS, seed=WORKFLOW_CONFIG.seeds)


rule rl:
    input:
        tasks=R("data", "rl.parquet"),
        init=lambda w: R("checkpoints", resolve_run(WORKFLOW_CONFIG, w.run).sft_run, "sft"),  # the run's SFT folder
        serving=ancient(SERVING_CHECK),  # the colocated vLLM server's interpreter imports vLLM
    output:
        metrics=R("rl", "{run}", "seed{seed}", "metrics.parquet"),
        checkpoints=[directory(R("rl", "{run}", "seed{seed}", f"step{n}")) for n in RL_STEPS],
    wildcard_constraints:
        run="|".join(RL_RUNS),
        seed=r"\d+",
    params:
        **SLICE("rl"),
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        **PLANNED(RL_RESOURCES),
    log:
        LOG("rl", "{run}", "seed{seed}"),
    benchmark:
        BENCH("rl", "{run}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rl --planned {resources.planned_s} --config-slice {params.config:q} --run {wildcards.run}"
        " --seed {wildcards.seed} --init {input.init:q} --tasks-file {input.tasks:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"

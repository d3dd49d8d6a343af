# The RFT extensions (config `extensions:` with trainer rft), with either training backend: rejection-sampling
# fine-tuning (src/predict/train/rft.py) runs on our trainer, one GPU (or the CPU) beside a vLLM server: G rollouts
# per rl task from the run's SFT checkpoint, SFT on the reward-1 ones for rl.steps optimizer steps; checkpoints and
# metrics where an RL run has them.
from predict.runs import checkpoint_steps

RFT_RUNS = [r for r in study_runs(WORKFLOW_CONFIG) if resolve_run(WORKFLOW_CONFIG, r).trainer == "rft"]
RFT_RESULTS = expand(R("rl", "{run}", "seed{seed}", "metrics.parquet"), run=RFT_RUNS, seed=WORKFLOW_CONFIG.seeds)


rule rft:
    input:
        tasks=R("data", "rl.parquet"),
        init=lambda w: R("checkpoints", resolve_run(WORKFLOW_CONFIG, w.run).sft_run, "sft"),
        serving=ancient(SERVING_CHECK),  # the vLLM server's interpreter imports vLLM
    output:
        metrics=R("rl", "{run}", "seed{seed}", "metrics.parquet"),
        checkpoints=[directory(R("rl", "{run}", "seed{seed}", f"step{n}")) for n in checkpoint_steps(WORKFLOW_CONFIG.rl.steps, WORKFLOW_CONFIG.rl.checkpoint_every)],
    wildcard_constraints:
        run="|".join(RFT_RUNS) or "^$",
        seed=r"\d+",
    params:
        **SLICE("rft"),
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        **PLANNED(RL_RESOURCES),
    log:
        LOG("rft", "{run}", "seed{seed}"),
    benchmark:
        BENCH("rft", "{run}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rft --planned {resources.planned_s} --config-slice {params.config:q} --run {wildcards.run}"
        " --seed {wildcards.seed} --init {input.init:q} --tasks-file {input.tasks:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"

# Rollouts of a checkpoint in the coding environment, one parquet row per trajectory.
# Non-test splits only, at the training temperature; greedy evaluation and the one test evaluation are in
# evaluation.smk.


rule rollout:
    input:
        tasks=R("data", "{split}.parquet"),
        model=checkpoint_inputs,
        serving=ancient(SERVING_CHECK),
    output:
        R("rollouts", "{arm}", "{checkpoint}", "{split}", "seed{seed}.parquet"),
    wildcard_constraints:
        split="sft|rl|val",
    params:
        model=lambda w: checkpoint_model(w.arm, w.checkpoint, w.seed),
        **SLICE("rollout"),  # env.rollout_tasks: how many tasks (the stage reads it)
    resources:
        **PLANNED(SERVING_RESOURCES),
    log:
        LOG("rollout", "{arm}", "{checkpoint}", "{split}", "seed{seed}"),
    benchmark:
        BENCH("rollout", "{arm}", "{checkpoint}", "{split}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rollout --planned {resources.planned_s} --config-slice {params.config:q}"
        " --tasks-file {input.tasks:q} --split {wildcards.split}"
        " --model {params.model:q} --checkpoint {wildcards.checkpoint} --arm {wildcards.arm}"
        " --seed {wildcards.seed} --out {output:q} > {log:q} 2>&1"

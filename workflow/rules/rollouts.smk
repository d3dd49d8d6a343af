# Rollouts of a checkpoint in the coding environment, one parquet row per trajectory.
# Non-test splits only; the test split has its own explicit target below and is never part of `all`.


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
        model=checkpoint_model,
        config=CONFIG_JSON,
        n_tasks=N_TASKS_ARG,
    resources:
        **SERVING_RESOURCES,
    log:
        LOG("rollout", "{arm}", "{checkpoint}", "{split}", "seed{seed}"),
    benchmark:
        BENCH("rollout", "{arm}", "{checkpoint}", "{split}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rollout --config-json {params.config:q} --tasks {input.tasks:q} --split {wildcards.split}"
        " --model {params.model:q} --checkpoint {wildcards.checkpoint} --arm {wildcards.arm}"
        " --seed {wildcards.seed} {params.n_tasks} --out {output:q} > {log:q} 2>&1"


# The one evaluation on the test split: `snakemake results/test/<arm>/<checkpoint>/seed<seed>.parquet`.
# The stage records it in results/test/ledger.jsonl and refuses to evaluate the same thing twice.
rule evaluate_test:
    input:
        tasks=R("data", "test.parquet"),
        model=checkpoint_inputs,
        serving=ancient(SERVING_CHECK),
    output:
        R("test", "{arm}", "{checkpoint}", "seed{seed}.parquet"),
    params:
        model=checkpoint_model,
        config=CONFIG_JSON,
        ledger=R("test", "ledger.jsonl"),
    resources:
        **SERVING_RESOURCES,
    log:
        LOG("evaluate_test", "{arm}", "{checkpoint}", "seed{seed}"),
    benchmark:
        BENCH("evaluate_test", "{arm}", "{checkpoint}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict rollout --config-json {params.config:q} --tasks {input.tasks:q} --split test"
        " --model {params.model:q} --checkpoint {wildcards.checkpoint} --arm {wildcards.arm}"
        " --seed {wildcards.seed} --test-ledger {params.ledger:q} --out {output:q} > {log:q} 2>&1"

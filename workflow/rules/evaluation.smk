# Greedy pass@1 evaluation (the `evaluation` config section) of every run x checkpoint x seed on val, and the one
# evaluation on the test split. Which runs and checkpoints exist: EVAL_RUNS / EVAL_CHECKPOINTS in common.smk.


rule evaluate:
    input:
        tasks=R("data", "{split}.parquet"),
        model=checkpoint_inputs,
        serving=ancient(SERVING_CHECK),
    output:
        R("eval", "{run}", "{checkpoint}", "{split}", "seed{seed}.parquet"),
    wildcard_constraints:
        split="val",
        checkpoint=r"base|sft|step\d+",
    params:
        model=lambda w: checkpoint_model(w.run, w.checkpoint, w.seed),
        config=CONFIG_JSON,
    resources:
        **SERVING_RESOURCES,
    log:
        LOG("evaluate", "{run}", "{checkpoint}", "{split}", "seed{seed}"),
    benchmark:
        BENCH("evaluate", "{run}", "{checkpoint}", "{split}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict evaluate --config-json {params.config:q} --tasks {input.tasks:q} --split {wildcards.split}"
        " --model {params.model:q} --run {wildcards.run} --checkpoint {wildcards.checkpoint}"
        " --seed {wildcards.seed} --out {output:q} > {log:q} 2>&1"


# The one evaluation on the test split: `snakemake results/test/<run>/<checkpoint>/seed<seed>.parquet`, for the
# checkpoint that selection (on val only) chose. The stage refuses any other checkpoint and a second evaluation,
# and records the config hash and the selection in results/test/ledger.jsonl. Nothing in `all` reads test.
rule evaluate_test:
    input:
        tasks=R("data", "test.parquet"),
        model=checkpoint_inputs,
        serving=ancient(SERVING_CHECK),
        selection=R("stats", "selection.parquet"),
    output:
        R("test", "{run}", "{checkpoint}", "seed{seed}.parquet"),
    params:
        model=lambda w: checkpoint_model(w.run, w.checkpoint, w.seed),
        config=CONFIG_JSON,
        ledger=R("test", "ledger.jsonl"),
    resources:
        **SERVING_RESOURCES,
    log:
        LOG("evaluate_test", "{run}", "{checkpoint}", "seed{seed}"),
    benchmark:
        BENCH("evaluate_test", "{run}", "{checkpoint}", "seed{seed}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict evaluate --config-json {params.config:q} --tasks {input.tasks:q} --split test"
        " --model {params.model:q} --run {wildcards.run} --checkpoint {wildcards.checkpoint}"
        " --seed {wildcards.seed} --selection {input.selection:q} --test-ledger {params.ledger:q}"
        " --out {output:q} > {log:q} 2>&1"

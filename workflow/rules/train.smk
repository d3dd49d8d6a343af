# Training: SFT of the base model on each arm's traces -> results/checkpoints/{arm}/sft/ (HF folder); `{arm}` is any
# run with an SFT of its own (predict.runs sft_runs: the arms, and the runs whose traces are their own).
# The trainer saves a resumable state under results/sft/{arm}/state/ (not an output: it survives a killed job, and
# the rerun continues from it); the checkpoint folder appears atomically at the end.


rule train_sft:
    input:
        traces=R("sft", "traces", "{arm}.parquet"),
        model=lambda w: [base_model_path()] if WORKFLOW_CONFIG.model.base == "tiny" else [],
    output:
        checkpoint=directory(R("checkpoints", "{arm}", "sft")),
        metrics=R("sft", "{arm}", "metrics.parquet"),
    params:
        base=lambda w: base_model_path(),
        state=lambda w: R("sft", w.arm, "state"),
        **SLICE("sft"),
    threads: TRAIN_THREADS
    resources:
        **PLANNED(TRAIN_RESOURCES),
    log:
        LOG("train_sft", "{arm}"),
    benchmark:
        BENCH("train_sft", "{arm}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict sft --planned {resources.planned_s} --config-slice {params.config:q} --arm {wildcards.arm}"
        " --traces {input.traces:q} --base-model {params.base:q} --out-dir {output.checkpoint:q}"
        " --metrics-out {output.metrics:q}"
        " --state-dir {params.state:q} --threads {threads} > {log:q} 2>&1"

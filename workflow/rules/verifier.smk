# The verifier report: every gold solution of the non-test splits through the sandbox.

VERIFIER = CONFIG("verify-gold")["verifier"]


rule verify_gold:
    input:
        splits=expand(R("data", "{split}.parquet"), split=VERIFIER["gold_splits"]),
    output:
        report=R("verifier", "gold.parquet"),
        summary=R("verifier", "gold_summary.parquet"),
    params:
        data_dir=lambda w, input: os.path.dirname(input.splits[0]),
        splits=" ".join(VERIFIER.get("gold_splits", ["sft", "rl", "val"])),
        v=VERIFIER,
        isolation=isolation_args(CONFIG("verify-gold")),
    threads: VERIFIER["workers"]
    resources:
        mem_mb=4000,
        runtime=30,
    log:
        LOG("verify_gold"),
    benchmark:
        BENCH("verify_gold")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict verify-gold --data-dir {params.data_dir:q} --splits {params.splits}"
        " --timeout-s {params.v[timeout_s]} --memory-mb {params.v[memory_mb]} --workers {threads}"
        " --outcome-labels {params.v[outcome_labels]} {params.isolation}"
        " --out {output.report:q} --summary-out {output.summary:q} > {log:q} 2>&1"

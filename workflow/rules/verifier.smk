# The verifier report: every gold solution of the non-test splits through the sandbox. `predict verify-gold` reads
# config verifier from its slice; --workers passes the job's threads (verifier.workers, or fewer where Snakemake has
# fewer cores).

VERIFIER = CONFIG("verify-gold").verifier


rule verify_gold:
    input:
        splits=expand(R("data", "{split}.parquet"), split=VERIFIER.gold_splits),
    output:
        report=R("verifier", "gold.parquet"),
        summary=R("verifier", "gold_summary.parquet"),
    params:
        data_dir=lambda w, input: os.path.dirname(input.splits[0]),
        **SLICE("verify-gold"),
    threads: VERIFIER.workers
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
        "predict verify-gold --config-slice {params.config:q} --data-dir {params.data_dir:q} --workers {threads}"
        " --out {output.report:q} --summary-out {output.summary:q} > {log:q} 2>&1"

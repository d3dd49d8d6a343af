# The study report: one self-contained HTML page from parquet only (src/predict/report/).


localrules:
    report,


rule report:
    input:
        stats=rules.stats.output,
        ablations=expand(R("ablations", "{ablation}.parquet"), ablation=list(ABLATIONS)),
        extensions=expand(R("extensions", "{extension}.parquet"), extension=list(EXTENSIONS)),
        power=rules.power.output,
        example=REPORT_EXAMPLE(),
        tasks=R("data", "val.parquet"),
        rl_metrics=RL_METRICS(),
        # the test campaign's statistics: the report opens with the test
        test_stats=rules.test_stats.output,
    output:
        report(R("report", "index.html"), caption="../report/study.rst", category="Study report"),
    params:
        **SLICE("report"),
        stats_dir=lambda w, input: os.path.dirname(input.stats[0]),
        test_stats_dir=lambda w, input: os.path.dirname(input.test_stats[0]),
        ablations=lambda w, input: " ".join(f"'{p}'" for p in input.ablations),
        extensions=lambda w, input: " ".join(f"'{p}'" for p in input.extensions),
        rl_metrics=lambda w, input: " ".join(f"'{p}'" for p in input.rl_metrics),
    log:
        LOG("report"),
    benchmark:
        BENCH("report")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict report --config-slice {params.config:q} --stats-dir {params.stats_dir:q}"
        " --test-stats {params.test_stats_dir:q}"
        " --ablations {params.ablations} --extensions {params.extensions} --power {input.power:q} --example {input.example:q}"
        " --tasks-file {input.tasks:q} --rl-metrics {params.rl_metrics} --out {output:q} > {log:q} 2>&1"

# The study report: one self-contained HTML page from parquet only (src/predict/report/).


localrules:
    report,


rule report:
    input:
        stats=rules.stats.output,
        ablations=expand(R("ablations", "{ablation}.parquet"), ablation=list(ABLATIONS)),
        power=rules.power.output,
        example=REPORT_EXAMPLE(),
        tasks=R("data", "val.parquet"),
        rl_metrics=RL_METRICS(),
    output:
        R("report", "index.html"),
    params:
        config=CONFIG_JSON,
        stats_dir=lambda w, input: os.path.dirname(input.stats[0]),
        ablations=lambda w, input: " ".join(f"'{p}'" for p in input.ablations),
        rl_metrics=lambda w, input: " ".join(f"'{p}'" for p in input.rl_metrics),
    log:
        LOG("report"),
    benchmark:
        BENCH("report")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict report --config-json {params.config:q} --stats-dir {params.stats_dir:q}"
        " --ablations {params.ablations} --power {input.power:q} --example {input.example:q}"
        " --tasks {input.tasks:q} --rl-metrics {params.rl_metrics} --out {output:q} > {log:q} 2>&1"

# Statistics from the val evaluations (src/predict/stats.py): tables, one file per ablation, the power table.


localrules:
    stats,
    ablation,
    power,


rule stats:
    input:
        EVALS(),
    output:
        **{name: R("stats", f"{name}.parquet") for name in ("metrics", "pairs", "confusion", "classes", "selection")},
    params:
        config=CONFIG_JSON,
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    log:
        LOG("stats"),
    benchmark:
        BENCH("stats")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict stats --config-json {params.config:q} --eval {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# `snakemake results/ablations/forced_keep.parquet` builds exactly what it needs: the val evaluations of the
# ablation, its base arm (selection) and Arm A (the deficit), nothing else.
rule ablation:
    input:
        lambda w: EVALS([w.ablation, run_arm(w.ablation), *(["A"] if "A" in config["arms"] else [])]),
    output:
        R("ablations", "{ablation}.parquet"),
    wildcard_constraints:
        ablation="|".join(ABLATIONS) or "^$",
    params:
        config=CONFIG_JSON,
    log:
        LOG("ablation", "{ablation}"),
    benchmark:
        BENCH("ablation", "{ablation}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict ablations --config-json {params.config:q} --ablation {wildcards.ablation}"
        " --eval {input:q} --out {output:q} > {log:q} 2>&1"


rule power:
    input:
        pairs=R("stats", "pairs.parquet"),
    output:
        R("stats", "power.parquet"),
    params:
        config=CONFIG_JSON,
    log:
        LOG("power"),
    benchmark:
        BENCH("power")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict power --config-json {params.config:q} --pairs {input.pairs:q} --out {output:q} > {log:q} 2>&1"

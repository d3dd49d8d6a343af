# Checkpoints: the base model, which for the local run is a tiny random Qwen3 built here (config model.tiny).


rule build_tiny_model:
    output:
        directory(R("models", "tiny")),
    params:
        **SLICE("build-tiny-model"),
    log:
        LOG("build_tiny_model"),
    benchmark:
        BENCH("build_tiny_model")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict build-tiny-model --config-slice {params.config:q} --out-dir {output:q} > {log:q} 2>&1"

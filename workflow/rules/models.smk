# Checkpoints: the base model, which for the local run is a tiny random Qwen3 built here.


rule build_tiny_model:
    output:
        directory(R("models", "tiny")),
    params:
        tiny=TINY,
    log:
        LOG("build_tiny_model"),
    benchmark:
        BENCH("build_tiny_model")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict build-tiny-model --out-dir {output:q} --seed {params.tiny[seed]}"
        " --hidden-size {params.tiny[hidden_size]} --num-layers {params.tiny[num_layers]} > {log:q} 2>&1"

# MBPP -> the seed-42 split. The test split is written here but read only by the explicit
# test-evaluation target, never as a side effect of `all`. MBPP's path, its hash, the seed and the sizes: config
# data, which `predict split` reads from its slice.
from predict.data import SPLITS


localrules:
    split_mbpp,


rule split_mbpp:
    output:
        splits=expand(R("data", "{split}.parquet"), split=SPLITS),
        manifest=R("data", "manifest.json"),
    params:
        **SLICE("split"),
        out_dir=lambda w, output: os.path.dirname(output.manifest),
    log:
        LOG("split_mbpp"),
    benchmark:
        BENCH("split_mbpp")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict split --config-slice {params.config:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"

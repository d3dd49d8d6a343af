# MBPP -> the seed-42 split. The test split is written here but read only by the explicit
# test-evaluation target, never as a side effect of `all`.
from predict.data import SPLITS

DATA = CONFIG("split")["data"]


localrules:
    split_mbpp,


rule split_mbpp:
    output:
        splits=expand(R("data", "{split}.parquet"), split=SPLITS),
        manifest=R("data", "manifest.json"),
    params:
        mbpp=DATA["mbpp_path"],
        hf_fallback="--hf-fallback" if DATA.get("hf_fallback") else "",
        sha256=f"--mbpp-sha256 {DATA['mbpp_sha256']}" if DATA.get("mbpp_sha256") else "",
        seed=DATA["split_seed"],
        sizes=DATA["sizes"],
        out_dir=lambda w, output: os.path.dirname(output.manifest),
    log:
        LOG("split_mbpp"),
    benchmark:
        BENCH("split_mbpp")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict split --mbpp {params.mbpp:q} {params.hf_fallback} {params.sha256} --seed {params.seed}"
        " --sft {params.sizes[sft]} --rl {params.sizes[rl]} --test {params.sizes[test]}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"

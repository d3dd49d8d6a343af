# SFT traces: both arms' chat transcripts from the sft split's gold solutions and sandbox-verified mutants.
# One job writes every arm (they render one underlying trace), plus tasks.parquet (each task's role or why not).


rule sft_traces:
    input:
        tasks=R("data", "sft.parquet"),
    output:
        traces=expand(R("sft", "traces", "{arm}.parquet"), arm=sorted(config["arms"])),
        tasks=R("sft", "traces", "tasks.parquet"),
    params:
        **SLICE("traces"),
        out_dir=lambda w, output: os.path.dirname(output.tasks),
    threads: config["verifier"]["workers"]
    resources:
        mem_mb=4000,
        runtime=30,
    log:
        LOG("sft_traces"),
    benchmark:
        BENCH("sft_traces")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict traces --config-slice {params.config:q} --tasks-file {input.tasks:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"

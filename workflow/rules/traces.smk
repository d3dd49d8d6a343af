# SFT traces: both arms' chat transcripts from the sft split's gold solutions and sandbox-verified mutants.
# One job writes every arm (they render one underlying trace), plus tasks.parquet (each task's role or why not).


rule sft_traces:
    input:
        tasks=R("data", "sft.parquet"),
    output:
        traces=expand(R("sft", "traces", "{arm}.parquet"), arm=sorted(WORKFLOW_CONFIG.arms)),
        tasks=R("sft", "traces", "tasks.parquet"),
    params:
        **SLICE("traces"),
        out_dir=lambda w, output: os.path.dirname(output.tasks),
    threads: WORKFLOW_CONFIG.verifier.workers
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


# A run with its own SFT (predict.runs RunSpec.sft_run: the irreversible and blind extensions): its base arm's
# traces re-rendered under the run's own protocol (no sandbox: the verdicts are the base arm's file's).
OWN_SFT_RUNS = [r for r in sft_runs(WORKFLOW_CONFIG) if r not in WORKFLOW_CONFIG.arms]


rule run_traces:
    input:
        arm_traces=lambda w: R("sft", "traces", f"{resolve_run(WORKFLOW_CONFIG, w.run).arm}.parquet"),
        tasks=R("data", "sft.parquet"),
    output:
        R("sft", "traces", "{run}.parquet"),
    wildcard_constraints:
        run="|".join(OWN_SFT_RUNS) or "^$",
    params:
        **SLICE("run-traces"),
    resources:
        mem_mb=2000,
        runtime=10,
    log:
        LOG("run_traces", "{run}"),
    benchmark:
        BENCH("run_traces", "{run}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict run-traces --config-slice {params.config:q} --run {wildcards.run} --arm-traces {input.arm_traces:q}"
        " --tasks-file {input.tasks:q} --out {output:q} > {log:q} 2>&1"

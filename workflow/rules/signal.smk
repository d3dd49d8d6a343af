# The learning-signal run (issue 17; src/predict/train/learning_signal.py): does training through the study's code paths move a
# model? A tiny Qwen3 SFT'd to a partial solver, then GRPO per seed, an lr-0 control and Arm B at alpha 1 vs 0, all on
# one vLLM server. A sanity check beside the study, not part of `all`:
#   snakemake --profile workflow/profiles/local results/signal/verdicts.parquet


rule signal:
    input:
        serving=SERVING_CHECK,
    output:
        curves=R("signal", "curves.parquet"),
        verdicts=R("signal", "verdicts.parquet"),
        figure=R("signal", "signal.png"),
    params:
        **SLICE("signal"),
        out_dir=lambda w, output: os.path.dirname(output.curves),
    resources:
        **PLANNED(RL_RESOURCES),
    log:
        LOG("signal"),
    benchmark:
        BENCH("signal")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict signal --planned {resources.planned_s} --config-slice {params.config:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"

# The study report: one self-contained HTML page from parquet only (src/predict/report/).


localrules:
    inspect_logs,
    report,
    training_outcomes,


# The run's own plan (`predict plan`, docs/plan.md: Snakemake's dry-run of `all`, each job priced on the device
# kind's calibration), made beside the first jobs; the report puts it beside each job's benchmark file. Only where
# the kind has a calibration (LIMITS, common.smk). It plans the run's config files (a --config override given on the
# command line is not in them) on the local profile's layout, or one GPU node's.
PLAN = {"json": R("plan", "plan.json"), "table": R("plan", "plan.parquet")} if LIMITS.priced else {}
# The config files reach the job in a list file its input takes as ancient(), not as a param: a param (or a changed
# input) is a rerun trigger, and the plan, which reads the whole config, would then rerun on every edit (and on the
# same config under another file name). It is made once, before the run; the report reads it as that: the plan the
# run started from.
PLAN_CONFIG_LIST = SLICES / "plan-config-files.txt"
if PLAN:
    from predict.outputs import write_text

    _files = "+".join(map(str, workflow.overwrite_configfiles or workflow.configfiles)) + "\n"
    if not PLAN_CONFIG_LIST.is_file() or PLAN_CONFIG_LIST.read_text() != _files:
        write_text(_files, PLAN_CONFIG_LIST)

    localrules:
        plan,

    rule plan:
        input:
            config_files=ancient(str(PLAN_CONFIG_LIST)),
        output:
            **PLAN,
        params:
            profile="local" if CPU_SERVING else "gpu",
            kind=LIMITS.kind,
        log:
            LOG("plan"),
        benchmark:
            BENCH("plan")
        conda:
            "../../envs/pipeline.yaml"
        shell:
            'predict plan --config "$(cat {input.config_files:q})" --profile {params.profile} --device {params.kind}'
            " --out {output.json:q} > {log:q} 2>&1"


# The writeup's training-outcome table: verified vs predicted class shares over all RL steps of each predictive run.
rule training_outcomes:
    input:
        rl_metrics=RL_METRICS(),
    output:
        R("stats", "training_outcomes.parquet"),
    params:
        **SLICE("training-outcomes"),  # empty: every stage takes a slice, this one reads nothing from it
        rl_metrics=lambda w, input: " ".join(f"'{p}'" for p in input.rl_metrics),
    log:
        LOG("training_outcomes"),
    benchmark:
        BENCH("training_outcomes")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict training-outcomes --config-slice {params.config:q} --rl-metrics {params.rl_metrics}"
        " --out {output:q} > {log:q} 2>&1"


rule report:
    input:
        stats=rules.stats.output,
        ablations=expand(R("ablations", "{ablation}.parquet"), ablation=list(WORKFLOW_CONFIG.ablations)),
        extensions=expand(R("extensions", "{extension}.parquet"), extension=list(WORKFLOW_CONFIG.extensions)),
        open_question=rules.open_question.output[0],
        power=rules.power.output,
        example=REPORT_EXAMPLE,
        tasks=R("data", "test.parquet"),
        rl_metrics=RL_METRICS(),
        # the test campaign's statistics: the report opens with the test
        test_stats=rules.test_stats.output,
        training_outcomes=rules.training_outcomes.output[0],
        **({"plan": PLAN["table"]} if PLAN else {}),
    output:
        html=report(R("report", "index.html"), caption="../report/study.rst", category="Study report"),
        # the plan beside each job's Snakemake benchmark (predict.report.run_costs)
        **({"plan_vs_run": R("report", "plan_vs_run.parquet")} if PLAN else {}),
    params:
        **SLICE("report"),
        stats_dir=lambda w, input: os.path.dirname(input.stats[0]),
        test_stats_dir=lambda w, input: os.path.dirname(input.test_stats[0]),
        ablations=lambda w, input: " ".join(f"'{p}'" for p in input.ablations),
        extensions=lambda w, input: " ".join(f"'{p}'" for p in input.extensions),
        rl_metrics=lambda w, input: " ".join(f"'{p}'" for p in input.rl_metrics),
        plan_vs_run=lambda w, input, output: (
            f"--plan '{input.plan}' --benchmarks '{R('benchmarks')}' --plan-vs-run-out '{output.plan_vs_run}'"
            if PLAN
            else ""
        ),
    log:
        LOG("report"),
    benchmark:
        BENCH("report")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict report --config-slice {params.config:q} --stats-dir {params.stats_dir:q}"
        " --test-stats {params.test_stats_dir:q}"
        " --ablations {params.ablations} --extensions {params.extensions} --open-question {input.open_question:q}"
        " --power {input.power:q} --example {input.example:q}"
        " --tasks-file {input.tasks:q} --rl-metrics {params.rl_metrics}"
        " --training-outcomes {input.training_outcomes:q} {params.plan_vs_run} --out {output.html:q} > {log:q} 2>&1"


# Every episode browsable (src/predict/inspect_logs/, docs/inspect-logs.md): each val and test evaluation as one Inspect
# log under results/inspect/, the arms paired task by task; read with `.venv/bin/inspect view --log-dir results/inspect`.
# Test evaluations go in only as the campaign ledger records them (the stage checks; the ledger is no param, as for the
# campaign's own jobs). The output is Inspect's manifest of the folder, written last: the stage replaces the folder
# whole, so a log of an earlier design never survives beside the new ones.
rule inspect_logs:
    input:
        evals=lambda w: EVALS() + TEST_EVALS(w),
        tasks=[R("data", "val.parquet"), R("data", "test.parquet")],
    output:
        R("inspect", "logs.json"),
    params:
        **SLICE("inspect-logs"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
    log:
        LOG("inspect_logs"),
    benchmark:
        BENCH("inspect_logs")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict inspect-logs --config-slice {params.config:q} --evals {input.evals:q} --tasks-file {input.tasks:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"

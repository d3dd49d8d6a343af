# Statistics (src/predict/stats/), one code path for both splits: from the val evaluations (tables, the checkpoint
# selection, one file per ablation and per extension, the power table) and from the test campaign's evaluations
# (results/test/stats/, read against the val selection). Table names: STATS_TABLES, TEST_STATS_TABLES.
from predict.stats.open_question import OPEN_QUESTION, family_size
from predict.runs import environments
from predict.stats import STATS_TABLES, TEST_STATS_TABLES


localrules:
    stats,
    test_stats,
    ablation,
    extension,
    open_question,
    power,


# A checkpoint: with evaluation.selection.mode best_val the test campaign's jobs are known once selection.parquet is.
checkpoint stats:
    input:
        EVALS(),
    output:
        **{
            name: report(R("stats", f"{name}.parquet"), caption="../report/stats.rst", category="Statistics tables")
            for name in STATS_TABLES
        },
    params:
        **SLICE("stats"),
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    log:
        LOG("stats"),
    benchmark:
        BENCH("stats")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict stats --config-slice {params.config:q} --eval {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# The test campaign's statistics: `snakemake test` (and the end of `all`). The stage holds its inputs against the
# checkout's campaign ledger: only files the campaign recorded done, its whole plan, selection and statistics settings.
rule test_stats:
    input:
        evals=TEST_EVALS,
        selection=R("stats", "selection.parquet"),
    output:
        **{
            name: report(R("test", "stats", f"{name}.parquet"), caption="../report/test_stats.rst", category="Test")
            for name in (*TEST_STATS_TABLES, OPEN_QUESTION)  # the open question's test table (open_question.py)
        },
    params:
        **SLICE("stats"),
        out_dir=lambda w, output: os.path.dirname(output.metrics),
    log:
        LOG("test_stats"),
    benchmark:
        BENCH("test_stats")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict stats --config-slice {params.config:q} --eval {input.evals:q} --selection {input.selection:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


# `snakemake results/ablations/forced_keep.parquet` builds exactly what it needs: the val evaluations of the
# ablation, its base arm (selection) and Arm A (the deficit), nothing else.
rule ablation:
    input:
        lambda w: EVALS([w.ablation, run_arm(w.ablation), *(["A"] if "A" in WORKFLOW_CONFIG.arms else [])]),
    output:
        report(R("ablations", "{ablation}.parquet"), caption="../report/ablations.rst", category="Ablations"),
    wildcard_constraints:
        ablation="|".join(WORKFLOW_CONFIG.ablations) or "^$",
    params:
        **SLICE("ablations"),
    log:
        LOG("ablation", "{ablation}"),
    benchmark:
        BENCH("ablation", "{ablation}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict ablations --config-slice {params.config:q} --ablation {wildcards.ablation}"
        " --eval {input:q} --out {output:q} > {log:q} 2>&1"


# One table per extension run (issue #11): its val evaluations vs Arm A and Arm B (and, for expensive tests, the
# other arm at the same test cost), a row per seed with the pairs and its mechanism metric.
rule extension:
    input:
        lambda w: EXTENSION_EVALS(w.extension),
    output:
        report(R("extensions", "{extension}.parquet"), caption="../report/extensions.rst", category="Extensions"),
    wildcard_constraints:
        extension="|".join(WORKFLOW_CONFIG.extensions) or "^$",
    params:
        **SLICE("extensions"),
    log:
        LOG("extension", "{extension}"),
    benchmark:
        BENCH("extension", "{extension}")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict extensions --config-slice {params.config:q} --extension {wildcards.extension}"
        " --eval {input:q} --out {output:q} > {log:q} 2>&1"


# The open question (issue 28; src/predict/open_question.py): Arm B vs Arm A within each environment both protocols
# play (predict.runs.environments: the study, expensive tests, irreversible, blind), on val; only those runs' val
# evaluations. The test's table is results/test/stats/open_question.parquet (test_stats, through the ledger).
ENVIRONMENTS = environments(CONFIG("open-question"))
if OPEN_QUESTION in WORKFLOW_CONFIG.extensions:
    raise WorkflowError(f"extensions.{OPEN_QUESTION}: the name is the open question's table, pick another")


rule open_question:
    input:
        EVALS([run for env in ENVIRONMENTS for run in env.runs]) if ENVIRONMENTS else [],
    output:
        report(R("extensions", f"{OPEN_QUESTION}.parquet"), caption="../report/open_question.rst", category="Extensions"),
    params:
        **SLICE("open-question"),
    log:
        LOG("open_question"),
    benchmark:
        BENCH("open_question")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict open-question --config-slice {params.config:q} --eval {input:q} --out {output:q} > {log:q} 2>&1"


rule power:
    input:
        pairs=R("stats", "pairs.parquet"),
    output:
        report(R("stats", "power.parquet"), caption="../report/power.rst", category="Statistics tables"),
    params:
        **SLICE("power"),
        open_question_family=family_size(ENVIRONMENTS, CONFIG("power").seeds),
    log:
        LOG("power"),
    benchmark:
        BENCH("power")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict power --config-slice {params.config:q} --pairs {input.pairs:q}"
        " --open-question-family {params.open_question_family} --out {output:q} > {log:q} 2>&1"

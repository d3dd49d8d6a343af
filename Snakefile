# PREDICT: "Reactive vs. Predictive Post-Training for Coding Agents", from raw MBPP to the tables.
#   snakemake --profile workflow/profiles/local all   # the embedded default: tiny Qwen3 on CPU
#   snakemake --profile slurm all                      # the paper design on a GPU cluster
# Rules are thin: each calls one `predict <stage>`; the logic lives in src/predict.
from snakemake.utils import min_version

min_version("9.0")


# The embedded default, unless a profile or --configfile names another (no merging of the two).
if not workflow.overwrite_configfiles:

    configfile: "config/local.yaml"


# Snakemake's own report (`snakemake --report results/report.zip` after a run): the outputs marked report().
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/serving.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/verifier.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/rollouts.smk"
include: "workflow/rules/traces.smk"
# Training before evaluation: evaluation asks which checkpoints some rule produces. The local trainer (rl.smk) or
# prime-rl on the cluster (prime_rl.smk, SFT included), by config `backend`.
if WORKFLOW_CONFIG.backend == "prime_rl":

    include: "workflow/rules/prime_rl.smk"

else:

    include: "workflow/rules/train.smk"
    include: "workflow/rules/rl.smk"


include: "workflow/rules/rft.smk"


include: "workflow/rules/evaluation.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/bundle.smk"
include: "workflow/rules/signal.smk"


localrules:
    all,
    design,
    test,


# Everything up to the checkpoint selection on val, never the test split: for iterating on the design.
rule design:
    input:
        rules.split_mbpp.output,
        rules.verify_gold.output,
        rules.sft_traces.output,
        # RL of every run and seed (and, on prime-rl, its SFT): the configured backend; RFT on our trainer
        rules.prime_rl_all.input if WORKFLOW_CONFIG.backend == "prime_rl" else RL_RESULTS,
        RFT_RESULTS,
        rules.stats.output,
        rules.power.output,
        expand(R("ablations", "{ablation}.parquet"), ablation=list(WORKFLOW_CONFIG.ablations)),
        expand(R("extensions", "{extension}.parquet"), extension=list(WORKFLOW_CONFIG.extensions)),
        rules.open_question.output,


# The test campaign alone: after selection on val, the test evaluations (once per frozen design: the checkout's
# ledger, .test-campaigns/ledger.jsonl) and their statistics, results/test/stats/.
rule test:
    input:
        rules.test_stats.output,


# The whole study: the design, the test campaign, the report and every episode as an Inspect log.
# The default target, so that plain `snakemake --report results/report.zip` reports the whole study.
rule all:
    default_target: True
    input:
        rules.design.input,
        rules.test.input,
        rules.report.output,
        rules.inspect_logs.output,

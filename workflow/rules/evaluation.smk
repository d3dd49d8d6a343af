# Greedy pass@1 evaluation (the `evaluation` config section), `predict evaluate`: per run and seed ONE job, one vLLM
# server, every checkpoint of the run (weights reloaded in place between them), one parquet per checkpoint:
#   val:  evaluate_<run>       -> results/eval/<run>/<checkpoint>/val/seed<seed>.parquet, EVAL_CHECKPOINTS
#   test: evaluate_test_<run>  -> results/eval/<run>/<checkpoint>/test/seed<seed>.parquet, the test campaign
# The test campaign (`snakemake test`) runs after selection on val; the stage asks results/test/ledger.jsonl first
# (one campaign per frozen design). Which runs and checkpoints: EVAL_RUNS, RUN_CHECKPOINTS, CAMPAIGN_CHECKPOINTS
# and TEST_EVALS in common.smk.


for _run in EVAL_RUNS():

    rule:
        name:
            f"evaluate_{_run}"
        input:
            tasks=R("data", "val.parquet"),
            models=evaluation_models(_run, RUN_CHECKPOINTS(_run)),
            serving=ancient(SERVING_CHECK),
        output:
            [R("eval", _run, checkpoint, "val", "seed{seed}.parquet") for checkpoint in RUN_CHECKPOINTS(_run)],
        params:
            run=_run,
            checkpoints=evaluation_args(_run, RUN_CHECKPOINTS(_run)),
            **SLICE("evaluate"),
        resources:
            **SERVING_RESOURCES,
        log:
            LOG("evaluate", _run, "val", "seed{seed}"),
        benchmark:
            BENCH("evaluate", _run, "val", "seed{seed}")
        conda:
            "../../envs/pipeline.yaml"
        shell:
            "predict evaluate --config-slice {params.config:q} --tasks-file {input.tasks:q} --split val"
            " --run {params.run} --seed {wildcards.seed} {params.checkpoints} > {log:q} 2>&1"


# The test campaign, after selection on val. The stage refuses, naming the ledger: an evaluation outside the
# campaign's list, a second evaluation, another config hash (src/predict/evaluate.py: TestLedger).
# A test evaluation reruns only when the frozen design (its slice: params) or its checkpoints change, and the ledger
# then stops the run. The val statistics are ancient() inputs: they must exist first, but `stats` rewriting them (a
# bootstrap edit, no new design) must not replan evaluations the ledger refuses to repeat. Sound, since what a test
# evaluation takes from them is which checkpoint to evaluate, and that is its output's path (fixed: from the config;
# best_val: TEST_EVALS reads the stats checkpoint, so another selection asks for other files, which the ledger refuses).
# The outputs are update(): Snakemake deletes a job's old outputs before running it, and a test evaluation cannot be
# redone, so a rerun the ledger refuses restores the frozen files instead of losing them.
TEST_CAMPAIGN_INPUTS = {
    "tasks": R("data", "test.parquet"),
    "selection": ancient(R("stats", "selection.parquet")),
    "val_metrics": ancient(R("stats", "metrics.parquet")),
    "serving": ancient(SERVING_CHECK),
}
TEST_CAMPAIGN_SHELL = (
    "predict evaluate --config-slice {params.config:q} --tasks-file {input.tasks:q} --split test --run {params.run}"
    " --seed {wildcards.seed} {params.checkpoints} --selection {input.selection:q}"
    " --val-metrics {input.val_metrics:q} --test-ledger {params.ledger:q} > {log:q} 2>&1"
)

if SELECTION_MODE == "fixed":
    # The selected step is known now: a run/seed's test checkpoints are one job, one server.
    for _run in EVAL_RUNS():

        rule:
            name:
                f"evaluate_test_{_run}"
            input:
                **TEST_CAMPAIGN_INPUTS,
                models=evaluation_models(_run, CAMPAIGN_CHECKPOINTS(_run)),
            output:
                [
                    update(R("eval", _run, checkpoint, "test", "seed{seed}.parquet"))
                    for checkpoint in CAMPAIGN_CHECKPOINTS(_run)
                ],
            params:
                run=_run,
                checkpoints=evaluation_args(_run, CAMPAIGN_CHECKPOINTS(_run)),
                **SLICE("evaluate-test"),
                ledger=TEST_LEDGER,
            resources:
                **SERVING_RESOURCES,
            log:
                LOG("evaluate_test", _run, "seed{seed}"),
            benchmark:
                BENCH("evaluate_test", _run, "seed{seed}")
            conda:
                "../../envs/pipeline.yaml"
            shell:
                TEST_CAMPAIGN_SHELL

else:
    # best_val: which step is chosen is known only after the val statistics (the `stats` checkpoint; TEST_EVALS
    # asks it), so each test checkpoint is its own job, its own server.

    rule evaluate_test:
        input:
            **TEST_CAMPAIGN_INPUTS,
            models=checkpoint_inputs,
        output:
            update(R("eval", "{run}", "{checkpoint}", "test", "seed{seed}.parquet")),
        wildcard_constraints:
            run="|".join(map(re.escape, EVAL_RUNS())),
            checkpoint=r"base|sft|step\d+",
        params:
            run=lambda w: w.run,
            checkpoints=lambda w, output: evaluation_args(w.run, [w.checkpoint])(w, output),
            **SLICE("evaluate-test"),
            ledger=TEST_LEDGER,
        resources:
            **SERVING_RESOURCES,
        log:
            LOG("evaluate_test", "{run}", "{checkpoint}", "seed{seed}"),
        benchmark:
            BENCH("evaluate_test", "{run}", "{checkpoint}", "seed{seed}")
        conda:
            "../../envs/pipeline.yaml"
        shell:
            TEST_CAMPAIGN_SHELL

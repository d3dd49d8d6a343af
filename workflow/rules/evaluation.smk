from types import SimpleNamespace

# Greedy pass@1 evaluation (the `evaluation` config section), `predict evaluate`: per run and seed ONE job, one vLLM
# server, every checkpoint of the run (weights reloaded in place between them), one parquet per checkpoint:
#   val:  evaluate_<run>       -> results/eval/<run>/<checkpoint>/val/seed<seed>.parquet, EVAL_CHECKPOINTS
#   test: evaluate_test_<run>  -> results/eval/<run>/<checkpoint>/test/seed<seed>.parquet, the test campaign
#         (evaluate_test_campaign: ONE job for the whole campaign when serving on the CPU)
# The test campaign (`snakemake test`) runs after selection on val; the stage asks the checkout's campaign ledger
# first (.test-campaigns/ledger.jsonl: one campaign per test split, base model and frozen design). Which runs and
# checkpoints: EVAL_RUNS, RUN_CHECKPOINTS, CAMPAIGN_CHECKPOINTS, TEST_REFERENCE and TEST_EVALS in common.smk.


# Generated, one rule per run of EVAL_RUNS(), named evaluate_<run>; for the paper design (config/config.yaml) and
# the embedded default (config/local.yaml) (tests/test_workflow_stats.py keeps this list the dry-run's):
#   rules: evaluate_A evaluate_B evaluate_alpha0 evaluate_forced_keep evaluate_budget_neutral
#   rules: evaluate_expensive_tests_A evaluate_expensive_tests_B evaluate_edit_on_revise evaluate_mask_decision
#   rules: evaluate_rft_A evaluate_rft_B evaluate_irreversible_A evaluate_irreversible_B evaluate_blind_A
#   rules: evaluate_blind_B
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
            **PLANNED(SERVING_RESOURCES, checkpoints=len(RUN_CHECKPOINTS(_run))),
        log:
            LOG("evaluate", _run, "val", "seed{seed}"),
        benchmark:
            BENCH("evaluate", _run, "val", "seed{seed}")
        conda:
            "../../envs/pipeline.yaml"
        shell:
            "predict evaluate --planned {resources.planned_s} --config-slice {params.config:q}"
            " --tasks-file {input.tasks:q} --split val"
            " --run {params.run} --seed {wildcards.seed} {params.checkpoints} > {log:q} 2>&1"


# The test campaign, after selection on val. The stage refuses, naming the ledger: an evaluation outside the
# campaign's list, a second evaluation, other weights on resume, an undeclared second campaign on the split
# (src/predict/campaign/admission.py: TestLedger).
# A test evaluation reruns only when the frozen design (its slice: params) or its checkpoints change, and the ledger
# then stops the run. The val statistics are ancient() inputs: they must exist first, but `stats` rewriting them (a
# fix of `predict stats` rerun, another pyarrow: no new design) must not replan evaluations the ledger refuses to repeat. Sound, since what a test
# evaluation takes from them is which checkpoint to evaluate, and that is its output's path (fixed: from the config;
# best_val: TEST_EVALS reads the stats checkpoint, so another selection asks for other files, which the ledger refuses).
# The outputs are update(): Snakemake deletes a job's old outputs before running it, and a test evaluation cannot be
# redone, so a rerun the ledger refuses restores the frozen files instead of losing them.
FIRST_SEED = SimpleNamespace(seed=WORKFLOW_CONFIG.seeds[0])  # the wildcards of the reference's one job
TEST_CAMPAIGN_INPUTS = {
    "tasks": R("data", "test.parquet"),
    "selection": ancient(R("stats", "selection.parquet")),
    "val_metrics": ancient(R("stats", "metrics.parquet")),
    "serving": ancient(SERVING_CHECK),
}
TEST_CAMPAIGN_SHELL = (
    "predict evaluate --planned {resources.planned_s} --config-slice {params.config:q}"
    " --tasks-file {input.tasks:q} --split test --run {params.run} --seed {params.seed} {params.checkpoints}"
    " --selection {input.selection:q}"
    " --val-metrics {input.val_metrics:q}"
    " > {log:q} 2>&1"
)

if SELECTION_MODE == "fixed" and CPU_SERVING:
    # The selected step is known now, and the CPU serves every job (the embedded default: one machine, one server at a
    # time, one request at a time in evaluation): jobs of their own would run one after another all the same, each
    # paying a process start-up, verifiers' import and a server start or lease (docs/wall-time.md). So the whole
    # campaign is one job: every run, seed and reference admitted together, evaluated through one server (weights
    # reloaded in place), one parquet per checkpoint as before. On GPUs each run/seed is a job of its own (below).

    rule evaluate_test_campaign:
        input:
            **TEST_CAMPAIGN_INPUTS,
            models=[m for run, c, seed in PLANNED_CAMPAIGN() for m in [checkpoint_model(run, c, seed)] if m.startswith(str(RESULTS))],
        output:
            [update(R("eval", run, c, "test", f"seed{seed}.parquet")) for run, c, seed in PLANNED_CAMPAIGN()],
        params:
            evaluations=lambda w, output: " ".join(
                f"--run {run} --seed {seed} --checkpoint {c} --model {shlex.quote(checkpoint_model(run, c, seed))}"
                f" --out {shlex.quote(out)}"
                for (run, c, seed), out in zip(PLANNED_CAMPAIGN(), output, strict=True)
            ),
            **SLICE("evaluate-test"),
        resources:
            **PLANNED(SERVING_RESOURCES, checkpoints=len(PLANNED_CAMPAIGN())),
        log:
            LOG("evaluate_test", "campaign"),
        benchmark:
            BENCH("evaluate_test", "campaign")
        conda:
            "../../envs/pipeline.yaml"
        shell:
            "predict evaluate --planned {resources.planned_s} --config-slice {params.config:q}"
            " --tasks-file {input.tasks:q} --split test {params.evaluations}"
            " --selection {input.selection:q} --val-metrics {input.val_metrics:q} > {log:q} 2>&1"

elif SELECTION_MODE == "fixed":
    # The selected step is known now: a run/seed's test checkpoints are one job, one server; an arm's reference is
    # one job of its own, under the first seed (it serves every seed's RL-vs-SFT comparison).
    # Generated, one rule per run whose reference checkpoint the campaign evaluates, named
    # evaluate_test_reference_<run>; for the paper design (config/config.yaml):
    #   rules: evaluate_test_reference_A evaluate_test_reference_B
    for _run in [r for r in EVAL_RUNS() if TEST_REFERENCE(r)]:

        rule:
            name:
                f"evaluate_test_reference_{_run}"
            input:
                **TEST_CAMPAIGN_INPUTS,
                models=lambda w, run=_run: evaluation_models(run, [TEST_REFERENCE(run)])(FIRST_SEED),
            output:
                update(R("eval", _run, TEST_REFERENCE(_run), "test", f"seed{WORKFLOW_CONFIG.seeds[0]}.parquet")),
            params:
                run=_run,
                seed=WORKFLOW_CONFIG.seeds[0],
                checkpoints=lambda w, output, run=_run: evaluation_args(run, [TEST_REFERENCE(run)])(
                    FIRST_SEED, output
                ),
                **SLICE("evaluate-test"),
            resources:
                **PLANNED(SERVING_RESOURCES),
            log:
                LOG("evaluate_test", _run, TEST_REFERENCE(_run)),
            benchmark:
                BENCH("evaluate_test", _run, TEST_REFERENCE(_run))
            conda:
                "../../envs/pipeline.yaml"
            shell:
                TEST_CAMPAIGN_SHELL

    # Generated, one rule per run with test checkpoints in the campaign, named evaluate_test_<run>; for the paper
    # design (config/config.yaml):
    #   rules: evaluate_test_A evaluate_test_B evaluate_test_alpha0 evaluate_test_forced_keep
    #   rules: evaluate_test_budget_neutral evaluate_test_expensive_tests_A evaluate_test_expensive_tests_B
    #   rules: evaluate_test_edit_on_revise evaluate_test_mask_decision evaluate_test_rft_A evaluate_test_rft_B
    #   rules: evaluate_test_irreversible_A evaluate_test_irreversible_B evaluate_test_blind_A evaluate_test_blind_B
    for _run in [r for r in EVAL_RUNS() if CAMPAIGN_CHECKPOINTS(r)]:

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
                seed=lambda w: w.seed,
                checkpoints=evaluation_args(_run, CAMPAIGN_CHECKPOINTS(_run)),
                **SLICE("evaluate-test"),
            resources:
                **PLANNED(SERVING_RESOURCES, checkpoints=len(CAMPAIGN_CHECKPOINTS(_run))),
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
            seed=lambda w: w.seed,
            checkpoints=lambda w, output: evaluation_args(w.run, [w.checkpoint])(w, output),
            **SLICE("evaluate-test"),
        resources:
            **PLANNED(SERVING_RESOURCES),
        log:
            LOG("evaluate_test", "{run}", "{checkpoint}", "seed{seed}"),
        benchmark:
            BENCH("evaluate_test", "{run}", "{checkpoint}", "seed{seed}")
        conda:
            "../../envs/pipeline.yaml"
        shell:
            TEST_CAMPAIGN_SHELL

"""The evaluation/statistics/report DAG: an ablation target pulls exactly what it needs, `design` stops at the val
selection, `test` is the campaign alone, and `all` ends in the report (dry-runs of the paper design under the slurm
profile and of the embedded default)."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


@functools.cache
def _dry_run_stdout(args: tuple[str, ...]) -> str:
    """`snakemake -n -F <args>`'s output, run once per distinct argument list in this module: several tests read the
    same plan (the paper's `all` five times), and a dry-run is a DAG build of several seconds on the 2-core CI.
    A string, so no test can change what another reads; a failed run is not cached (it raises)."""
    out = subprocess.run([SNAKEMAKE, "-n", "-F", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def job_counts(*args: str) -> dict[str, int]:
    table = _dry_run_stdout(args).split("Job stats:")[1].split("Reasons:")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def evaluation_jobs(counts: dict[str, int], split: str = "val") -> dict[str, int]:
    """{run: jobs} of the evaluation rules of a split (one job per run and seed: evaluate_<run>, evaluate_test_<run>)."""
    prefix = "evaluate_test_" if split == "test" else "evaluate_"
    return {rule.removeprefix(prefix): n for rule, n in counts.items()
            if rule.startswith(prefix) and (split == "test" or not rule.startswith("evaluate_test_"))}


def test_forced_keep_target_builds_exactly_what_it_needs() -> None:
    counts = job_counts("--profile", "slurm", "results/ablations/forced_keep.parquet")
    # val evaluations, one job per run and seed (all its checkpoints, one server): arms A (the deficit) and B (the
    # base arm), forced_keep (nothing of the test campaign); and the training they need on the paper's backend, prime-rl: its set-up, both arms'
    # SFT, the three runs' RL; check_serving before any serving job
    assert counts == {
        "split_mbpp": 1, "sft_traces": 1, "check_serving": 1, "prime_rl_setup": 1, "prime_rl_sft_config": 2,
        "prime_rl_sft": 2, "prime_rl_rl_config": 3 * 2, "prime_rl_rl": 3 * 2,
        "evaluate_A": 2, "evaluate_B": 2, "evaluate_forced_keep": 2, "ablation": 1,
    }


def test_paper_all_ends_in_the_report_with_every_ablation() -> None:
    counts = job_counts("--profile", "slurm", "all")
    assert counts["report"] == 1 and counts["ablation"] == 3 and counts["stats"] == 1 and counts["power"] == 1
    # one val job and one test job per run and seed: 19 runs x 2 seeds; and each arm's SFT once on test (issue 26)
    assert evaluation_jobs(counts) == {run: 2 for run in RUNS}
    assert evaluation_jobs(counts, "test") == {**{run: 2 for run in RUNS}, "reference_A": 1, "reference_B": 1}
    assert counts["test_stats"] == 1
    # GRPO runs (arms, ablations, RL extensions) on prime-rl; the RFT extensions on our trainer
    assert counts["prime_rl_rl"] == 13 * 2 and counts["rft"] == 2 * 2 and counts["extension"] == 10
    assert counts["open_question"] == 1
    # SFT: the arms', and the four open-question runs' own (issue 28), each from its own traces
    assert counts["prime_rl_sft"] == counts["prime_rl_sft_config"] == 2 + 4 and counts["run_traces"] == 4


OPEN_QUESTION = ["irreversible_A", "irreversible_B", "blind_A", "blind_B"]
EXTENSIONS = ["expensive_tests_A", "expensive_tests_B", "edit_on_revise", "mask_decision", "rft_A", "rft_B",
              *OPEN_QUESTION]
ABLATIONS = ["alpha0", "forced_keep", "budget_neutral"]
RUNS = ["A", "B", *ABLATIONS, *EXTENSIONS]


def dry_run(*args: str) -> str:
    return _dry_run_stdout(args)


def test_paper_all_includes_every_extension_run_table_and_report_input() -> None:
    text = dry_run("--profile", "slurm", "all")
    for run in EXTENSIONS:
        for seed in (42, 43):
            assert f"results/rl/{run}/seed{seed}/step100" in text, run
            assert f"results/eval/{run}/step100/val/seed{seed}.parquet" in text, run
            assert f"results/eval/{run}/sft/val/seed{seed}.parquet" not in text, run
        assert f"results/extensions/{run}.parquet" in text, run
    assert "predict rft " in text and "--run rft_B" in text and "--extensions " in text
    for arm in ("A", "B"):  # each arm's SFT is evaluated on test once, under the first seed, for every seed
        assert f"results/eval/{arm}/sft/test/seed42.parquet" in text and f"eval/{arm}/sft/test/seed43" not in text


def test_paper_all_plans_the_open_question_runs_from_their_own_sft() -> None:
    """Issue 28: irreversible_A/B and blind_A/B RL'd for both seeds, each from the SFT of its own traces (its base
    arm's traces re-rendered under its variant), evaluated on val and in the test campaign at the selected step."""
    text = dry_run("--profile", "slurm", "all")
    for run in OPEN_QUESTION:
        arm = run[-1]
        assert re.search(rf"predict run-traces .* --run {run} --arm-traces results/sft/traces/{arm}\.parquet "
                         rf"--tasks-file results/data/sft\.parquet --out results/sft/traces/{run}\.parquet", text), run
        assert f"--arm {run} --traces results/sft/traces/{run}.parquet" in text, run  # its own SFT config
        assert f"--checkpoint results/checkpoints/{run}/sft " in text, run
        for seed in (42, 43):
            assert re.search(rf"--run {run} --seed {seed} --tasks-file results/data/rl\.parquet "
                             rf"--model results/checkpoints/{run}/sft ", text), (run, seed)  # RL from its own SFT
            assert f"--out results/eval/{run}/step100/val/seed{seed}.parquet" in text, (run, seed)
            assert f"--out results/eval/{run}/step100/test/seed{seed}.parquet" in text, (run, seed)
        assert f"results/extensions/{run}.parquet" in text, run
    # every other run starts from its arm's SFT; no other run gets traces or an SFT of its own
    assert re.search(r"--run edit_on_revise --seed 42 --tasks-file results/data/rl\.parquet "
                     r"--model results/checkpoints/B/sft ", text)
    assert set(re.findall(r"--out results/sft/traces/(\w+)\.parquet", text)) == set(OPEN_QUESTION)


def test_local_all_runs_every_extension_at_its_last_step_only() -> None:
    counts = job_counts("all")
    # the open-question runs keep their arm's SFT locally (config/local.yaml: sft: base): no traces or SFT of their own
    assert counts["rl"] == 13 and counts["rft"] == 2 and counts["extension"] == 10 and counts["open_question"] == 1
    assert counts["train_sft"] == 2 and "run_traces" not in counts
    assert evaluation_jobs(counts) == {run: 1 for run in RUNS}  # one seed
    # served on the CPU: the test campaign is one job (issue 41), every run's selected step and each arm's reference,
    # one parquet each; the paper's (on GPUs) stays a job per run and seed
    assert evaluation_jobs(counts, "test") == {"campaign": 1}
    (campaign,) = re.findall(r"rule evaluate_test_campaign:\n(?:    .*\n)*?    output: (.*)", dry_run("all"))
    assert sorted(p.removesuffix(" (update)") for p in campaign.split(", ")) == sorted(
        [f"results/eval/{run}/step2/test/seed42.parquet" for run in RUNS]
        + [f"results/eval/{arm}/sft/test/seed42.parquet" for arm in ("A", "B")]
    )


def test_expensive_tests_table_pulls_the_other_arm_at_the_same_cost() -> None:
    text = dry_run("--profile", "slurm", "results/extensions/expensive_tests_B.parquet")
    for run in ("expensive_tests_A", "expensive_tests_B", "A", "B"):
        assert f"results/eval/{run}/step100/val/seed42.parquet" in text, run


def test_paper_test_target_is_the_campaign_at_the_selected_checkpoints() -> None:
    for target in ("test", "all"):
        text = dry_run("--profile", "slurm", target)
        for seed in (42, 43):
            for arm in ("A", "B"):  # the selected step per seed; the reference (SFT) once, under the first seed
                assert f"--out results/eval/{arm}/step100/test/seed{seed}.parquet" in text, arm
                assert (f"--out results/eval/{arm}/sft/test/seed{seed}.parquet" in text) == (seed == 42), arm
            for run in ABLATIONS + EXTENSIONS:  # the selected step only
                assert f"--out results/eval/{run}/step100/test/seed{seed}.parquet" in text, run
                assert f"results/eval/{run}/sft/test/seed{seed}.parquet" not in text, run
            for run in RUNS:  # nothing but the selected step and the reference
                assert f"results/eval/{run}/step50/test/seed{seed}.parquet" not in text, run
        # the stages find the checkout's campaign ledger themselves: never one under results/, never a param
        assert "--test-ledger" not in text and "--selection results/stats/selection.parquet" in text
        stats_job = next(line for line in text.splitlines() if "--out-dir results/test/stats" in line)
        # every test evaluation, nothing of val
        assert stats_job.count("/test/seed") == 2 * 2 + 2 + 2 * len(ABLATIONS + EXTENSIONS)
        assert "/val/" not in stats_job.split("--selection")[0]
        assert ("results/report/index.html" in text) == (target == "all")
    counts = job_counts("--profile", "slurm", "test")
    assert counts["test_stats"] == 1 and "report" not in counts and "ablation" not in counts


ENVIRONMENT_RUNS = ["A", "B", "expensive_tests_A", "expensive_tests_B", "irreversible_A", "irreversible_B", "blind_A",
                    "blind_B"]


def test_open_question_target_builds_only_what_it_needs() -> None:
    """Old code: no rule made results/extensions/open_question.parquet."""
    target = "results/extensions/open_question.parquet"
    counts = job_counts("--profile", "slurm", target)
    # the val evaluations of the four environments' two runs each, both seeds, and the training they need; nothing of
    # the other runs, of the other tables, of the test campaign
    assert evaluation_jobs(counts) == {run: 2 for run in ENVIRONMENT_RUNS}
    assert counts["open_question"] == 1 and counts["prime_rl_rl"] == len(ENVIRONMENT_RUNS) * 2
    assert not {"stats", "test_stats", "extension", "ablation", "power", "report", "rft", "verify_gold"} & set(counts)
    assert not [rule for rule in counts if rule.startswith("evaluate_test")]
    text = dry_run("--profile", "slurm", target)
    job = next(line for line in text.splitlines() if line.startswith("Shell command: predict open-question"))
    assert job.count("/val/seed") == 2 * (2 * 5 + 6 * 4) and "/test/" not in job  # arms: sft + 4 steps; others: 4
    # `all` plans it, the report reads it, and the power table sizes the open question's Holm family: 4 x 2 x 2
    text = dry_run("--profile", "slurm", "all")
    assert f"--open-question {target}" in text and "--open-question-family 16" in text


def test_design_target_never_touches_test() -> None:
    text = dry_run("--profile", "slurm", "design")
    assert "results/stats/selection.parquet" in text and "results/ablations/forced_keep.parquet" in text
    # split_mbpp writes test.parquet; no job reads it
    assert "--split test" not in text and "evaluate_test" not in text and "/test/" not in text
    assert "--tasks-file results/data/test.parquet" not in text and "results/report" not in text


def test_best_val_selection_plans_the_campaign_after_the_val_statistics() -> None:
    best = 'evaluation={"selection": {"mode": "best_val"}}'
    text = dry_run("--profile", "workflow/profiles/local", "test", "--config", best)
    # the test checkpoints are known once selection.parquet is: the stats checkpoint, then the campaign
    assert "checkpoint jobs" in text and "test_stats" in text and "--out-dir results/stats" in text
    assert "/test/seed42.parquet" not in text


def test_each_generated_rule_loop_names_every_rule_it_makes() -> None:
    """evaluation.smk makes its evaluation rules in loops, so a rule's name is nowhere in the file as written: the
    comment above each loop lists them (``#   rules: ...``), and for the paper design that list is the dry-run's."""
    listed = {name for line in (REPO / "workflow" / "rules" / "evaluation.smk").read_text().splitlines()
              if line.strip().startswith("#   rules:") for name in line.split(":", 1)[1].split()}
    made = {rule for rule in job_counts("--profile", "slurm", "all") if rule.startswith("evaluate_")}
    assert listed == made, (sorted(listed - made), sorted(made - listed))

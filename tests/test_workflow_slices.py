"""An edit reruns only the stages that read it (issue 15 item 2): dry-runs against a finished local run.

The finished run is faked cheaply: every output of the local `all` is created empty, then `snakemake --touch -F`
records each job's provenance (params included) as a real run would. Each case edits one config key in a copy of
config/local.yaml and checks exactly which rules the dry-run plans, and that the reason names the key.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
LOCAL = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
DOWNSTREAM_OF_EVALUATIONS = {"stats", "ablation", "extension", "power", "report", "all"}
# The test campaign (part of `all`) reads the val statistics' selection and metrics: it follows a rerun of stats.
TEST_CAMPAIGN = {"evaluate_test", "test_stats"}


def snakemake(workdir: Path, config: Path, *args: str) -> str:
    out = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", str(config), "--cores", "1", *args],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("finished-run")
    config = workdir / "local.yaml"
    config.write_text(yaml.safe_dump(LOCAL))
    summary = snakemake(workdir, config, "-n", "--summary", "all")
    for line in summary.splitlines():
        path = line.split("\t")[0]
        if not path.startswith("results/"):
            continue
        target = workdir / path
        if target.suffix:  # a file (parquet, json, html); the checkpoints and the tiny model are folders
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        else:
            target.mkdir(parents=True, exist_ok=True)
    snakemake(workdir, config, "--touch", "-F", "all")
    assert "Nothing to be done" in snakemake(workdir, config, "-n", "all")
    return workdir


def plan(workdir: Path, edit: dict) -> tuple[dict[str, int], str]:
    """The jobs a dry-run of `all` plans after this edit of the local config ({dotted.key: value}), and its log."""
    config = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    for key, value in edit.items():
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[last] = value
    path = workdir / "edited.yaml"
    path.write_text(yaml.safe_dump(config))
    log = snakemake(workdir, path, "-n", "all")
    jobs: dict[str, int] = {}
    if "Job stats:" in log:
        for line in log.split("Job stats:")[1].splitlines()[3:]:
            if not line.strip() or line.startswith("total"):
                break
            rule, count = line.split()
            # one evaluation rule per run (evaluate_<run>, evaluate_test_<run>): counted as one kind of job
            rule = re.sub(r"^(evaluate_test|evaluate)_\w+$", r"\1", rule)
            jobs[rule] = jobs.get(rule, 0) + int(count)
    return jobs, log


def planned_outputs(log: str, rule: str) -> list[list[str]]:
    """The output files of each planned job whose rule name matches this pattern."""
    return [block.split(", ") for block in re.findall(rf"rule {rule}:\n(?:    .*\n)*?    output: (.*)", log)]


def param_reasons(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Params have changed" in line]


def test_power_reruns_only_power_and_the_report(finished_run: Path) -> None:
    jobs, log = plan(finished_run, {"power.target": 0.9})
    assert set(jobs) == {"power", "report", "all"}
    # the reason names the changed key, not the config (it used to be two copies of it as JSON, ~6 KB)
    reasons = param_reasons(log)
    assert reasons and all("power#" in r for r in reasons)
    assert all(len(r) < 300 for r in reasons)


def test_bootstrap_reruns_the_statistics_and_no_evaluation(finished_run: Path) -> None:
    jobs, log = plan(finished_run, {"evaluation.bootstrap.resamples": 5000})
    # power reads stats' pairs.parquet (the observed discordance), so it follows stats; so does the test campaign
    assert set(jobs) == {"stats", "ablation", "extension", "power", "report", "all"} | TEST_CAMPAIGN
    assert jobs["ablation"] == len(LOCAL["ablations"]) and jobs["extension"] == len(LOCAL["extensions"])
    assert all("evaluation.bootstrap" in r for r in param_reasons(log))


def test_rl_lr_reruns_rl_its_evaluations_and_the_tables_only(finished_run: Path) -> None:
    jobs, log = plan(finished_run, {"rl.lr": 5.0e-4})
    assert set(jobs) == {"rl", "rft", "evaluate"} | DOWNSTREAM_OF_EVALUATIONS | TEST_CAMPAIGN
    # every RL run of the study, and the evaluations of their RL checkpoints only: not the SFT ones
    assert jobs["rl"] + jobs["rft"] == len(LOCAL["arms"]) + len(LOCAL["ablations"]) + len(LOCAL["extensions"])
    # one job per run and seed evaluates all its checkpoints on one server (SFT included, a weight reload): every
    # planned evaluation is an RL run's, none evaluates SFT checkpoints alone
    evaluated = planned_outputs(log, r"evaluate_(?!test_)\w+")
    assert len(evaluated) == jobs["evaluate"] and all(any("/step" in p for p in job) for job in evaluated), evaluated
    assert all("rl#" in r for r in param_reasons(log))


def test_traces_mix_reruns_traces_sft_and_everything_downstream(finished_run: Path) -> None:
    jobs, _ = plan(finished_run, {"traces.mix": "balanced"})
    assert jobs.keys() >= {"sft_traces", "train_sft", "rl", "rft", "evaluate"} | DOWNSTREAM_OF_EVALUATIONS
    assert not jobs.keys() & {"split_mbpp", "verify_gold", "build_tiny_model", "check_serving"}
    assert jobs["train_sft"] == len(LOCAL["arms"])


def test_run_name_reruns_only_the_report(finished_run: Path) -> None:
    jobs, log = plan(finished_run, {"run_name": "renamed"})
    assert set(jobs) == {"report", "all"}
    assert any("run_name=" in r for r in param_reasons(log))


def test_a_section_only_the_frozen_design_reads_reruns_only_the_test_campaign(finished_run: Path) -> None:
    # prime_rl drives the cluster backend's rules only; locally it is part of the design the test ledger records
    jobs, log = plan(finished_run, {"prime_rl.seq_len": 1024})
    assert set(jobs) == TEST_CAMPAIGN | {"report", "all"}
    assert all("prime_rl#" in r for r in param_reasons(log))


def test_snakemake_report_holds_the_study_report_and_its_tables(finished_run: Path) -> None:
    import zipfile

    out = finished_run / "results" / "report.zip"
    snakemake(finished_run, finished_run / "local.yaml", "--report", str(out))
    names = {Path(n).name for n in zipfile.ZipFile(out).namelist() if "/data/raw/" in n}
    marked = {"index.html", "metrics.parquet", "pairs.parquet", "power.parquet", "selection.parquet",
              *(f"{a}.parquet" for a in LOCAL["ablations"]), *(f"{e}.parquet" for e in LOCAL["extensions"])}  # fmt: skip
    assert marked <= names, marked - names

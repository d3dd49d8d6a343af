"""An edit reruns only the stages that read it (issue 15 item 2): dry-runs against a finished local run.

The finished run is faked cheaply: every output of the local `all` is created empty, then `snakemake --touch -F`
records each job's provenance (params included) as a real run would. Each case edits one config key in a copy of
config/local.yaml and checks exactly which rules the dry-run plans, and that the reason names the key.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
LOCAL = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
# inspect_logs: every evaluation (val and test) as an Inspect log, so it follows the evaluations, never the tables.
DOWNSTREAM_OF_EVALUATIONS = {"stats", "ablation", "extension", "open_question", "power", "report", "inspect_logs",
                             "all"}
# The test campaign (part of `all`): it reruns when the frozen design or its checkpoints change (and the ledger then
# stops the run), never because the val statistics were rewritten; the Inspect logs of its evaluations follow it.
TEST_CAMPAIGN = {"evaluate_test", "test_stats", "inspect_logs"}


def snakemake(workdir: Path, config: Path, *args: str) -> str:
    out = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", str(config), "--cores", "1", *args],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def fake_finished_run(workdir: Path, config: dict) -> Path:
    """Create every output of `all` under this config (empty files), then `--touch -F` it: a finished run, test
    campaign included. With `evaluation.selection.mode: best_val` the campaign's jobs are known only from the val
    statistics (the `stats` checkpoint), so those two tables get real rows (the highest step evaluated on val is the
    selection) and the design is finished first."""
    path = workdir / "local.yaml"
    path.write_text(yaml.safe_dump(config))

    def create_outputs(target: str) -> list[str]:
        paths = [line.split("\t")[0] for line in snakemake(workdir, path, "-n", "--summary", target).splitlines()]
        paths = [p for p in paths if p.startswith("results/")]
        for p in paths:
            out = workdir / p
            if out.suffix:  # a file (parquet, json, html); the checkpoints and the tiny model are folders
                out.parent.mkdir(parents=True, exist_ok=True)
                out.touch()
            else:
                out.mkdir(parents=True, exist_ok=True)
        return paths

    if config["evaluation"]["selection"]["mode"] == "best_val":
        val = [p.split("/")[2:4] + [int(p.split("seed")[-1].split(".")[0])]
               for p in create_outputs("design") if re.fullmatch(r"results/eval/.+/val/seed\d+\.parquet", p)]
        metrics = [{"run": r, "checkpoint": c, "split": "val", "seed": s} for r, c, s in val]
        step = {c: int(c[4:]) if c.startswith("step") else -1 for _, c, _ in val}
        chosen = {}
        for r, c, s in val:
            if (r, s) not in chosen or step[c] > step[chosen[r, s]]:
                chosen[r, s] = c
        selection = [{"run": r, "seed": s, "checkpoint": c} for (r, s), c in chosen.items()]
        pq.write_table(pa.Table.from_pylist(metrics), workdir / "results" / "stats" / "metrics.parquet")
        pq.write_table(pa.Table.from_pylist(selection), workdir / "results" / "stats" / "selection.parquet")
        snakemake(workdir, path, "--touch", "-F", "design")  # now the stats checkpoint's campaign can be read
    assert any("/test/seed" in p for p in create_outputs("all"))  # the test campaign is part of the finished run
    snakemake(workdir, path, "--touch", "-F", "all")
    assert "Nothing to be done" in snakemake(workdir, path, "-n", "all")
    return workdir


@pytest.fixture(scope="module")
def _finished_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both faked finished runs, built side by side: each is a chain of single-threaded Snakemake calls (~14 s and
    ~28 s of the test command in CI, one after the other), in folders of their own."""
    best_val = yaml.safe_load(yaml.safe_dump(LOCAL))
    best_val["evaluation"]["selection"] = {"mode": "best_val"}
    workdirs = {"finished_run": (tmp_path_factory.mktemp("finished-run"), LOCAL),
                "finished_best_val_run": (tmp_path_factory.mktemp("finished-best-val-run"), best_val)}
    with ThreadPoolExecutor(len(workdirs)) as pool:
        built = {name: pool.submit(fake_finished_run, *args) for name, args in workdirs.items()}
        return {name: future.result() for name, future in built.items()}


@pytest.fixture(scope="module")
def finished_run(_finished_runs: dict[str, Path]) -> Path:
    return _finished_runs["finished_run"]


@pytest.fixture(scope="module")
def finished_best_val_run(_finished_runs: dict[str, Path]) -> Path:
    return _finished_runs["finished_best_val_run"]


def plan(workdir: Path, edit: dict) -> tuple[dict[str, int], str]:
    """The jobs a dry-run of `all` plans after this edit of the finished run's config ({dotted.key: value}), and
    its log."""
    config = yaml.safe_load((workdir / "local.yaml").read_text())
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
            # one evaluation rule per run (evaluate_<run>, evaluate_test_<run>; best_val: evaluate_test) is one kind
            rule = re.sub(r"^(evaluate_test|evaluate)(_\w+)?$", r"\1", rule)
            jobs[rule] = jobs.get(rule, 0) + int(count)
    return jobs, log


def planned_outputs(log: str, rule: str) -> list[list[str]]:
    """The output files of each planned job whose rule name matches this pattern."""
    return [block.split(", ") for block in re.findall(rf"rule {rule}:\n(?:    .*\n)*?    output: (.*)", log)]


def param_reasons(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Params have changed" in line]


@pytest.mark.parametrize("run", ["finished_run", "finished_best_val_run"])
def test_power_reruns_only_power_and_the_report(run: str, request: pytest.FixtureRequest) -> None:
    jobs, log = plan(request.getfixturevalue(run), {"power.target": 0.9})
    assert set(jobs) == {"power", "report", "all"} and "evaluate_test" not in log
    # the reason names the changed key, not the config (it used to be two copies of it as JSON, ~6 KB)
    reasons = param_reasons(log)
    assert reasons and all("power#" in r for r in reasons)
    assert all(len(r) < 300 for r in reasons)


def test_bootstrap_is_frozen_with_the_test_campaign(finished_run: Path, tmp_path: Path) -> None:
    # Issue 26: the bootstrap is part of the frozen design (the test's statistics cannot change their settings after
    # the test). The val statistics rerun first (the stats checkpoint: a dry-run sees no further), then the test
    # evaluations are replanned, and the ledger refuses them (tests/test_campaign.py). power reads pairs.parquet.
    workdir = tmp_path / "run"
    shutil.copytree(finished_run, workdir, symlinks=True)
    edit = {"evaluation.bootstrap.resamples": 5000}
    jobs, log = plan(workdir, edit)
    assert set(jobs) == {"stats", "ablation", "extension", "open_question", "power", "test_stats", "report", "all"}, jobs
    assert jobs["ablation"] == len(LOCAL["ablations"]) and jobs["extension"] == len(LOCAL["extensions"])
    assert all("evaluation.bootstrap" in r for r in param_reasons(log))
    snakemake(workdir, workdir / "edited.yaml", "--touch", "results/stats/selection.parquet")  # stats has rerun
    jobs, log = plan(workdir, edit)
    assert TEST_CAMPAIGN <= set(jobs) and any("evaluate_test" in line for line in log.splitlines()), jobs


@pytest.mark.parametrize("run", ["finished_run", "finished_best_val_run"])
def test_rewritten_val_statistics_never_replan_the_test_campaign(
    run: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # `stats` rewrote its tables with other bytes and the same selection (a fix of `predict stats` rerun with
    # -R stats, another pyarrow): the test evaluations stay (the ledger would refuse them); what reads the tables
    # follows. best_val: the campaign's jobs are read from these very tables (the stats checkpoint).
    workdir = tmp_path / "run"
    shutil.copytree(request.getfixturevalue(run), workdir, symlinks=True)
    for name in ("metrics", "selection"):
        path = workdir / "results" / "stats" / f"{name}.parquet"
        if path.stat().st_size:
            table = pq.read_table(path)
            pq.write_table(table.append_column("rewritten", pa.array([True] * table.num_rows)), path)
        else:
            path.write_bytes(b"rewritten")
    jobs, log = plan(workdir, {})
    assert set(jobs) == {"test_stats", "report", "all"} and "evaluate_test" not in log, jobs


def test_rl_lr_reruns_rl_its_evaluations_and_the_tables_only(finished_run: Path) -> None:
    jobs, log = plan(finished_run, {"rl.lr": 5.0e-4})
    # training_outcomes: the class shares over the RL runs' steps, read from the metrics the new runs rewrite
    assert set(jobs) == {"rl", "rft", "evaluate", "training_outcomes"} | DOWNSTREAM_OF_EVALUATIONS | TEST_CAMPAIGN
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
              *(f"{a}.parquet" for a in LOCAL["ablations"]), *(f"{e}.parquet" for e in LOCAL["extensions"])}
    assert marked <= names, marked - names


def test_a_design_edit_after_the_campaign_stops_at_the_ledger_and_keeps_the_test_evaluations(
    finished_best_val_run: Path, tmp_path: Path
) -> None:
    from predict.campaign import TestLedger, campaign_from_stats, registry_ledger
    from predict.config import load_config
    from predict.stages import config_slice

    from .synthetic import write_test_split

    workdir = tmp_path / "run"
    shutil.copytree(finished_best_val_run, workdir, symlinks=True)
    config = load_config(workdir / "local.yaml")  # with its defaults, as the workflow and the stages see it
    stats = workdir / "results" / "stats"
    frozen = config_slice(config, "evaluate-test")  # what the campaign's stage reads; the ledger hashes it
    campaign = campaign_from_stats(frozen, stats / "metrics.parquet", stats / "selection.parquet")
    run, checkpoint, seed = campaign[0]
    # the campaign admitted under the frozen design, in the ledger the stages find (PREDICT_TEST_CAMPAIGNS here), on
    # the test split with its rows (the faked run's files are empty)
    tasks = write_test_split(frozen, workdir / "results" / "data" / "test.parquet")
    # admitted without its results folder: the faked run's test evaluations are there already, and they are this
    # campaign's, not a history the ledger lost (results_dir is no part of the design: the same campaign id)
    admitted = {key: value for key, value in frozen.items() if key != "results_dir"}
    TestLedger(registry_ledger()).admit(admitted, campaign, [(run, checkpoint, seed, "m")], tasks_path=tasks)
    evaluation = workdir / "results" / "eval" / run / checkpoint / "test" / f"seed{seed}.parquet"
    evaluation.write_bytes(b"the frozen test evaluation")
    config["prime_rl"]["seq_len"] = 1024  # part of the frozen design
    edited = workdir / "edited.yaml"
    edited.write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", str(edited), "--cores", "1",
         str(evaluation.relative_to(workdir))],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0 and "evaluate_test" in out.stdout + out.stderr
    logs = "".join(p.read_text() for p in (workdir / "logs").rglob("*.log") if "evaluate_test" in str(p))
    assert "the test campaign on this split" in logs and "prime_rl.seq_len" in logs, logs[-3000:]
    # Snakemake deletes a job's outputs before running it: the refused rerun must not take the frozen file with it
    assert evaluation.read_bytes() == b"the frozen test evaluation"


@pytest.mark.parametrize("shared", [None, {"idle_s": 5}], ids=["off", "shorter-idle"])
def test_how_jobs_are_served_reruns_nothing(finished_run: Path, shared: dict | None) -> None:
    # serving.shared: one server leased by the run's jobs or one per job; it changes no result (stages.UNTRACKED)
    jobs, log = plan(finished_run, {"serving.shared": shared})
    assert jobs == {} and "Nothing to be done" in log, jobs


def test_the_bundle_is_planned_beside_the_finished_run_and_alone(finished_run: Path) -> None:
    # `snakemake bundle` after `all` (docs/verify.md) runs the bundle job and nothing else, and its outputs are the
    # manifest and the archive: a directory() output would get Snakemake's own marker file inside the bundle, a file
    # its manifest does not list (seen on the embedded default: verify-bundle on results/bundle failed naming
    # .snakemake_timestamp)
    log = snakemake(finished_run, finished_run / "local.yaml", "-n", "bundle")
    assert re.findall(r"^(\w+)\s+1$", log.split("Job stats:")[1], re.MULTILINE) == ["bundle", "total"]
    assert planned_outputs(log, "bundle") == [["results/bundle/manifest.json", "results/bundle.tar.gz"]]

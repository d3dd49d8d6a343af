"""The 4B rehearsal (issue 58): config/gpu-rehearsal.yaml cuts counts and never a shape of the one-node design, and
benchmarks/rehearsal.py reads a run's files into the numbers the issue asks for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from predict.cli import merge_config_files
from predict.config import load_config
from predict.plan.costs import checkpointing

from .conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
# Every per-episode, per-step and serving setting the rehearsal keeps from config/config.yaml + config/gpu.yaml.
KEPT = ["env.budget", "env.max_tokens", "env.temperature", "env.concurrency", "env.test_cost", "env.revise_costs_call",
        "serving.max_model_len", "serving.device", "serving.batch_invariant", "serving.shared", "backend",
        "rl.group_size", "rl.tasks_per_step", "rl.micro_batch_tokens", "rl.state_every", "rl.activation_checkpointing",
        "rl.offload_optimizer",
        "rl.lr", "rl.eps_low", "rl.eps_high", "rl.kl_coef", "rl.dtype", "rl.weight_sync", "rl.keep_state",
        "sft.max_seq_len", "sft.micro_batch_tokens", "sft.batch_tokens", "sft.lr", "sft.save_every", "sft.dtype",
        "evaluation.temperature", "evaluation.max_tokens", "evaluation.samples", "evaluation.reference",
        "model.enable_thinking", "data.split_seed", "data.sizes", "traces", "arms", "verifier"]
CUT = {"seeds", "rl.steps", "rl.checkpoint_every", "rl.skip_zero_advantage", "sft.max_steps", "evaluation.tasks",
       "evaluation.checkpoints", "evaluation.selection", "ablations", "extensions", "data.hf_fallback"}


def _get(config: dict, key: str) -> object:
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def test_the_rehearsal_keeps_every_shape_of_the_one_node_design() -> None:
    design = merge_config_files(REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml")
    design = {k: v for k, v in design.items() if k != "prime_rl"}
    path = REPO / "config" / "gpu-rehearsal.yaml"
    rehearsal = yaml.safe_load(path.read_text())
    assert [k for k in KEPT if _get(rehearsal, k) != _get(design, k)] == []
    assert "gpu_memory_utilization" not in rehearsal["serving"]  # derived, as config/gpu.yaml's null says
    tiny = load_config(path)["model"]["tiny"]
    assert (tiny["shape"], tiny["tie_word_embeddings"]) == ("qwen3-4b", True)  # the release: 4.02B, tied
    text = path.read_text()
    cut_lines = [line for line in text.splitlines() if "# cut" in line]
    assert [k for k in CUT if not any(k.split(".")[-1] in line for line in cut_lines)] == []  # each cut is marked...
    assert "ablations" not in rehearsal and "extensions" not in rehearsal
    for line in text.splitlines():  # ...with its reason beside it
        if "# cut" in line:
            assert len(line.split("# cut", 1)[1]) > 10, line
    assert load_config(path)["rl"]["steps"] == 1 and load_config(path)["seeds"] == [42]


@pytest.fixture(scope="module")
def rehearsal():
    return benchmark_script("rehearsal")


def _touch(path: Path, text: str, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_collect_reads_a_runs_files_into_the_issues_numbers(rehearsal, tmp_path: Path) -> None:
    """Synthetic files in the layout a run writes: Snakemake benchmarks, the jobs' logs, the disk and GPU samples,
    the SFT and RL metrics tables and an evaluation; `collect` gives each job its wall time, tokens/s, device and disk
    peaks, and the RL step split with its MFU and the saves spread over the design's intervals."""
    from predict.outputs import write_rows
    from predict.train.sft import METRICS_SCHEMA as SFT_SCHEMA
    from predict.train.step_metrics import write_metrics

    results, logs = tmp_path / "results", tmp_path / "logs"
    config = yaml.safe_load((REPO / "config" / "gpu-rehearsal.yaml").read_text())
    config["results_dir"] = str(results)
    cfg = tmp_path / "rehearsal.yaml"
    cfg.write_text(yaml.safe_dump(config))
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    t0 = 1_000_000.0
    _touch(results / "benchmarks" / "rl" / "A" / "seed42.tsv", header + "500.0\t0:08:20\t1\t1\t1\t1\t0\t0\t90\t400\n",
           t0 + 500)
    _touch(logs / "gpu-rehearsal" / "rl" / "A" / "seed42.log",
           "... peak GPU memory: 50.0 of 79 GiB on the device (every process, the vLLM server included)\n"
           "... peak GPU memory: 61.5 of 79 GiB on the device (every process, the vLLM server included); this process"
           " (torch) 44.0 GiB\n"
           "[12/06/26 07:27:51] INFO     shared vLLM server pid 2176 at http://127.0.0.1:47189/v1: started on\n"
           "                             results/checkpoints/A/sft in\n                             120.5 s\n", t0 + 500)
    _touch(results / "benchmarks" / "train_sft" / "A.tsv", header + "60.0\t0:01:00\t1\t1\t1\t1\t0\t0\t90\t50\n", t0 - 10)
    # a warm-up step and a slow second (compiling), then steady steps at 15k tokens/s, into a second epoch
    sft_rows = [(1, 0, 30_000, 12.0), (2, 0, 30_000, 4.0), (3, 0, 30_000, 2.0), (4, 1, 15_000, 1.0)]
    write_rows([{"arm": "A", "step": step, "epoch": epoch, "loss": 1.0, "ce_loss": 1.0, "lr": 1e-5, "grad_norm": 1.0,
                 "time_s": sec, "n_samples": 40, "n_tokens": tok, "n_ce_tokens": 9000, "tokens_per_s": tok / sec}
                for step, epoch, tok, sec in sft_rows], SFT_SCHEMA, results / "sft" / "A" / "metrics.parquet")
    _touch(results / "benchmarks" / "train_sft" / "B.tsv", header + "70.0\t0:01:10\t1\t1\t1\t1\t0\t0\t90\t50\n", t0 - 80)
    _touch(logs / "gpu-rehearsal" / "train_sft" / "B.log", "peak GPU memory: 77.8 of 80 GiB on the device\n", t0 - 80)
    _touch(logs / "gpu-rehearsal" / "train_sft" / "A.log", "peak GPU memory: 75.9 of 80 GiB on the device\n", t0 - 10)
    _touch(results / "benchmarks" / "split_mbpp.tsv", header + "1.2\t0:00:01\t1\t1\t1\t1\t0\t0\t90\t1\n", t0 - 200)
    _touch(results / "rehearsal" / "samples.tsv",
           "".join(f"{t0 + t}\t{int((20 + t / 50) * 1e9)}\t{int(40 * 2**30)}\n" for t in range(-20, 520, 2)), t0)
    step = {"run": "A", "seed": 42, "step": 1, "backend": "rl", "n_rollouts": 128, "n_output_tokens": 524_288,
            "rollout_s": 360.0, "samples_s": 4.0, "update_s": 50.0, "n_tokens": 600_000, "sleep_s": 0.1, "sync_s": 0.2,
            "step_s": 414.3, "save_s": 2.0, "checkpoint_write_s": 8.0, "state_write_s": 30.0}
    write_metrics([step], results / "rl" / "A" / "seed42" / "metrics.parquet")
    # the evaluations: Arm A's val (two checkpoints, 3 tasks each) on the reloaded server; its test reference (sft,
    # 2 tasks) on a server started for it
    _touch(results / "benchmarks" / "evaluate" / "A" / "val" / "seed42.tsv",
           header + "100.0\t0:01:40\t1\t1\t1\t1\t0\t0\t90\t9\n", t0 + 600)
    _touch(logs / "gpu-rehearsal" / "evaluate" / "A" / "val" / "seed42.log",
           "shared vLLM server pid 9 at http://127.0.0.1:1/v1: loaded in place in 2.0 s\n", t0 + 600)
    _touch(results / "benchmarks" / "evaluate_test" / "A" / "sft.tsv",
           header + "68.0\t0:01:08\t1\t1\t1\t1\t0\t0\t90\t9\n", t0 + 700)
    _touch(logs / "gpu-rehearsal" / "evaluate_test" / "A" / "sft.log",
           "shared vLLM server pid 9 at http://127.0.0.1:1/v1: started on results/checkpoints/A/sft in 30.0 s\n",
           t0 + 700)
    for checkpoint, split, tasks in (("sft", "val", 3), ("step1", "val", 3), ("sft", "test", 2)):
        folder = results / "eval" / "A" / checkpoint / split
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"task_id": list(range(tasks)), "n_output_tokens": [100] * tasks}),
                       folder / "seed42.parquet")
    # each Snakemake phase's output ends naming its own log; the RL phase ran twice (a slot ended in it)
    _touch(results / "rehearsal" / "snakemake-rl.log", "Complete log(s): /n/.snakemake/log/rl-1.snakemake.log\n"
           "Complete log(s): /n/.snakemake/log/rl-2.snakemake.log\n", t0 + 510)
    _touch(results / "rehearsal" / "snakemake-all.log", "...\nComplete log(s): /n/.snakemake/log/all.snakemake.log\n",
           t0 + 800)
    out = tmp_path / "rehearsal_test.json"
    assert rehearsal.main(["collect", "--config", str(cfg), "--card", "test", "--out", str(out),
                           "--logs-dir", str(logs)]) == 0
    got = json.loads(out.read_text())
    assert got["card"] == "test" and got["shape"].endswith("4,022,468,096 parameters")
    # what plan_check.py measure reads as one run, in the order the phases ran (the last log of a phase run twice)
    assert got["snakemake_logs"] == ["/n/.snakemake/log/rl-2.snakemake.log", "/n/.snakemake/log/all.snakemake.log"]
    jobs = {j["job"]: j for j in got["jobs"]}
    rl = jobs["rl/A/seed42"]
    assert (rl["wall_s"], rl["device_peak_gib"], rl["device_gib"]) == (500.0, 61.5, 79.0)  # the job's last peak line
    assert rl["tokens"] == 524_288 and rl["tokens_per_s"] == pytest.approx(524_288 / 500, abs=0.1)
    assert rl["disk_peak_gb"] == pytest.approx(30.0, abs=0.05)  # 20 GB + 500 s / 50 at its end
    assert rl["disk_growth_peak_gb"] == pytest.approx(10.0, abs=0.1)
    assert (rl["server"], rl["load_s"]) == ("start", 120.5)  # the log's line, however rich wrapped it
    sft = jobs["train_sft/A"]
    assert (sft["tokens"], sft["tokens_are"], sft["tokens_per_s"]) == (105_000, "trained", 1750.0)
    assert [s["n_tokens"] for s in got["sft_steps"]["A"]] == [30_000, 30_000, 30_000, 15_000]
    (split,) = got["rl_steps"]
    assert split["episodes_per_s"] == pytest.approx(128 / 360, abs=1e-4)
    assert split["generated_tokens_per_s"] == pytest.approx(524_288 / 360, abs=1e-3)
    assert split["update_mfu"] == pytest.approx(6 * 4_022_468_096 * 600_000 / (50 * 989e12), abs=1e-4)
    spread = split["saves_spread_share"]
    assert (spread["state_every"], spread["checkpoint_every"]) == (5, 25)  # the design's, config/config.yaml
    assert spread["background"] == pytest.approx(2.0 / 5 / 414.3, abs=1e-4)
    assert spread["foreground"] == pytest.approx((30.0 / 5 + 8.0 / 25) / 414.3, abs=1e-4)
    assert got["vllm_alone"] is None and got["rl_rollout_vs_vllm_alone"] is None  # not run: said, not invented
    val, test = jobs["evaluate/A/val/seed42"], jobs["evaluate_test/A/sft"]
    assert (val["episodes"], val["tokens"], val["server"], test["episodes"], test["server"]) == (6, 600, "reload", 2,
                                                                                                 "start")
    assert val["output_bytes"] == sum(f.stat().st_size for f in (results / "eval" / "A").glob("*/val/seed42.parquet"))

    # benchmarks/calibrate.py reads the file collect wrote: the 4B RL step's rollout, tokens, saves and device peak
    calibrate = benchmark_script("calibrate")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rehearsal_test.json").write_text(out.read_text())
    calibrate.BENCH = tmp_path / "bench"
    figures = calibrate.Figures()
    calibrate.rehearsal(figures, "test")
    at = {"shape": "qwen3-4b", "max_tokens": 512, "concurrency": 32}  # config/gpu-rehearsal.yaml as collect ran it
    (rollout,) = figures.figures["rl_rollout_episode_s"]
    assert rollout["at"] == at and rollout["value"] == pytest.approx(360.0 / 128, abs=1e-6)
    assert figures.figures["rl_tokens_per_episode"][0]["value"] == pytest.approx(600_000 / 128, abs=1e-6)
    value = {name: entries[0]["value"] for name, entries in figures.figures.items()}
    assert value["rl_update_tokens_per_s"] == pytest.approx(600_000 / 50.0, abs=1e-3)
    assert value["rl_sleep_sync_s"] == pytest.approx(4.0 + 0.1 + 0.2)
    assert value["rl_save_wait_s"] == 2.0  # per save: the one step saved once (state and checkpoint)
    params = 4_022_468_096
    assert value["hf_save_gb_per_s"] == pytest.approx(params * 2 / 1e9 / 8.0, abs=1e-5)
    assert value["state_save_gb_per_s"] == pytest.approx(params * (8 - 2) / 1e9 / 30.0, abs=1e-5)  # links the ckpt
    assert value["rl_job_fixed_s"] == pytest.approx(500.0 - 120.5 - 414.3 - 2.0, abs=1e-5)
    # each server's own start: the RL job started the RL server, the test campaign the batch-invariant one
    starts = {e["at"]["server"]: e["value"] for e in figures.figures["serving_start_s"]}
    assert starts == {"default": 120.5, "batch_invariant": 30.0}
    assert value["serving_reload_s"] == 2.0  # the val evaluation's
    assert value["sft_tokens_per_s"] == pytest.approx(45_000 / 3.0)  # steady: the steps after the first two
    assert figures.figures["sft_tokens_per_s"][0]["at"] == {"shape": "qwen3-4b", "dtype": "bfloat16", "device": "gpu"}
    assert value["sft_job_fixed_s"] == pytest.approx(60.0 - 105_000 / 15_000)  # B has no steps: A's alone
    assert value["sft_tokens_per_trace"] == pytest.approx(90_000 / 212)  # the first epoch, whole
    jobs_s = {e["at"]["rule"]: e["value"] for e in figures.figures["job_s"]}
    assert jobs_s == {"split_mbpp": 1.2}  # the CPU rules as the node ran them; the timed rules priced by units
    peaks = {e["at"]["family"]: e for e in figures.figures["device_peak_gib"]}
    assert peaks["rl"]["value"] == 61.5 and peaks["rl"]["at"]["micro_batch_tokens"] == config["rl"]["micro_batch_tokens"]
    # labelled with the plan's own condition, as the update's figure is: selective checkpointing is another peak
    assert peaks["rl"]["at"]["activation_checkpointing"] == checkpointing(
        config["rl"]["activation_checkpointing"], config["rl"].get("activation_checkpointing_layers")) == "first 9 layers"
    assert peaks["train_sft"]["value"] == 77.8  # the larger of the two SFT jobs', not the first one's

    # the evaluations, fitted as on the CPU: (100 - 2) = a + 6 b and (68 - 30) = a + 2 b
    evaluation = {"shape": "qwen3-4b", "max_tokens": 512, "concurrency": 32}
    # timed on the kernels its evaluation server ran (config/gpu-rehearsal.yaml's); what it writes, on any kernels
    assert figures.figures["eval_episode_s"][0]["at"] == {**evaluation, "attention_backend": "TRITON_ATTN"}
    assert figures.figures["eval_bytes_per_episode"][0]["at"] == evaluation
    assert (value["eval_episode_s"], value["eval_job_fixed_s"]) == (pytest.approx(15.0), pytest.approx(8.0))
    assert value["eval_bytes_per_episode"] == pytest.approx((val["output_bytes"] + test["output_bytes"]) / 8)

    # the rehearsal's figures go before a benchmark's of the same conditions: the plan takes the first that matches
    earlier = calibrate.Figures()
    earlier.add("rl_update_tokens_per_s", 10_000.0, "tokens/s", "rl_step.json: rows", "a benchmark",
                **figures.figures["rl_update_tokens_per_s"][0]["at"])
    calibrate.rehearsal(earlier, "test")
    assert earlier.figures["rl_update_tokens_per_s"][0]["value"] == pytest.approx(12_000.0)


    # the conditions are the config the rehearsal ran with, not the file as it is now: a JSON of a run at 8 in flight
    # stays at 8 after config/gpu-rehearsal.yaml moved to 32 (calibrate once read the file and relabelled it)
    ran = json.loads(out.read_text())
    ran["config_as_run"]["env"]["concurrency"] = 8
    (tmp_path / "bench" / "rehearsal_test.json").write_text(json.dumps(ran))
    relabelled = calibrate.Figures()
    calibrate.rehearsal(relabelled, "test")
    assert relabelled.figures["rl_rollout_episode_s"][0]["at"]["concurrency"] == 8 != config["env"]["concurrency"]
    del ran["config_as_run"]
    (tmp_path / "bench" / "rehearsal_test.json").write_text(json.dumps(ran))
    with pytest.raises(SystemExit, match="rehearsal_test.json: no config_as_run"):
        calibrate.rehearsal(calibrate.Figures(), "test")


def test_no_gpu_job_of_the_rehearsal_can_be_killed_by_the_gpu_rules_runtime() -> None:
    """The GPU rules' `runtime` (common.smk: 240 serving, 1,440 RL, 480 SFT minutes, hand-set) is a request a cluster
    executor enforces; the gpu profile runs Snakemake's local executor, which never reads it, and sets no runtime
    limit of its own. So a rehearsal job ends when its work does, however its minutes compare (its RL job's estimate
    is ~10 minutes); its only clock is serving.startup_timeout_s, 900 s against starts of 100-180 s."""
    import snakemake.executors.local as local

    profile = yaml.safe_load((REPO / "workflow" / "profiles" / "gpu" / "config.yaml").read_text())
    assert "executor" not in profile and "slurm" not in json.dumps(profile)  # the local executor
    assert "runtime" not in profile.get("resources", {})
    assert not any("runtime" in str(r) for r in profile.get("default-resources", []) or [])
    assert "runtime" not in Path(local.__file__).read_text().replace("runtime_", "")  # it never reads the resource
    assert load_config(REPO / "config" / "gpu-rehearsal.yaml")["serving"]["startup_timeout_s"] >= 600

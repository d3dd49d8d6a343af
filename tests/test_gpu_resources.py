"""GPU requests come from one place (cluster.gpus_per_job via GPU_RESOURCES): read off dry-runs of the DAGs.

The paper DAG asks SLURM for a GPU for every serving rule; the local-SLURM overlay asks for the same GPUs while
sizing the jobs for the CPU; the embedded default asks for none. Every serving job waits for check_serving.
"""

from __future__ import annotations

import pytest

from tests.slurm_slice import SLICE_TARGETS, dag_resources, paper_dag


@pytest.fixture(scope="module")
def paper():
    return paper_dag()


def test_paper_dag_serving_rules_ask_for_one_gpu_each(paper):
    evaluations = [job for rule, jobs in paper.items() if rule.startswith("evaluate_") for job in jobs]
    assert {r for r, jobs in paper.items() if any("gpu" in j for j in jobs)} >= {"rollout", "evaluate_A", "evaluate_test_B"}
    for job in paper["rollout"] + evaluations:
        assert job["gpu"] == "1" and job["mem_mb"] == "64000" and job["vllm_server"] == "1"
    for rule in ("split_mbpp", "verify_gold", "check_serving"):
        assert all("gpu" not in job for job in paper[rule]), rule


def test_local_slurm_overlay_asks_for_the_same_gpus_with_cpu_sizes(paper):
    local = dag_resources(
        [*SLICE_TARGETS, "--profile", "slurm", "--workflow-profile", "workflow/profiles/slurm-local"]
    )
    gpu_rules = {r for r, jobs in paper.items() if any("gpu" in j for j in jobs)}
    for rule, jobs in local.items():
        for job in jobs:
            assert ("gpu" in job) == (rule in gpu_rules), (rule, job)
    for job in local["rollout"]:
        assert job["gpu"] == "1" and job["mem_mb"] == "8000"
        assert job["slurm_partition"] == "debug" and job["slurm_account"] == "predict"
    assert "check_serving" in local


def test_embedded_default_asks_for_no_gpu():
    local = dag_resources(["--profile", "workflow/profiles/local", "all"])
    assert local["evaluate_A"] and local["evaluate_test_campaign"] and local["train_sft"] and local["rl"]  # serving, training: CPU
    assert all("gpu" not in job for jobs in local.values() for job in jobs)
    # both arms' SFT jobs side by side on the 2 cores, one torch thread each (`predict sft --threads`)
    assert [job["threads"] for job in local["train_sft"]] == ["1", "1"]


def test_sft_job_is_sized_for_the_device_the_trainer_uses_when_sft_device_is_left_out(tmp_path):
    # sft.device defaults to auto (predict.config.models), which trains on the GPU when the job has one: on a GPU
    # cluster (serving.device gpu) the SFT job must be sized for the GPU, not the CPU (the rules once assumed cpu).
    import yaml

    from predict.config import REPO_ROOT

    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    del config["sft"]["device"]
    config["backend"] = "local"  # the local trainer's train_sft rule
    path = tmp_path / "no_sft_device.yaml"
    path.write_text(yaml.safe_dump(config))
    jobs = dag_resources(["results/checkpoints/A/sft", "--profile", "slurm", "--configfile", str(path)])
    assert [(job["mem_mb"], job["cpus_per_task"], job["gpu"]) for job in jobs["train_sft"]] == [("128000", "8", "1")]

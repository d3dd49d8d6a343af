"""prime-rl TOMLs rendered from the study config, checked against the keys prime-rl accepts (no prime-rl needed).

`ACCEPTED` lists, for each table we render, the fields of the prime-rl config class that parses it at the pinned
commit (tag v0.8.0, 60bc29547a8824ad1de7b9af8d265e2b27b2a72d), read from
``packages/prime-rl-configs/src/prime_rl/configs/{rl,orchestrator,trainer,sft,inference,algorithm}.py`` (fields
of the class and its bases), and for the env tables from verifiers at prime-rl's submodule pin d30a3f48
(``verifiers/v1/configs/{agent,taskset}.py``, ``envs/single_agent/env.py``) plus our own Taskset/Harness configs.
prime-rl's configs forbid unknown keys, so a key outside these lists would stop the run at start-up.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from predict.config import REPO_ROOT, ConfigError, load_config
from predict.env.harness import LocalAgentHarnessConfig
from predict.env.protocol import ProtocolConfig
from predict.env.taskset import MbppTaskConfig, MbppTasksetConfig
from predict.runs import resolve_run, study_runs
from predict.train.prime_rl import collect, configs
from predict.train.prime_rl.configs import PrimeRLConfigError

PINNED = "60bc29547a8824ad1de7b9af8d265e2b27b2a72d"

_BASE_DEPLOY = {"gpus_per_node"}
# fmt: off
ACCEPTED_RL: dict[str, set[str]] = {
    # rl.py RLConfig
    "": {"trainer", "orchestrator", "inference", "env_vars", "output_dir", "clean_output_dir", "log", "ckpt",
         "wandb", "file_monitor", "model", "tokenizer", "max_steps", "seq_len", "weight_broadcast",
         "rollout_transport", "bench", "deployment", "slurm", "dry_run"},
    "deployment": {"type", "num_train_gpus", "num_infer_gpus"} | _BASE_DEPLOY,  # rl.py SingleNodeDeploymentConfig
    "file_monitor": {"filename"},  # shared.py FileMonitorConfig
    "model": {"name", "vlm"},  # rl.py SharedModelConfig
    "ckpt": {"output_dir", "interval", "resume_step", "keep_last", "keep_interval"},  # rl.py SharedCheckpointConfig
    # orchestrator.py OrchestratorConfig
    "orchestrator": {"algo", "model", "train", "tokenizer", "renderer", "optim", "eval", "pre_batch_filters",
                     "post_batch_filters", "log", "env_vars", "wandb", "prime_monitor", "file_monitor",
                     "collect_inference_metrics", "inference_metrics_roles", "ckpt", "weight_broadcast",
                     "rollout_transport", "output_dir", "tasks_per_minute", "env_server_base_port", "batch_size",
                     "token_batch_size", "oversampling_factor", "max_inflight_episodes", "group_size", "seq_len",
                     "num_train_workers", "max_steps", "max_off_policy_steps", "bench", "heartbeat"},
    "orchestrator.train": {"source", "sampling"},  # TrainConfig
    # orchestrator.py FilterConfig union: GibberishFilterConfig / RepetitionFilterConfig / ZeroAdvantageFilterConfig
    "orchestrator.post_batch_filters[]": {"type", "enforce"},
    "orchestrator.train.sampling": {"temperature", "max_completion_tokens", "extra_body"},  # TrainSamplingConfig
    # TrainSourceConfig + EnvConfig
    "orchestrator.train.source[]": {"sampling", "group_size", "algo", "env", "serve", "legacy", "name", "ratio"},
    # verifiers (d30a3f48) EnvConfig + SingleAgentEnvConfig
    "orchestrator.train.source[].env": {"id", "taskset", "timeout", "retries", "max_concurrent_agents",
                                        "interception", "agent"},
    # verifiers AgentConfig
    "orchestrator.train.source[].env.agent": {"harness", "runtime", "model", "client", "sampling", "max_turns",
                                              "max_input_tokens", "max_output_tokens", "max_total_tokens",
                                              "timeout", "retries"},
    "orchestrator.train.source[].env.agent.timeout": {"setup", "rollout", "finalize", "scoring"},
    "orchestrator.train.source[].env.agent.runtime": {"type"},  # SubprocessConfig (discriminated by type)
    # ours: MbppTasksetConfig / LocalAgentHarnessConfig (checked against the classes below)
    "orchestrator.train.source[].env.taskset": set(MbppTasksetConfig.model_fields),
    "orchestrator.train.source[].env.taskset.task": set(MbppTaskConfig.model_fields),
    "orchestrator.train.source[].env.agent.harness": set(LocalAgentHarnessConfig.model_fields),
    # renderers: Qwen3RendererConfig (name, enable_thinking)
    "orchestrator.renderer": {"name", "enable_thinking"},
    # trainer.py TrainerConfig; AdamWConfig + BaseOptimizerConfig
    "trainer": {"model", "tokenizer", "data", "loss", "optim", "scheduler", "ckpt", "weight_broadcast",
                "rollout_transport", "log", "wandb", "file_monitor", "output_dir", "matmul_precision", "max_steps",
                "enable_router_replay", "memory_profiler_path", "bench", "gc", "trace_path",
                "dist_timeout_seconds", "heartbeat", "metrics_server", "max_concurrent_runs",
                "enable_token_export", "env_vars"},
    "trainer.optim": {"type", "betas1", "betas2", "lr", "weight_decay", "max_norm"},
    # trainer.py ModelConfig (the fields we set) and CustomLossConfig
    "trainer.model": {"name", "seq_len", "attn", "impl", "optimization_dtype", "reduce_dtype"},
    "trainer.loss": {"type", "import_path", "kwargs"},
    # inference.py InferenceConfig (the fields we may set)
    "inference": {"server", "router", "backend_port", "model", "parallel", "log", "env_vars", "seed",
                  "gpu_memory_utilization", "enable_prefix_caching", "output_dir", "deployment", "slurm"},
}
# algorithm.py: GRPOAlgoConfig (type, length_penalty, sampling) and, from our patch, PredictAlgoConfig.
ACCEPTED_ALGO = {
    "grpo": {"type", "length_penalty", "sampling"},
    "grpo_std": {"type", "length_penalty", "sampling"},
    "predict": {"type", "length_penalty", "sampling", "alpha", "mask_decision", "tokenizer"},
}
ACCEPTED_SFT: dict[str, set[str]] = {
    # sft.py SFTConfig
    "": {"model", "env_vars", "tokenizer", "renderer", "data", "val", "optim", "scheduler", "ckpt", "log", "wandb",
         "file_monitor", "output_dir", "clean_output_dir", "matmul_precision", "max_steps", "memory_profiler_path",
         "bench", "gc", "trace_path", "dist_timeout_seconds", "heartbeat", "deployment", "slurm", "dry_run"},
    "model": {"name", "trust_remote_code", "vlm", "seq_len", "conversion_dir", "attn"},  # trainer.py ModelConfig
    "renderer": {"name", "enable_thinking"},
    # SFTDataConfig + BaseDataConfig
    "data": {"type", "name", "subsets", "splits", "probabilities", "stopping_strategy", "shuffle", "seed",
             "loss_mask", "batch_size", "seq_len", "micro_batch_size"},
    "data.loss_mask": {"system", "user", "assistant", "tool"},  # LossMaskConfig
    "optim": {"type", "betas1", "betas2", "lr", "weight_decay", "max_norm"},
    # trainer.py CheckpointConfig (subset)
    "ckpt": {"output_dir", "interval", "weights", "resume_step", "keep_last", "keep_interval"},
    "deployment": {"type", "num_gpus"} | _BASE_DEPLOY,  # sft.py SingleNodeDeploymentConfig
    "file_monitor": {"filename"},  # shared.py FileMonitorConfig
}
# fmt: on


def check_keys(table: dict[str, Any], accepted: dict[str, set[str]], path: str = "") -> list[str]:
    """Every key of `table` at a path we render must be accepted there; returns the tables checked."""
    seen = [path]
    unknown = set(table) - accepted[path]
    assert not unknown, f"[{path or 'top level'}] keys prime-rl does not accept: {sorted(unknown)}"
    for key, value in table.items():
        sub = f"{path}.{key}" if path else key
        if isinstance(value, dict):
            if sub.endswith(".algo"):
                assert set(value) <= ACCEPTED_ALGO[value["type"]], value
                continue
            if sub in accepted:
                seen += check_keys(value, accepted, sub)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                seen += check_keys(item, accepted, sub + "[]")
    return seen


@pytest.fixture(scope="module")
def paper() -> dict[str, Any]:
    return load_config(REPO_ROOT / "config" / "config.yaml")


def render_rl(cfg: dict[str, Any], run: str, tmp_path: Path, seed: int = 42) -> dict[str, Any]:
    table = configs.rl_config(
        cfg,
        run,
        seed,
        model=tmp_path / "checkpoints" / "B" / "sft",
        tasks=tmp_path / "data" / "rl.parquet",
        output_dir=tmp_path / "rl" / run / f"seed{seed}" / "prime-rl",
    )
    path = configs.write_toml(table, tmp_path / f"{run}.toml")
    back = configs.read_toml(path)
    assert back == table  # what prime-rl reads is exactly what we rendered
    return back


def test_the_pinned_commit_is_the_v080_tag(paper: dict[str, Any]) -> None:
    assert paper["prime_rl"]["commit"] == PINNED
    assert load_config(REPO_ROOT / "config" / "local.yaml")["prime_rl"]["commit"] == PINNED


@pytest.mark.parametrize("run", ["A", "B", "alpha0", "forced_keep", "budget_neutral"])
def test_rl_toml_uses_only_keys_prime_rl_accepts(paper: dict[str, Any], run: str, tmp_path: Path) -> None:
    table = render_rl(paper, run, tmp_path)
    checked = check_keys(table, ACCEPTED_RL)
    for must in [
        "orchestrator.train.source[].env.agent.harness",
        "orchestrator.train.source[].env.taskset.task",
        "trainer.optim",
        "deployment",
        "orchestrator.renderer",
    ]:
        assert must in checked


def test_rl_toml_arm_a_is_grpo_and_arm_b_is_predict(paper: dict[str, Any], tmp_path: Path) -> None:
    a, b = render_rl(paper, "A", tmp_path), render_rl(paper, "B", tmp_path)
    assert a["orchestrator"]["algo"] == {"type": "grpo_std"}  # the local trainer's std-normalised advantage
    assert b["orchestrator"]["algo"] == {
        "type": "predict",
        "alpha": paper["arms"]["B"]["alpha"],
        "mask_decision": False,
        # the SFT checkpoint folder (it holds the tokenizer): an offline cluster never asks the hub
        "tokenizer": str((tmp_path / "checkpoints" / "B" / "sft").absolute()),
    }
    rl = paper["rl"]  # the RL design, shared with the local trainer
    for t in (a, b):
        assert t["max_steps"] == rl["steps"] and t["seq_len"] == paper["prime_rl"]["seq_len"]
        o = t["orchestrator"]
        assert (o["batch_size"], o["group_size"]) == (rl["tasks_per_step"] * rl["group_size"], rl["group_size"])
        assert t["ckpt"] == {"interval": rl["checkpoint_every"], "resume_step": -1}
        assert t["trainer"]["optim"] == {
            "type": "adamw",
            "lr": rl["lr"],
            "weight_decay": rl["weight_decay"],
            "max_norm": rl["grad_clip"],
        }
        assert t["inference"]["seed"] == 42
        assert t["output_dir"].endswith("/prime-rl") and Path(t["output_dir"]).is_absolute()
        assert t["model"]["name"] == str((tmp_path / "checkpoints" / "B" / "sft").absolute())
        assert o["renderer"] == {"name": "qwen3", "enable_thinking": True}
        assert o["train"]["sampling"] == {
            "temperature": paper["env"]["temperature"],
            "max_completion_tokens": paper["env"]["max_tokens"],
        }
        (source,) = o["train"]["source"]
        assert source["env"]["taskset"]["id"] == "predict_mbpp"
        assert source["env"]["taskset"]["split"] == "rl"
        assert source["env"]["agent"]["harness"]["id"] == "predict_local_agent"
        assert source["env"]["agent"]["runtime"] == {"type": "subprocess"}
    assert a["orchestrator"]["train"]["source"][0]["env"]["agent"]["harness"]["protocol"]["protocol"] == "reactive"
    harness = b["orchestrator"]["train"]["source"][0]["env"]["agent"]["harness"]["protocol"]
    assert (harness["protocol"], harness["variant"], harness["budget"]) == ("predictive", "none", 8)
    # max_turns stays above the program's own cap, as in local rollouts (2 * budget + 1, plus 2)
    assert b["orchestrator"]["train"]["source"][0]["env"]["agent"]["max_turns"] == 2 * 8 + 1 + 2


def test_ablations_change_one_factor_of_arm_b(paper: dict[str, Any], tmp_path: Path) -> None:
    b = render_rl(paper, "B", tmp_path)
    for run, change in {
        "alpha0": ("orchestrator", "algo", "alpha", 0.0),
        "forced_keep": ("env", "variant", "forced_keep"),
        "budget_neutral": ("env", "revise_costs_call", False),  # budget_neutral_budget null: a free REVISE
    }.items():
        t = render_rl(paper, run, tmp_path)
        # the harness's keys with its protocol table's beside them
        hb, ht = (
            {**h, **h["protocol"]}
            for h in (r["orchestrator"]["train"]["source"][0]["env"]["agent"]["harness"] for r in (b, t))
        )
        if change[0] == "orchestrator":
            assert t["orchestrator"]["algo"]["alpha"] == 0.0 and t["orchestrator"]["algo"]["type"] == "predict"
            assert ht == hb
        else:
            assert ht[change[1]] == change[2] and t["orchestrator"]["algo"] == b["orchestrator"]["algo"]
            assert {k for k in hb if hb[k] != ht[k]} <= {"protocol", "variant", "revise_costs_call"}


def test_mask_decision_comes_from_the_shared_rl_option(paper: dict[str, Any], tmp_path: Path) -> None:
    cfg = {**paper, "rl": {**paper["rl"], "mask_decision": True}}
    assert render_rl(cfg, "B", tmp_path)["orchestrator"]["algo"]["mask_decision"] is True


def test_bad_runs_and_missing_keys_name_the_problem(paper: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'C' is neither an arm"):
        resolve_run(paper, "C")
    no_prime = {k: v for k, v in paper.items() if k != "prime_rl"}
    with pytest.raises(PrimeRLConfigError, match="prime_rl: missing"):
        render_rl(no_prime, "A", tmp_path)
    reactive_only = {**paper, "arms": {"A": {"protocol": "reactive"}}, "ablations": {}, "extensions": {}}
    assert study_runs(reactive_only) == ["A"]
    # an ablation's base_arm defaults to B (predict.config.models.AblationSettings), which this config lacks
    with pytest.raises(ConfigError, match=r"ablations\.alpha0\.base_arm: no arm 'B' \(have A\)"):
        resolve_run({**reactive_only, "ablations": {"alpha0": {"alpha": 0.0}}}, "alpha0")


def write_traces(path: Path, rows: list[list[dict[str, str]]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # the traces stage may carry more columns and more message fields; only role/content travel
    messages = pa.array(rows, type=pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    pq.write_table(pa.table({"task_id": pa.array(range(len(rows)), pa.int64()), "messages": messages}), path)
    return path


def test_sft_toml_and_messages_dataset(paper: dict[str, Any], tmp_path: Path) -> None:
    rows = [
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": 'CALL read_file {"file_path": "solution.py"}'},
            {"role": "user", "content": "status: success\n..."},
            {"role": "assistant", "content": "FINAL: done"},
        ]
    ]
    traces = write_traces(tmp_path / "traces" / "B.parquet", rows)
    data = collect.write_sft_dataset(traces, tmp_path / "sft-data")
    assert data == tmp_path / "sft-data" / "train.parquet"
    back = pq.read_table(data)
    assert back.column_names == ["messages"] and back.column("messages").to_pylist() == rows
    table = configs.sft_config(
        paper, "B", model=paper["model"]["base"], dataset_dir=tmp_path / "sft-data", output_dir=tmp_path / "out"
    )
    path = configs.write_toml(table, tmp_path / "sft.toml")
    with open(path, "rb") as f:
        assert tomllib.load(f) == table
    check_keys(table, ACCEPTED_SFT)
    s = paper["prime_rl"]["sft"]
    assert table["model"] == {"name": "Qwen/Qwen3-4B-Base", "attn": "flash_attention_3"}  # an HF id stays an id
    assert table["data"]["name"] == str((tmp_path / "sft-data").absolute()) and table["data"]["splits"] == ["train"]
    assert (table["data"]["batch_size"], table["max_steps"]) == (s["batch_size"], s["max_steps"])
    assert table["data"]["loss_mask"]["assistant"] is True and table["data"]["loss_mask"]["user"] is False
    assert table["optim"] == {"type": "adamw", "lr": s["lr"]}


def test_sft_dataset_rejects_bad_traces(tmp_path: Path) -> None:
    no_assistant = write_traces(tmp_path / "a.parquet", [[{"role": "user", "content": "x"}]])
    with pytest.raises(PrimeRLConfigError, match="row 0 has no assistant turn"):
        collect.write_sft_dataset(no_assistant, tmp_path / "out")
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "b.parquet")
    with pytest.raises(PrimeRLConfigError, match="no 'messages' column"):
        collect.write_sft_dataset(tmp_path / "b.parquet", tmp_path / "out")


def fake_step(output_dir: Path, step: int, stable: bool = True) -> None:
    d = output_dir / "weights" / f"step_{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_text(f"weights {step}")
    if stable:
        (d / "STABLE").touch()


def test_checkpoints_move_to_the_shared_paths(tmp_path: Path) -> None:
    out = tmp_path / "rl" / "B" / "seed42" / "prime-rl"
    fake_step(out, 50)
    fake_step(out, 100)
    fake_step(out, 150, stable=False)  # still being written: not collected
    summary = collect.collect_rl_checkpoints(out, out.parent, out.parent / "checkpoints.json")
    assert summary["steps"] == [50, 100] and summary["last"] == 100
    assert (out.parent / "step100" / "model.safetensors").read_text() == "weights 100"
    assert not (out / "weights" / "step_100").exists()
    sft_out = tmp_path / "sft" / "B" / "prime-rl"
    fake_step(sft_out, 10)
    assert collect.collect_sft_checkpoint(sft_out, tmp_path / "checkpoints" / "B" / "sft") == 10
    assert (tmp_path / "checkpoints" / "B" / "sft" / "STABLE").exists()
    with pytest.raises(PrimeRLConfigError, match="no finished checkpoint"):
        collect.collect_sft_checkpoint(tmp_path / "empty", tmp_path / "x")


FAKE_UV = r"""#!{python}
# A stand-in for `uv run --frozen --no-sync <rl|sft> @ <toml>`: writes what prime-rl's trainer leaves behind.
import sys, tomllib
from pathlib import Path
args = sys.argv[1:]
assert args[:3] == ["run", "--frozen", "--no-sync"] and args[4] == "@", args
with open(args[5], "rb") as f:
    table = tomllib.load(f)
Path("uv-called").write_text(args[3])
step = Path(table["output_dir"]) / "weights" / f"step_{{table['max_steps']}}"
step.mkdir(parents=True)
(step / "config.json").write_text("{{}}")
(step / "STABLE").touch()
out = Path(table["output_dir"])
(out / "run_default").mkdir(parents=True, exist_ok=True)
(out / "metrics.jsonl").write_text('{{"step": 1, "time": 0, "loss/mean": 0.5, "optim/lr": 1e-5}}\n{{"step": 2, "loss/m')
(out / "run_default" / "metrics.jsonl").write_text(
    '{{"step": 1, "time": 0, "progress/rollouts": 4, "train": {{"agg": {{"all": {{"a": {{"reward": {{"mean": 0.25}}}}}}}}}}}}\n'
)
"""


def prime_rl_local_config(tmp_path: Path) -> str:
    """config/local.yaml with the rl design prime-rl can honour (bf16, zero-advantage rollouts skipped)."""
    import yaml

    cfg = load_config(REPO_ROOT / "config" / "local.yaml")
    cfg["rl"] = {**cfg["rl"], "dtype": "bfloat16", "skip_zero_advantage": True}
    path = tmp_path / "local-prime-rl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_cli_renders_launches_and_collects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`predict prime-rl-config` + `predict prime-rl-train` end to end, with a fake `uv` standing in for prime-rl."""
    from predict.cli import main

    bin_dir, checkout = tmp_path / "bin", tmp_path / "prime-rl"
    bin_dir.mkdir()
    checkout.mkdir()
    uv = bin_dir / "uv"
    uv.write_text(FAKE_UV.format(python=sys.executable))
    uv.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    local = prime_rl_local_config(tmp_path)
    traces = write_traces(
        tmp_path / "traces" / "A.parquet",
        [[{"role": "user", "content": "t"}, {"role": "assistant", "content": "FINAL: x"}]],
    )
    sft_toml, ckpt = tmp_path / "sft" / "A" / "prime-rl.toml", tmp_path / "checkpoints" / "A" / "sft"
    args = ["prime-rl-config", "sft", "--config", local, "--arm", "A", "--traces", str(traces)]
    args += ["--dataset-dir", str(tmp_path / "sft" / "A" / "data"), "--model", "Qwen/Qwen3-4B-Base"]
    assert main([*args, "--output-dir", str(tmp_path / "sft" / "A" / "prime-rl"), "--out", str(sft_toml)]) == 0
    assert (
        main(["prime-rl-train", "sft", "--config", local, "--toml", str(sft_toml), "--dir", str(checkout),
              "--checkpoint", str(ckpt)]) == 0
    )
    assert (checkout / "uv-called").read_text() == "sft" and (ckpt / "STABLE").exists()

    run_dir = tmp_path / "rl" / "A" / "seed42"
    args = [
        "prime-rl-config",
        "rl",
        "--config",
        local,
        "--run",
        "A",
        "--seed",
        "42",
        "--tasks-file",
        str(tmp_path / "rl.parquet"),
    ]
    args += ["--model", str(ckpt), "--output-dir", str(run_dir / "prime-rl"), "--out", str(run_dir / "prime-rl.toml")]
    assert main(args) == 0
    args = ["prime-rl-train", "rl", "--config", local, "--toml", str(run_dir / "prime-rl.toml"), "--dir", str(checkout)]
    assert main([*args, "--run-dir", str(run_dir), "--checkpoints-out", str(run_dir / "checkpoints.json")]) == 0
    steps = load_config(REPO_ROOT / "config" / "local.yaml")["rl"]["steps"]
    assert (run_dir / f"step{steps}" / "STABLE").exists()
    assert json.loads((run_dir / "checkpoints.json").read_text())["steps"] == [steps]
    # prime-rl's metrics.jsonl (trainer + orchestrator) as one long parquet; the torn last line is skipped
    metrics = pq.read_table(run_dir / "prime-rl-metrics.parquet").to_pylist()
    assert sorted((m["source"], m["step"], m["metric"], m["value"]) for m in metrics) == [
        ("orchestrator", 1, "progress/rollouts", 4),
        ("orchestrator", 1, "train/agg/all/a/reward/mean", 0.25),
        ("trainer", 1, "loss/mean", 0.5),
        ("trainer", 1, "optim/lr", 1e-5),
    ]
    # ... and in the per-step schema every trainer writes (run and seed from the run folder)
    (row,) = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert (row["run"], row["seed"], row["step"], row["backend"]) == ("A", 42, 1, "prime_rl")
    assert (row["reward_mean"], row["loss"], row["lr"], row["n_rollouts"]) == (0.25, 0.5, 1e-5, 4)
    assert (tmp_path / "sft" / "A" / "metrics.parquet").exists()
    # a bad run name is one clear error line (exit 2), not a traceback
    bad = ["prime-rl-config", "rl", "--config", local, "--run", "Z", "--seed", "1", "--tasks-file", "x", "--model", "m"]
    assert main([*bad, "--output-dir", "o", "--out", str(tmp_path / "z.toml")]) == 2
    # the embedded default's design (fp32, zero-advantage rollouts kept) is refused on prime-rl, not dropped
    as_is = ["prime-rl-config", "rl", "--config", str(REPO_ROOT / "config" / "local.yaml"), "--run", "A"]
    as_is += ["--seed", "1", "--tasks-file", "x", "--model", "m", "--output-dir", "o", "--out", str(tmp_path / "y.toml")]
    assert main(as_is) == 2 and not (tmp_path / "y.toml").exists()


def test_a_published_rl_run_asked_for_again_trains_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`predict prime-rl-train rl` marks prime-rl's output_dir finished once it has published the run's steps and
    metrics (predict.fingerprint rule 4, as the sft path does): run again (--forcerun), it trains afresh instead of
    resuming the published run from the checkpoints prime-rl left in it."""
    from predict.cli import main
    from predict.fingerprint import read_fingerprint

    bin_dir, checkout = tmp_path / "bin", tmp_path / "prime-rl"
    bin_dir.mkdir()
    checkout.mkdir()
    (bin_dir / "uv").write_text(FAKE_UV.format(python=sys.executable))
    (bin_dir / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "rl" / "A" / "seed42"
    local = prime_rl_local_config(tmp_path)
    args = ["prime-rl-config", "rl", "--config", local, "--run", "A", "--seed", "42"]
    args += ["--tasks-file", "rl.parquet", "--model", "m/m", "--output-dir", str(run_dir / "prime-rl")]
    assert main([*args, "--out", str(run_dir / "prime-rl.toml")]) == 0
    train = ["prime-rl-train", "rl", "--config", local, "--toml", str(run_dir / "prime-rl.toml"), "--dir", str(checkout)]
    train += ["--run-dir", str(run_dir), "--checkpoints-out", str(run_dir / "checkpoints.json")]
    assert main(train) == 0
    assert read_fingerprint(run_dir / "prime-rl")[1], "published, but not marked finished"
    resumable = run_dir / "prime-rl" / "checkpoints" / "step_2"  # what prime-rl would resume the run from
    resumable.mkdir(parents=True)
    assert main(train) == 0  # forced again: the finished output_dir is emptied, not resumed
    assert not resumable.exists()


RETRYING_UV = r"""#!{python}
# `uv run ... rl @ <toml>` as prime-rl behaves across a SLURM retry: metrics.jsonl files are appended to (two trainer
# records per step), a full checkpoint every 2 steps; attempt 1 dies during step 4 (a torn line), attempt 2 resumes
# from the latest checkpoint only if the TOML says ckpt.resume_step = -1 (else it starts over from step 1).
import json, sys, tomllib
from pathlib import Path
with open(sys.argv[6], "rb") as f:
    table = tomllib.load(f)
out = Path(table["output_dir"])
(out / "run_default").mkdir(parents=True, exist_ok=True)
counter = out.parent / "attempt"
attempt = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(attempt))
ckpts = sorted(int(d.name[5:]) for d in (out / "checkpoints").glob("step_*")) if (out / "checkpoints").exists() else []
start = ckpts[-1] + 1 if (ckpts and table["ckpt"].get("resume_step") == -1) else 1
trainer, orch = open(out / "metrics.jsonl", "a"), open(out / "run_default" / "metrics.jsonl", "a")
last = 5 if attempt == 1 else table["max_steps"]
for step in range(start, last + 1):
    if attempt == 1 and step == 5:
        trainer.write('{{"step": 5, "loss/me')  # killed mid-write
        sys.exit(1)
    trainer.write(json.dumps({{"step": step, "time": 0, "loss/mean": attempt * 10 + step}}) + "\n")
    trainer.write(json.dumps({{"step": step, "time": 0, "lr": 1e-5}}) + "\n")
    orch.write(json.dumps({{"step": step, "time": 0, "progress/rollouts": 4,
                            "train/agg/all/a/reward/mean": attempt + step / 10}}) + "\n")
    b = out / "run_default" / "broadcasts" / f"step_{{step}}"  # prime-rl's layout, as on the H200 (docs/prime-rl.md)
    b.mkdir(parents=True, exist_ok=True)
    (b / "STABLE").touch()
    if step % 2 == 0:  # the trainer's DCP checkpoint (.metadata last) and the orchestrator's progress
        (out / "checkpoints" / f"step_{{step}}" / "trainer").mkdir(parents=True, exist_ok=True)
        (out / "checkpoints" / f"step_{{step}}" / "trainer" / ".metadata").touch()
        (out / "run_default" / "checkpoints" / f"step_{{step}}" / "orchestrator").mkdir(parents=True, exist_ok=True)
        (out / "run_default" / "checkpoints" / f"step_{{step}}" / "orchestrator" / "progress.pt").touch()
w = out / "weights" / f"step_{{table['max_steps']}}"
w.mkdir(parents=True)
(w / "STABLE").touch()
"""


def test_a_retried_rl_job_resumes_and_keeps_the_last_attempt_of_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 logs steps 1-4 and dies in step 5; the retry resumes from checkpoint 4 (not step 0) and the metrics
    table holds each step once: steps 1-4 from attempt 1, 5-6 from attempt 2. Nothing is lost: the superseded and
    torn lines are kept beside."""
    import yaml

    from predict.cli import main

    bin_dir, checkout = tmp_path / "bin", tmp_path / "prime-rl"
    bin_dir.mkdir()
    checkout.mkdir()
    (bin_dir / "uv").write_text(RETRYING_UV.format(python=sys.executable))
    (bin_dir / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    cfg = yaml.safe_load(Path(prime_rl_local_config(tmp_path)).read_text())
    cfg["rl"] = {**cfg["rl"], "steps": 6, "checkpoint_every": 2}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "rl" / "A" / "seed42"
    toml = run_dir / "prime-rl.toml"
    args = ["prime-rl-config", "rl", "--config", str(tmp_path / "c.yaml"), "--run", "A", "--seed", "42"]
    args += ["--tasks-file", "rl.parquet", "--model", "m/m", "--output-dir", str(run_dir / "prime-rl"), "--out", str(toml)]
    assert main(args) == 0
    train = ["prime-rl-train", "rl", "--config", str(tmp_path / "c.yaml"), "--toml", str(toml), "--dir", str(checkout)]
    train += ["--run-dir", str(run_dir), "--checkpoints-out", str(run_dir / "checkpoints.json")]
    from predict.train.prime_rl.cluster import PrimeRLSetupError

    with pytest.raises(PrimeRLSetupError, match="exit 1"):
        main(train)  # attempt 1 dies: the job fails and SLURM retries it
    assert main(train) == 0
    rows = pq.read_table(run_dir / "prime-rl-metrics.parquet").to_pylist()  # prime-rl's own, as a long table
    losses = {r["step"]: r["value"] for r in rows if r["metric"] == "loss/mean"}
    assert sorted(r["step"] for r in rows if r["metric"] == "loss/mean") == [1, 2, 3, 4, 5, 6]  # each step once
    assert losses == {1: 11, 2: 12, 3: 13, 4: 14, 5: 25, 6: 26}  # the retry resumed after checkpoint 4
    rewards = sorted((r["step"], r["value"]) for r in rows if r["metric"] == "train/agg/all/a/reward/mean")
    assert rewards == [(1, 1.1), (2, 1.2), (3, 1.3), (4, 1.4), (5, 2.5), (6, 2.6)]
    steps = pq.read_table(run_dir / "metrics.parquet").to_pylist()  # the per-step schema: each step once too
    assert [(r["step"], r["loss"], r["reward_mean"]) for r in steps] == [
        (s, losses[s], reward) for s, reward in rewards
    ]
    superseded = (run_dir / "prime-rl" / "metrics.superseded.jsonl").read_text()
    assert superseded == '{"step": 5, "loss/me\n'  # the torn line, kept
    assert json.loads((run_dir / "checkpoints.json").read_text())["steps"] == [6]


def test_superseded_records_are_those_a_later_attempt_redoes() -> None:
    """Attempt 2 resumed from checkpoint 2 after attempt 1 had logged step 3: step 3 of attempt 1 is dropped, and so
    is step 4 of attempt 1 that attempt 2 never reached (it belongs to a trajectory the resume discarded)."""
    from predict.train.prime_rl.cluster import last_attempt_records

    def rec(step: int, tag: str) -> str:
        return json.dumps({"step": step, "tag": tag})

    first = [rec(1, "a"), rec(1, "a2"), rec(2, "a"), rec(3, "a"), rec(4, "a")]
    second = [rec(3, "b"), rec(3, "b2")]
    kept, dropped = last_attempt_records([first, second])
    assert kept == [rec(1, "a"), rec(1, "a2"), rec(2, "a"), rec(3, "b"), rec(3, "b2")]
    assert dropped == [rec(3, "a"), rec(4, "a")]
    assert last_attempt_records([first]) == (first, [])


def test_extension_runs_carry_their_environment_and_mask(paper: dict[str, Any], tmp_path: Path) -> None:
    """An extension's own knobs reach prime-rl exactly as they reach local rollouts: the expensive-tests runs'
    test cost (and the budget scaled by it), edit_on_revise's variant and cap, mask_decision's decision mask."""
    from predict.env.harness import LocalAgentHarnessConfig

    def harness(run: str) -> dict[str, Any]:  # the protocol table of the harness
        (source,) = render_rl(paper, run, tmp_path)["orchestrator"]["train"]["source"]
        return source["env"]["agent"]["harness"]["protocol"]

    plain, costly = harness("B"), harness("expensive_tests_B")
    assert (plain["test_cost"], costly["test_cost"]) == (1, 3)
    assert costly["budget"] == plain["budget"] + 2  # a direct solve still fits: budget + (k - 1)
    assert harness("edit_on_revise")["variant"] == "edit_on_revise"
    assert harness("edit_on_revise")["max_chained_revisions"] == paper["env"]["max_chained_revisions"]
    (source,) = render_rl(paper, "expensive_tests_B", tmp_path)["orchestrator"]["train"]["source"]
    rendered = LocalAgentHarnessConfig(**source["env"]["agent"]["harness"])  # our harness accepts every key
    assert rendered.protocol == ProtocolConfig(**harness("expensive_tests_B"))
    algo = {run: render_rl(paper, run, tmp_path)["orchestrator"]["algo"] for run in ("B", "mask_decision")}
    assert (algo["B"]["mask_decision"], algo["mask_decision"]["mask_decision"]) == (False, True)



def test_no_run_asks_prime_rls_train_client_for_a_stream(paper: dict[str, Any], tmp_path: Path) -> None:
    """prime-rl's env server answers the agent program through verifiers' TrainClient, and prime-rl's pinned verifiers
    (d30a3f48) refuses a streamed request from it: HTTP 502 "TrainClient does not support streaming" for every
    rollout of the first RL run on the H200 (issue 39). Every run's rendered harness asks for whole responses."""
    from predict.env.harness import LocalAgentHarnessConfig
    from predict.runs import study_runs

    for run in study_runs(paper):
        (source,) = render_rl(paper, run, tmp_path)["orchestrator"]["train"]["source"]
        assert LocalAgentHarnessConfig(**source["env"]["agent"]["harness"]).stream is False, run

# ---------------------------------------------------------------------------------------------------------------
# Issue 16 items 2-5: resume, seeds, the install, one rl: design on both backends
# ---------------------------------------------------------------------------------------------------------------
def test_a_retried_job_resumes_from_its_latest_checkpoint(paper: dict[str, Any], tmp_path: Path) -> None:
    """prime-rl refuses an output_dir with checkpoints unless resuming; -1 = the latest one, or scratch if none."""
    assert render_rl(paper, "B", tmp_path)["ckpt"]["resume_step"] == -1
    sft = configs.sft_config(paper, "B", model="m/m", dataset_dir=tmp_path / "d", output_dir=tmp_path / "o")
    assert sft["ckpt"]["resume_step"] == -1


def test_the_seed_changes_the_rl_task_order(paper: dict[str, Any], tmp_path: Path) -> None:
    """prime-rl reshuffles each epoch with Random(epoch) whatever the seed; the rendered taskset orders the tasks by
    seed, as the local trainer's first epoch does (checked here by loading the rendered taskset config)."""
    from predict.env.taskset import MbppTaskset
    from predict.train.rl import step_tasks

    rows = [{"task_id": i, "text": f"t{i}", "test_list": [f"assert f({i})"]} for i in range(40)]
    orders = {}
    for seed in (42, 43):
        table = render_rl(paper, "B", tmp_path, seed=seed)["orchestrator"]["train"]["source"][0]["env"]["taskset"]
        assert table["order_seed"] == seed
        config = MbppTasksetConfig.model_validate({**table, "path": None})
        orders[seed] = [t.data.task_id for t in MbppTaskset.from_rows(rows, config).load()]
        assert sorted(orders[seed]) == list(range(40))
        # the local trainer's first-epoch order for this seed
        local = [r["task_id"] for r in step_tasks(rows, seed, 1, per_step=40, group=1)]
        assert orders[seed] == local
    assert orders[42] != orders[43]


def test_the_install_is_rendered_to_work(paper: dict[str, Any], tmp_path: Path) -> None:
    """The attention kernel is concrete and its extra is synced; auto and a missing extra say what to set."""
    t = render_rl(paper, "A", tmp_path)
    assert t["trainer"]["model"]["attn"] == paper["prime_rl"]["attn"] == "flash_attention_3"
    assert configs.ATTN_EXTRAS[paper["prime_rl"]["attn"]] in paper["prime_rl"]["extras"]
    sft = configs.sft_config(paper, "A", model="m/m", dataset_dir=tmp_path / "d", output_dir=tmp_path / "o")
    assert sft["model"]["attn"] == "flash_attention_3"
    auto = {**paper, "prime_rl": {**paper["prime_rl"], "attn": "auto"}}
    with pytest.raises(PrimeRLConfigError, match=r"prime_rl.attn: 'auto' .*name the kernel"):
        render_rl(auto, "A", tmp_path)
    missing = {**paper, "prime_rl": {**paper["prime_rl"], "extras": []}}
    with pytest.raises(PrimeRLConfigError, match=r"prime_rl.extras: \[\] lacks 'flash-attn-3'.*add it"):
        render_rl(missing, "A", tmp_path)


def test_one_rl_design_on_both_backends(paper: dict[str, Any], tmp_path: Path) -> None:
    """eps_low/eps_high/kl_coef reach the custom loss, skip_zero_advantage the filter, dtype the fp32 master weights;
    a setting prime-rl cannot honour is an error naming the key and the backend."""
    cfg = {**paper, "rl": {**paper["rl"], "eps_low": 0.1, "eps_high": 0.3, "kl_coef": 0.02}}
    t = render_rl(cfg, "B", tmp_path)
    assert t["trainer"]["loss"] == {
        "type": "custom",
        "import_path": "predict.train.prime_rl.loss.clipped_surrogate",
        "kwargs": {"eps_low": 0.1, "eps_high": 0.3, "kl_coef": 0.02},
    }
    assert t["orchestrator"]["post_batch_filters"] == [
        {"type": "gibberish", "enforce": False},
        {"type": "repetition", "enforce": False},
        {"type": "zero_advantage", "enforce": True},
    ]
    assert t["trainer"]["model"]["optimization_dtype"] == "float32"  # bf16 compute, updates kept in fp32
    for key, value, says in [
        ("dtype", "float32", "rl.dtype: 'float32' cannot be honoured on backend prime_rl"),
        ("skip_zero_advantage", False, "rl.skip_zero_advantage: false cannot be honoured on backend prime_rl"),
    ]:
        bad = {**paper, "rl": {**paper["rl"], key: value}}
        with pytest.raises(PrimeRLConfigError, match=says):
            render_rl(bad, "A", tmp_path)


def test_the_custom_loss_is_the_local_trainers_loss_per_sample() -> None:
    """clipped_surrogate (prime-rl's per-sample sum) / N_rl == predict_loss on the same tokens (the full parity with
    prime-rl's own compute_loss runs in tests/prime_rl_real_flow.py)."""
    import types

    torch = pytest.importorskip("torch")
    from predict.train.loss import LossConfig, predict_loss
    from predict.train.prime_rl import loss as custom

    fake = types.ModuleType("prime_rl.trainer.rl.loss")
    fake.LossOutputs = lambda loss, metrics: types.SimpleNamespace(loss=loss, metrics=metrics)  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(1)
    q = -torch.rand(12, generator=gen, dtype=torch.float64) - 0.1
    new = (q + torch.rand(12, generator=gen, dtype=torch.float64) - 0.5).requires_grad_(True)
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0], dtype=torch.bool)
    weights = torch.tensor([0, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 0], dtype=torch.float64)  # a label token at rl weight 0
    adv = torch.full((12,), -0.7, dtype=torch.float64)
    inputs = types.SimpleNamespace(
        trainer_logprobs=new,
        inference_logprobs=q,
        advantages=adv,
        loss_mask=mask & (weights != 0),
        loss_weights=weights,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "prime_rl.trainer.rl.loss", fake)
        out = custom.clipped_surrogate(inputs, eps_low=0.2, eps_high=0.2, kl_coef=0.05)
    n_rl = int((mask & (weights != 0)).sum())
    ref, _ = predict_loss(
        new.unsqueeze(0),
        {
            "logprobs": q.unsqueeze(0),
            "advantages": adv.unsqueeze(0),
            "rl_weights": (weights * mask).unsqueeze(0),
            "ce_weights": torch.zeros(1, 12, dtype=torch.float64),
        },
        LossConfig(0.2, 0.2, 0.05),
    )
    assert float(out.loss.detach()) / n_rl == pytest.approx(float(ref.detach()), rel=1e-12)


def test_the_setup_stage_reads_prime_rl_typed_from_its_slice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`predict prime-rl-setup` takes the typed view: repo, commit, python and extras as the config sets them."""
    from predict.cli import main
    from predict.stages import slice_file
    from predict.train.prime_rl import cluster

    seen: dict[str, Any] = {}
    monkeypatch.setattr(cluster, "setup_prime_rl", lambda *args, **kw: seen.update(args=args, **kw) or {"commit": "0" * 40})
    config = load_config(REPO_ROOT / "config" / "config.yaml")
    path = slice_file(config, "prime-rl-setup", tmp_path)
    assert main(["prime-rl-setup", "--config-slice", path, "--dir", str(tmp_path / "c"), "--out", str(tmp_path / "s.json")]) == 0
    p = config["prime_rl"]
    assert seen["args"][:2] == (p["repo"], p["commit"]) and (seen["python"], seen["extras"]) == (p["python"], p["extras"])
    assert [f.name for f in seen["attention_patches"]] == configs.attention_patches(config)

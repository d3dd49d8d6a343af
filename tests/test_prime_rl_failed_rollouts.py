"""Failed rollouts on prime-rl, without prime-rl: the threshold check over prime-rl's per-step metrics, the watched
launch that stops a run at such a step, and the rendered TOML that carries the threshold and the seat's sampling.
(tests/test_prime_rl_integration.py runs a failed model call through prime-rl's own sink and metrics.)"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from predict.config import REPO_ROOT, load_config
from predict.train.prime_rl import cluster, configs
from predict.train.prime_rl.cluster import run_watched
from predict.train.prime_rl.collect import FailedRolloutsError, check_failed_rollouts, check_open_step
from predict.train.prime_rl.configs import MAX_FAILED_SHARE_VAR, PrimeRLConfigError

AGG = "train/agg/all/agent"


def step_line(step: int, rollouts: int, **errors: int) -> str:
    """One orchestrator metrics.jsonl record, keyed as prime-rl's orchestrator logs a step."""
    return json.dumps(
        {"step": step, "progress/rollouts": rollouts, **{f"{AGG}/error/{k}": v for k, v in errors.items()}}
    )


def write_steps(output_dir: Path, *lines: str) -> None:
    (output_dir / "run_default").mkdir(parents=True, exist_ok=True)
    (output_dir / "run_default" / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def test_the_check_names_the_first_step_over_the_threshold_and_leaves_prime_rls_cancels_out(tmp_path: Path) -> None:
    write_steps(
        tmp_path,
        step_line(1, 16, ProviderError=2, Cancelled=9),  # 2/16: within 0.25 (the cancels are prime-rl's own)
        step_line(2, 16, ProviderError=3, HarnessError=2),  # 5/16 > 0.25
        step_line(3, 16, ProviderError=16),
    )
    with pytest.raises(FailedRolloutsError, match=r"^step 2: 5 of 16 rollouts failed .*max_failed_share 0.25"):
        check_failed_rollouts(tmp_path, 0.25)
    check_failed_rollouts(tmp_path, 1.0)
    # a retried attempt is judged on its own records (it redoes the steps after its checkpoint)
    metrics = tmp_path / "run_default" / "metrics.jsonl"
    check_failed_rollouts(tmp_path, 0.25, start=metrics.stat().st_size)
    write_steps(tmp_path, step_line(1, 16, Cancelled=16))
    check_failed_rollouts(tmp_path, 0.0)  # nothing failed: every rollout was cancelled by the orchestrator


FAKE_RUN = """
import json, os, subprocess, sys, time
out = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(os.path.join(out, "pids"), "w").write(f"{os.getpid()} {child.pid}")
os.makedirs(os.path.join(out, "run_default"), exist_ok=True)
with open(os.path.join(out, "run_default", "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": 1, "progress/rollouts": 4, "train/agg/all/agent/error/ProviderError": 3}) + "\\n")
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in state  # stopped, waiting for its (new) parent to reap it


def test_a_watched_run_is_stopped_at_a_step_with_too_many_failures(tmp_path: Path) -> None:
    script = tmp_path / "fake_rl.py"
    script.write_text(FAKE_RUN)
    t0 = time.time()
    with pytest.raises(FailedRolloutsError, match="step 1: 3 of 4 rollouts failed"):
        run_watched(
            [sys.executable, script, tmp_path], lambda: check_failed_rollouts(tmp_path, 0.25), poll_s=0.2, stop_s=5
        )
    assert time.time() - t0 < 30  # stopped, not waited out
    deadline = time.time() + 10
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    while not all(_gone(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids  # the run and the processes it started


def test_a_watched_run_that_stays_within_the_threshold_finishes(tmp_path: Path) -> None:
    write_steps(tmp_path, step_line(1, 4, ProviderError=1))
    run_watched([sys.executable, "-c", "import time; time.sleep(0.5)"], lambda: check_failed_rollouts(tmp_path, 0.25),
                poll_s=0.1)


@pytest.fixture(scope="module")
def paper() -> dict[str, Any]:
    return load_config(REPO_ROOT / "config" / "config.yaml")


def test_the_rl_toml_carries_the_threshold_and_the_seats_sampling(paper: dict[str, Any], tmp_path: Path) -> None:
    table = configs.rl_config(paper, "B", 42, model="/m", tasks=tmp_path / "rl.parquet", output_dir=tmp_path / "o")
    assert table["env_vars"] == {MAX_FAILED_SHARE_VAR: str(paper["prime_rl"]["rl"]["max_failed_share"])}
    seat = table["orchestrator"]["train"]["source"][0]["env"]["agent"]["sampling"]
    orchestrator = table["orchestrator"]["train"]["sampling"]
    assert (seat["temperature"], seat["max_tokens"]) == (
        orchestrator["temperature"],
        orchestrator["max_completion_tokens"],
    )
    assert seat["chat_template_kwargs"] == {"enable_thinking": paper["model"]["enable_thinking"]}
    missing = {**paper, "prime_rl": {**paper["prime_rl"], "rl": {**paper["prime_rl"]["rl"]}}}
    del missing["prime_rl"]["rl"]["max_failed_share"]
    with pytest.raises(PrimeRLConfigError, match=r"prime_rl\.rl\.max_failed_share: missing"):
        configs.rl_config(missing, "B", 42, model="/m", tasks=tmp_path / "rl.parquet", output_dir=tmp_path / "o")


def test_the_threshold_must_be_a_share(paper: dict[str, Any]) -> None:
    from predict.config import ConfigError, validate_config

    bad = {**paper, "prime_rl": {**paper["prime_rl"], "rl": {**paper["prime_rl"]["rl"], "max_failed_share": 1.5}}}
    with pytest.raises(ConfigError, match=r"prime_rl\.rl\.max_failed_share"):
        validate_config(bad, "paper")


FAKE_UV = """#!{python}
import json, os, sys, time, tomllib
table = tomllib.load(open(sys.argv[-1], "rb"))
os.makedirs(os.path.join(table["output_dir"], "run_default"), exist_ok=True)
with open(os.path.join(table["output_dir"], "run_default", "metrics.jsonl"), "a") as f:
    f.write(json.dumps({{"step": 1, "progress/rollouts": 4, "train/agg/all/agent/error/ProviderError": {failed}}}) + "\\n")
time.sleep({sleep})
"""


def test_launch_stops_an_rl_run_over_the_threshold_and_judges_a_retry_on_its_own_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "WATCH_POLL_S", 0.2)
    toml = configs.write_toml(
        {"output_dir": str(tmp_path / "o"), "env_vars": {MAX_FAILED_SHARE_VAR: "0.25"}}, tmp_path / "rl.toml"
    )
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV.format(python=sys.executable, failed=3, sleep=60))
    uv.chmod(0o755)
    with pytest.raises(FailedRolloutsError, match="step 1: 3 of 4"):
        cluster.launch("rl", toml, tmp_path, uv=str(uv))
    uv.write_text(FAKE_UV.format(python=sys.executable, failed=1, sleep=0))  # the retry: step 1 again, 1 of 4
    cluster.launch("rl", toml, tmp_path, uv=str(uv))


# What prime-rl's dispatcher logs for each failed rollout (orchestrator.log, colours and all), as seen on the H200.
FAILED_LINE = (
    "\x1b[2m10:27:32\x1b[0m \x1b[33m\x1b[1mWARNING\x1b[0m \x1b[33m\x1b[1m\x1b[22mRollout failed in group a47e11b1 "
    "(predict_mbpp) — HarnessError: harness 'predict_local_agent' exited 97: HTTP 502: TrainClient does not support "
    "streaming\x1b[0m\x1b[0m"
)
TASK_FAILED_LINE = "10:27:33 WARNING Rollout task failed in group b5 (predict_mbpp): ConnectError('refused')"


def write_log(output_dir: Path, *lines: str) -> None:
    (output_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(output_dir / "logs" / "orchestrator.log", "a") as f:
        f.write("".join(line + "\n" for line in lines))


def test_a_step_in_progress_that_can_no_longer_stay_within_the_threshold_stops_the_run(tmp_path: Path) -> None:
    """prime-rl resamples failed rollouts without end: on the H200 every rollout failed (852 in 5 minutes) and no
    step was ever logged, so the per-step check never fired. A step of 16 under a share of 0.25 holds at most
    0.25 / 0.75 * 16 = 5.3 failures whatever the rest of it does."""
    write_log(tmp_path, "10:27:30 INFO Train batch 0/16", *[FAILED_LINE] * 4, TASK_FAILED_LINE)
    check_open_step(tmp_path, 0.25, 16)  # 5: the step could still finish within the share
    write_log(tmp_path, FAILED_LINE)
    with pytest.raises(FailedRolloutsError, match=r"^6 rollouts failed .*max_failed_share 0.25 \(5.3\).*The first: "
                       r"HarnessError: harness 'predict_local_agent' exited 97: HTTP 502"):
        check_open_step(tmp_path, 0.25, 16)
    check_open_step(tmp_path, 1.0, 16)  # a share of 1 allows every failure
    # failures a finished step already counted are judged by check_failed_rollouts, not again here
    write_steps(tmp_path, step_line(1, 16, HarnessError=4))
    check_open_step(tmp_path, 0.25, 16)
    # an attempt is judged from where its log starts
    log = tmp_path / "logs" / "orchestrator.log"
    check_open_step(tmp_path, 0.25, 16, metrics_start=10**6, log_start=log.stat().st_size)


FAKE_UV_FAILING = """#!{python}
import os, sys, time, tomllib
table = tomllib.load(open(sys.argv[-1], "rb"))
os.makedirs(os.path.join(table["output_dir"], "logs"), exist_ok=True)
with open(os.path.join(table["output_dir"], "logs", "orchestrator.log"), "a") as f:
    for _ in range(20):
        f.write({line!r} + "\\n")
time.sleep(30)
"""


def test_launch_stops_an_rl_run_whose_every_rollout_fails_before_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "WATCH_POLL_S", 0.2)
    toml = configs.write_toml(
        {"output_dir": str(tmp_path / "o"), "env_vars": {MAX_FAILED_SHARE_VAR: "0.25"},
         "orchestrator": {"batch_size": 16}},
        tmp_path / "rl.toml",
    )
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV_FAILING.format(python=sys.executable, line=FAILED_LINE))
    uv.chmod(0o755)
    t0 = time.time()
    with pytest.raises(FailedRolloutsError, match="20 rollouts failed in the step in progress"):
        cluster.launch("rl", toml, tmp_path, uv=str(uv))
    assert time.time() - t0 < 20  # stopped, not waited out


# prime-rl's resume_step = -1, as its launcher, trainer and orchestrator each resolve it: the newest step_<N> folder
# of their own checkpoint folder (prime_rl.utils.pathing.resolve_latest_ckpt_step); the orchestrator then needs that
# step's weights (prime_rl.orchestrator.utils.get_weight_dir), which is where the H200's retry stopped.
FAKE_UV_RESUMING = """#!{python}
import json, os, sys, tomllib
table = tomllib.load(open(sys.argv[-1], "rb"))
out = table["output_dir"]
def newest(d):
    steps = sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_")) if os.path.isdir(d) else []
    return steps[-1] if steps else None
trainer, orchestrator = newest(os.path.join(out, "checkpoints")), newest(os.path.join(out, "run_default", "checkpoints"))
json.dump({{"trainer": trainer, "orchestrator": orchestrator}}, open(os.path.join(out, "resumed.json"), "w"))
if orchestrator is not None and not os.path.exists(os.path.join(out, "run_default", "broadcasts", f"step_{{orchestrator}}", "STABLE")):
    sys.exit(f"FileNotFoundError: No weight directory found for checkpoint step {{orchestrator}}")
"""


def killed_run(output_dir: Path, trainer: dict[int, bool], orchestrator: list[int], broadcasts: list[int]) -> None:
    """prime-rl's checkpoint layout of a run killed mid-way: trainer steps (complete: DCP's .metadata written),
    orchestrator steps (progress.pt), weight broadcasts (STABLE)."""
    for step, complete in trainer.items():
        (output_dir / "checkpoints" / f"step_{step}" / "trainer").mkdir(parents=True)
        (output_dir / "checkpoints" / f"step_{step}" / "trainer" / "__0_0.distcp").write_bytes(b"x")
        if complete:
            (output_dir / "checkpoints" / f"step_{step}" / "trainer" / ".metadata").write_bytes(b"m")
    for step in orchestrator:
        (output_dir / "run_default" / "checkpoints" / f"step_{step}" / "orchestrator").mkdir(parents=True)
        (output_dir / "run_default" / "checkpoints" / f"step_{step}" / "orchestrator" / "progress.pt").write_bytes(b"p")
    for step in broadcasts:
        (output_dir / "run_default" / "broadcasts" / f"step_{step}").mkdir(parents=True)
        (output_dir / "run_default" / "broadcasts" / f"step_{step}" / "STABLE").touch()


@pytest.mark.parametrize(
    ("trainer", "orchestrator", "broadcasts", "resumed"),
    [
        ({1: True, 2: True}, [1, 2, 3], [1, 2], 2),  # the H200's run, killed in step 2: the orchestrator a step ahead
        ({1: True, 2: False}, [1, 2, 3], [1, 2], 1),  # killed while the trainer wrote step 2's checkpoint
        ({}, [1], [], None),  # killed before the trainer's first checkpoint: from scratch
        ({1: True, 2: True}, [1, 2], [1, 2], 2),  # in step: nothing to change
    ],
)
def test_a_killed_rl_run_resumes_trainer_and_orchestrator_from_one_step(
    tmp_path: Path, trainer: dict[int, bool], orchestrator: list[int], broadcasts: list[int], resumed: int | None
) -> None:
    """On the H200 (benchmarks/log/prime-rl.md, third session) a run killed during its step 2 held trainer checkpoints
    1-2 and orchestrator checkpoints 1-3; with resume_step -1 the retry's orchestrator resumed at 3 and stopped: "No
    weight directory found for checkpoint step 3"."""
    output_dir = tmp_path / "o"
    table = {"output_dir": str(output_dir), "ckpt": {"resume_step": -1}, "weight_broadcast": {"type": "filesystem"}}
    toml = configs.write_toml(table, tmp_path / "rl.toml")
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV_RESUMING.format(python=sys.executable))
    uv.chmod(0o755)
    cluster.launch("rl", toml, tmp_path, uv=str(uv))  # the first attempt (it records the run's fingerprint) ...
    killed_run(output_dir, trainer, orchestrator, broadcasts)  # ... killed, leaving these checkpoints
    cluster.launch("rl", toml, tmp_path, uv=str(uv))  # the retry
    assert json.loads((output_dir / "resumed.json").read_text()) == {"trainer": resumed, "orchestrator": resumed}
    if resumed is not None:  # what the step resumes from is kept
        assert (output_dir / "checkpoints" / f"step_{resumed}" / "trainer" / ".metadata").exists()
        assert (output_dir / "run_default" / "checkpoints" / f"step_{resumed}" / "orchestrator" / "progress.pt").exists()


def test_a_retry_never_deletes_trained_steps_the_orchestrator_cannot_resume(tmp_path: Path) -> None:
    """No common step, but the trainer saved one in full (e.g. a ckpt.keep_last that pruned the common step): the
    retry stops and says why, and every folder stays."""
    output_dir = tmp_path / "o"
    killed_run(output_dir, {5: True}, [6], [5])
    before = sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob("*"))
    with pytest.raises(cluster.PrimeRLSetupError, match=r"trainer's checkpoints \(steps \[5\]\) and the "
                       r"orchestrator's \(steps \[6\]\) share no step"):
        cluster.align_checkpoints(output_dir, weights_on_disk=True)
    assert sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob("*")) == before


def test_with_weights_handed_over_in_memory_a_retry_needs_no_weight_files(tmp_path: Path) -> None:
    """The paper's layout (trainer and inference on their own GPUs) broadcasts weights through NCCL: no STABLE
    folders, and prime-rl's orchestrator does not look for them; the common step is still the trainer's newest."""
    output_dir = tmp_path / "o"
    killed_run(output_dir, {1: True, 2: True}, [1, 2, 3], [])
    assert cluster.align_checkpoints(output_dir, weights_on_disk=False) == 2
    assert not (output_dir / "run_default" / "checkpoints" / "step_3").exists()
    with pytest.raises(cluster.PrimeRLSetupError, match="share no step"):  # the same checkpoints through files
        cluster.align_checkpoints(output_dir, weights_on_disk=True)


"""PredictAlgorithm inside prime-rl's own orchestrator code (registry, Rollout/Trace, sample building, stamping,
zero-advantage filter, the trainer's sample check), prime-rl's own compute_loss on those samples against the local
trainer's loss, and prime-rl's TrainSource task order per seed, on the CPU, at the pinned commit with the patch
applied.

Needs the pinned sources (PREDICT_PRIME_RL_SRC, and PREDICT_VERIFIERS_SRC unless the checkout has its submodules;
see test_prime_rl_patch.py) and PREDICT_PRIME_RL_PYTHON: an interpreter with prime-rl's runtime dependencies
(prime-rl's own ``.venv/bin/python`` after ``predict prime-rl-setup``, or any with torch, msgspec, loguru, pydantic,
tokenizers). Skipped with the reason otherwise; it runs tests/prime_rl_real_flow.py in that interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from predict.config import REPO_ROOT
from predict.train.from_rollouts import group_advantages
from predict.train.prime_rl.cluster import align_checkpoints
from tests.test_prime_rl_failed_rollouts import killed_run
from tests.test_prime_rl_patch import _verifiers_source, patched_source, skip_unless_required

FLOW = Path(__file__).with_name("prime_rl_real_flow.py")
ZYGOTE = Path(__file__).with_name("prime_rl_zygote.py")


class PrimeRlPython:
    """PREDICT_PRIME_RL_PYTHON, started once for the module (tests/prime_rl_zygote.py): `run` is ``subprocess.run(
    [python, *args], capture_output=True, text=True)`` in a child forked from it, without each child's ~10 s of
    importing torch and verifiers' dependencies again. The child imports prime-rl, verifiers and predict itself."""

    def __init__(self, python: str, folder: Path) -> None:
        self.python, self.dir = python, folder
        self.log = (self.dir / "zygote.log").open("w")
        self.proc = subprocess.Popen([python, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        self.calls = 0
        ready = self.proc.stdout.readline() if self.proc.stdout else ""
        assert ready.strip() == '{"ready": true}', (ready, (self.dir / "zygote.log").read_text())

    def run(self, args: list[str], *, timeout: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        assert self.proc.stdin and self.proc.stdout
        self.calls += 1
        out, err = self.dir / f"{self.calls}.out", self.dir / f"{self.calls}.err"
        request = {"argv": args, "env": dict(os.environ if env is None else env), "cwd": os.getcwd(),
                   "stdout": str(out), "stderr": str(err), "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the prime-rl zygote died: {(self.dir / 'zygote.log').read_text()[-3000:]}"
        code = json.loads(answer)["returncode"]
        return subprocess.CompletedProcess([self.python, *args], code, out.read_text(), err.read_text())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


@pytest.fixture(scope="module")
def prime_rl_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrimeRlPython]:
    """The module's prime-rl interpreter (PREDICT_PRIME_RL_PYTHON), or a skip saying it is not set."""
    python = os.environ.get("PREDICT_PRIME_RL_PYTHON")
    if not python:
        skip_unless_required("PREDICT_PRIME_RL_PYTHON is not set: an interpreter with prime-rl's runtime dependencies")
    interpreter = PrimeRlPython(python, tmp_path_factory.mktemp("prime-rl-zygote"))
    yield interpreter
    interpreter.close()


def prime_rl_runtime(tmp_path: Path, prime_rl_python: PrimeRlPython) -> tuple[PrimeRlPython, Path, Path]:
    """(the module's interpreter with prime-rl's runtime dependencies, the patched prime-rl tree, verifiers at its
    pin), or a skip saying what is missing."""
    work = patched_source(tmp_path)
    return prime_rl_python, work, _verifiers_source(tmp_path, work)


def test_predict_algorithm_in_prime_rls_orchestrator(tmp_path: Path, prime_rl_python: PrimeRlPython) -> None:
    python, work, vf_src = prime_rl_runtime(tmp_path, prime_rl_python)
    result = python.run([str(FLOW), str(work), str(vf_src)], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["registered"]
    # rewards 1 and 0: the local trainer's advantages (r - mean) / (std + 1e-6) = +-0.5 / 0.500001 on the RL tokens
    # (prime-rl's own grpo would give +-0.5), 8 label tokens out of RL, 3 CE samples each
    a = group_advantages([1.0, 0.0])
    assert [r["advantages"] for r in out["mixed"]] == [[0.0, a[0]], [a[1], 0.0]] and a[0] == pytest.approx(
        1.0, abs=1e-5
    )
    assert all(r == {**r, "n_rl": 1, "n_ce": 3, "rl_zeroed": 8, "filtered": False} for r in out["mixed"])
    # equal rewards: the CE samples ship on their own (no advantage stream), past the zero-advantage filter
    assert all(r == {"filtered": False, "n_rl": 0, "n_ce": 3, "rl_zeroed": 0, "advantages": None} for r in out["equal"])
    # alpha 0 and equal rewards: nothing to keep, prime-rl's filter drops the rollouts as usual
    assert all(r["filtered"] and r["n_ce"] == 0 for r in out["alpha0_equal"])
    # one rl: design: the shipped samples (RL and CE) through prime-rl's compute_loss with the rendered loss give
    # the local trainer's loss and gradient; prime-rl's default loss would not
    parity = out["loss_parity"]
    assert parity["n_rl"] > 0 and parity["n_ce"] > 0
    for name in ("paper", "kl"):
        assert parity[name]["loss_diff"] < 1e-9 and parity[name]["grad_max_diff"] < 1e-9, parity
        assert parity[name]["grad_norm"] > 1e-3  # a gradient that could differ
    assert parity["prime_rl_default"]["loss_diff"] > 1e-3 or parity["prime_rl_default"]["grad_max_diff"] > 1e-3
    # the seed changes the order prime-rl's TrainSource dispatches tasks in (every epoch), deterministically
    order = out["task_order"]
    assert order["42"] == order["42 again"] and sorted(order["42"][:12]) == list(range(100, 112))
    assert order["42"][:12] != order["43"][:12] and order["42"][12:24] != order["43"][12:24]


FAILED_FLOW = Path(__file__).with_name("prime_rl_failed_flow.py")


def test_a_failed_model_call_never_scores_on_prime_rl(tmp_path: Path, prime_rl_python: PrimeRlPython) -> None:
    """Our taskset + harness under verifiers at prime-rl's pin, a 404 on the first call, then prime-rl's own TrainSink
    and per-step metrics: the rollout is an error (never a reward of 0), is dropped from its group (the survivors'
    baseline is theirs alone), ships no sample, is counted (n_failed), and a step over the threshold stops the run."""
    python, work, vf_src = prime_rl_runtime(tmp_path, prime_rl_python)
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    result = python.run(
        [str(FAILED_FLOW), str(work), str(vf_src), str(tmp_path / "run")],
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    failed = out["failed_trace"]
    assert (failed["ok"], failed["has_error"], failed["rewards"]) == (False, True, {})
    assert failed["errors"] == [["ProviderError", 404]] and failed["program_exit_code"] == 97
    # the group's baseline is the two scored rollouts': GRPO over [1.0, 0.0], not [1.0, 0.0, 0.0]
    assert out["group_rewards_scored"] == [[1.0, 0.0]] and out["shipped_from_failed"] == 0
    a = group_advantages([1.0, 0.0])
    assert out["advantages"] == [[0.0, a[0]], [a[1], 0.0]]
    assert out["error_metrics"] == {"train/agg/all/agent/error/ProviderError": 1.0}
    # each scored rollout of the group has its own sample and key (the failed one never arrives: its trace id only)
    (s0, k0), (s1, k1), failed_identity = out["identity"]
    assert (s0, s1, failed_identity) == (0, 1, [None, None]) and k0 != k1
    assert out["schema_row"] == {"n_rollouts": 3, "n_failed": 1, "reward_mean": 0.5}
    # 1 of 3 failed: over a threshold of 0.25 (the message names the step and the key), within 0.5
    assert out["check"]["0.5"] == "ok"
    assert (
        out["check"]["0.25"].startswith("step 1: 1 of 3 rollouts failed") and "max_failed_share" in out["check"]["0.25"]
    )
    # the seat as prime-rl's env server builds it from the rendered TOML: the orchestrator's sampling, not the
    # embedded default's (predict_mbpp's seat default), our harness, the local runtime
    seat, orchestrator = out["seat"], out["orchestrator_sampling"]
    assert seat["sampling"]["temperature"] == orchestrator["temperature"]
    assert seat["sampling"]["max_tokens"] == orchestrator["max_completion_tokens"] == 512
    assert (seat["harness"], seat["runtime"], seat["max_turns"]) == ("predict_local_agent", "subprocess", 2 * 8 + 1 + 2)


TRAIN_CLIENT_FLOW = Path(__file__).with_name("prime_rl_train_client_flow.py")


@pytest.mark.slow
def test_the_rendered_seat_rolls_out_through_prime_rls_train_client(
    tmp_path: Path, tiny_server: Any, prime_rl_python: PrimeRlPython
) -> None:
    """The rendered RL seat under verifiers at prime-rl's pin with the client prime-rl gives its env server (the
    TrainClient, token in/out) against a real vLLM server: the rollout completes with sampled turns and no error.
    On the H200 every rollout of the first RL run failed with HTTP 502 "TrainClient does not support streaming"."""
    python, work, vf_src = prime_rl_runtime(tmp_path, prime_rl_python)
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    result = python.run(
        [str(TRAIN_CLIENT_FLOW), str(work), str(vf_src), tiny_server.base_url, tiny_server.model_name],
        timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["errors"] == [], out
    assert (out["client"], out["stream"]) == ("TrainClientConfig", False)
    assert out["sampled_nodes"] >= 1


SAVED_TRACES = Path(__file__).with_name("prime_rl_saved_traces.py")
PARITY = REPO_ROOT / "benchmarks" / "prime_rl_parity.py"


@pytest.mark.slow
def test_the_parity_tool_rebuilds_a_saved_step_and_gets_one_loss_from_both_trainers(
    tmp_path: Path, tiny: Path, prime_rl_python: PrimeRlPython
) -> None:
    """benchmarks/prime_rl_parity.py (issue 39's parity on a real batch, for the GPU) on a step saved as prime-rl's
    orchestrator saves it: the failed rollout is dropped, the group is scored by PredictAlgorithm (RL samples and
    CE-only samples of weight alpha), and one forward of a real model gives prime-rl's compute_loss and the local
    predict_loss the same loss and the same gradient norm over the model's parameters (float32: exactly)."""
    python, work, vf_src = prime_rl_runtime(tmp_path, prime_rl_python)
    traces = tmp_path / "step_1" / "traces.jsonl"
    made = python.run([str(SAVED_TRACES), str(work), str(vf_src), str(traces)], timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    out_json = tmp_path / "parity.json"
    # prime-rl's trainer writes a step as several records (as on the H200: perf, optim, loss, time, system); the
    # last of step 1 holds neither loss nor grad norm
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "perf/peak_memory": 14.68},
        {"step": 1, "optim/lr": 1e-05, "optim/grad_norm": 4.2459},
        {"step": 1, "loss/mean": 0.3162, "entropy/all/mean": 0.022},
        {"step": 1, "time/step": 133.7},
        {"step": 2, "optim/grad_norm": 9.9, "loss/mean": 9.9},
        {"step": 1, "system/ckpt_disk_free_gib": 40.0},
    ]))
    result = python.run(
        [str(PARITY), "--prime-rl", str(work), "--verifiers", str(vf_src), "--config",
         str(REPO_ROOT / "config" / "config.yaml"), "--traces", str(traces), "--model", str(tiny), "--out",
         str(out_json), "--trainer-metrics", str(metrics), "--step", "1"],
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(out_json.read_text())
    assert (out["groups"], out["rollouts"], out["failed_dropped"]) == (1, 2, 1)
    assert out["rl_tokens"] > 0 and out["ce_tokens"] > 0 and out["ce_weights"] == [out["alpha"]] == [1.0]
    assert out["local"]["grad_norm"] > 1e-3  # a gradient that could differ
    assert out["loss_rel_diff"] < 1e-6 and out["grad_norm_rel_diff"] < 1e-6, out
    assert out["prime_rl_logged"] == {"optim/grad_norm": 4.2459, "loss/mean": 0.3162}  # step 1's, from its records


RESOLVE_AS_PRIME_RL = """
import json, sys
from unittest import mock
sys.path.insert(0, sys.argv[1] + "/src"); sys.path.insert(0, sys.argv[1] + "/packages/prime-rl-configs/src")
sys.modules["wandb"] = mock.MagicMock()  # imported by prime-rl's utils, not in the test env, never called here
from pathlib import Path
from prime_rl.utils.pathing import get_ckpt_dir, resolve_latest_ckpt_step
from prime_rl.orchestrator.utils import get_weight_dir
out = Path(sys.argv[2])
trainer = resolve_latest_ckpt_step(get_ckpt_dir(out))  # the launcher's and the trainer's resume_step -1
orchestrator = resolve_latest_ckpt_step(get_ckpt_dir(out / "run_default"))  # the orchestrator's
weights = str(get_weight_dir(out / "run_default", orchestrator)) if orchestrator is not None else None
print(json.dumps({"trainer": trainer, "orchestrator": orchestrator, "weights": weights}))
"""


def test_prime_rls_own_resume_resolution_finds_one_step_after_align_checkpoints(
    tmp_path: Path, prime_rl_python: PrimeRlPython
) -> None:
    """The H200's killed run (trainer checkpoints 1-2, orchestrator 1-3, weights 1-2), resolved by prime-rl's own
    code as its retry does with ``resume_step = -1``: before `align_checkpoints` the orchestrator resumes at 3 and
    finds no weights; after it, launcher, trainer and orchestrator all resume at 2 with step 2's weights."""
    python, work, _ = prime_rl_runtime(tmp_path, prime_rl_python)
    output_dir = tmp_path / "o"
    killed_run(output_dir, {1: True, 2: True}, [1, 2, 3], [1, 2])

    def resolve() -> subprocess.CompletedProcess[str]:
        return python.run(["-c", RESOLVE_AS_PRIME_RL, str(work), str(output_dir)], timeout=300)

    before = resolve()
    assert before.returncode != 0 and "No weight directory found for checkpoint step 3" in before.stderr
    assert align_checkpoints(output_dir, weights_on_disk=True) == 2
    after = resolve()
    assert after.returncode == 0, after.stderr[-3000:]
    resolved = json.loads(after.stdout.strip().splitlines()[-1])
    assert resolved == {"trainer": 2, "orchestrator": 2, "weights": str(output_dir / "run_default/broadcasts/step_2")}

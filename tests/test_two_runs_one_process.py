"""Two train-client batches in one process, each in its own event loop and against its own server (as two
`predict.train.learning_signal` runs are): the second batch's model calls must not fail on a lock the first loop left bound.

renderers keeps one module-level asyncio.Lock around its first ``GET /models`` per (base_url, model); the
endpoint's slow ``/v1/models`` makes the concurrent first calls of each batch wait on it, so the first batch binds
it to its loop and, on the old code, the second batch's waiters raised ``RuntimeError: ... is bound to a different
event loop`` (logged by verifiers' interception server as ``model call failed``; the program's retries hid it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from predict.env.runner import RolloutSettings, default_tokenizer_dir, run_rollouts_sync
from tests.scripted_endpoint import HttpError, ScriptedEndpoint
from tests.test_env_rollouts import FINAL, MUL_FROM_STUB, TEST, mbpp_127


def test_second_batch_in_a_new_loop_against_a_new_server_has_no_failed_model_call(
    tmp_path: Path, mbpp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / ".cache" / "verifiers")
    base = mbpp_127(mbpp_path)
    tasks = [{**base, "task_id": 9100 + i, "split": "rl"} for i in range(4)]
    tokenizer = Path(default_tokenizer_dir()) / "tokenizer.json"
    caplog.set_level(logging.WARNING, logger="verifiers")
    for batch in range(2):
        with ScriptedEndpoint([MUL_FROM_STUB, TEST, FINAL], tokenizer_json=tokenizer, models_delay_s=1.0) as endpoint:
            settings = RolloutSettings.of(base_url=endpoint.base_url, model="scripted", protocol="reactive", arm="A",
                                          client="train", concurrency=4, rollout_timeout_s=120)
            records = run_rollouts_sync(tasks, settings)
        failed = [r.getMessage() for r in caplog.records if "model call failed" in r.getMessage()]
        assert not failed, f"batch {batch}: {len(failed)} failed model calls, e.g. {failed[0]}"
        assert [(r["ok"], r["reward"], r["stop_reason"]) for r in records] == [(True, 1.0, "final")] * 4


def test_a_model_call_that_keeps_failing_gives_no_reward_and_no_training_sample(
    tmp_path: Path, mbpp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What happens to a rollout whose model call fails (as the lock's did, a 502 from the interception server):
    the program retries it; when every attempt fails the rollout is recorded failed, without a reward, and GRPO
    builds no sample from it (its group is judged on the rollouts that ran)."""
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.train.driver import load_tokenizer
    from predict.train.from_rollouts import SampleSettings, build_samples

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / ".cache" / "verifiers")
    base = mbpp_127(mbpp_path)
    broken, working = "[case:broken]", "[case:working]"
    tasks = [{**base, "task_id": 9200 + i, "text": f"{base['text']} {m}", "split": "rl", "sample": s}
             for i, m in enumerate((broken, working)) for s in range(2)]
    tokenizer_dir = Path(default_tokenizer_dir())
    scripts = {broken: [MUL_FROM_STUB, HttpError(502, "upstream down")], working: [MUL_FROM_STUB, TEST, FINAL]}
    with ScriptedEndpoint(scripts, tokenizer_json=tokenizer_dir / "tokenizer.json") as endpoint:
        settings = RolloutSettings.of(base_url=endpoint.base_url, model="scripted", protocol="reactive", arm="A",
                                      client="train", concurrency=4, rollout_timeout_s=120)
        records = run_rollouts_sync(tasks, settings)
    failed, ran = records[:2], records[2:]
    for r in failed:
        assert (r["ok"], r["reward"], r["stop_reason"]) == (False, None, "error") and "HTTP 502" in r["error"]
    assert [(r["ok"], r["reward"]) for r in ran] == [(True, 1.0)] * 2
    samples, counts, advantages = build_samples(records, load_tokenizer(tokenizer_dir), SampleSettings(predictive=False))
    assert counts.no_reward == 2 and advantages[:2] == [None, None]
    assert samples and {s.rollout_key for s in samples} == {r["rollout_key"] for r in ran}


def test_a_conversation_longer_than_the_servers_context_ends_graded_not_failed(
    tmp_path: Path, mbpp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen at the 4B shape (issue 58's rehearsal, 8 of 128 episodes an arm): vLLM refused a 4th call's prompt of
    6207 tokens, over serving.max_model_len 6144. The conversation's length is the policy's doing, so the episode
    ends with stop_reason "context", graded on the solution it has (a correct patch: reward 1) and trained on the
    calls it made; on the old code it was an infrastructure failure, left out of every figure and every step."""
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.train.driver import load_tokenizer
    from predict.train.from_rollouts import SampleSettings, build_samples

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / ".cache" / "verifiers")
    base = mbpp_127(mbpp_path)
    tasks = [{**base, "task_id": 9300, "split": "rl", "sample": s} for s in range(2)]
    tokenizer_dir = Path(default_tokenizer_dir())
    too_long = HttpError(400, "Prompt length (6207) exceeds maximum context length (6144).")
    with ScriptedEndpoint([MUL_FROM_STUB, too_long], tokenizer_json=tokenizer_dir / "tokenizer.json") as endpoint:
        settings = RolloutSettings.of(base_url=endpoint.base_url, model="scripted", protocol="reactive", arm="A",
                                      client="train", concurrency=2, rollout_timeout_s=120)
        records = run_rollouts_sync(tasks, settings)
    for r in records:
        assert (r["ok"], r["stop_reason"], r["reward"], r["n_model_calls"]) == (True, "context", 1.0, 1), r["error"]
        assert "maximum context length" in r["error"]
    samples, counts, _ = build_samples(records, load_tokenizer(tokenizer_dir), SampleSettings(predictive=False))
    assert counts.no_reward == 0 and {s.rollout_key for s in samples} == {r["rollout_key"] for r in records}

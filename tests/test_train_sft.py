"""SFT: the rendered mask against hand-checked token spans, incremental == whole-conversation ids, the stage resumes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("transformers")

from predict.env.protocol import (
    RESULT_PATCH_APPLIED,
    RESULT_PATCH_KEPT,
    RESULT_TESTS_PASSED,
    STUB,
    ProtocolConfig,
    read_result,
    task_prompt,
)
from predict.train.sft import (
    SFTConfig,
    TraceError,
    lr_at,
    plan_steps,
    render_messages,
    render_traces,
)

PATCH = "CALL apply_patch " + json.dumps({"find": STUB.strip(), "replace": "def add(a, b):\n    return a + b"})
PREDICTION = "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>"
TEST = 'CALL python_test {"project_path": "solution.py"}'
FINAL = "FINAL: add returns the sum; the tests pass."


def _trace(protocol: str = "predictive") -> list[dict]:
    pc = ProtocolConfig(protocol=protocol)
    msgs = [
        {"role": "system", "content": pc.system_prompt()},
        {"role": "user", "content": task_prompt("Write a function add(a, b).", ["assert add(1, 2) == 3"])},
        {"role": "assistant", "content": 'CALL read_file {"file_path": "solution.py"}'},
        {"role": "user", "content": read_result(STUB)},
        {"role": "assistant", "content": PATCH},
        {"role": "user", "content": RESULT_PATCH_APPLIED},
    ]
    if protocol == "predictive":
        msgs += [{"role": "assistant", "content": PREDICTION}, {"role": "user", "content": RESULT_PATCH_KEPT}]
    msgs += [
        {"role": "assistant", "content": TEST},
        {"role": "user", "content": RESULT_TESTS_PASSED},
        {"role": "assistant", "content": FINAL},
    ]
    return msgs


@pytest.fixture(scope="module")
def tok():
    from predict.train.sft import load_tokenizer

    return load_tokenizer()


def _spans(tok, ids: list[int], weights: list[float]) -> tuple[list[str], list[str]]:
    """Decoded runs of trained tokens, and of untrained ones."""
    on, off, i = [], [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and (weights[j] > 0) == (weights[i] > 0):
            j += 1
        (on if weights[i] > 0 else off).append(tok.decode(ids[i:j]))
        i = j
    return on, off


def test_mask_covers_exactly_the_assistant_turns(tok) -> None:
    msgs = _trace()
    s = render_messages(msgs, tok, task_id=7, enable_thinking=True)
    on, off = _spans(tok, s.token_ids, s.ce_weights)
    # Hand-checked: each assistant reply plus its <|im_end|>, nothing else.
    assert on == [
        'CALL read_file {"file_path": "solution.py"}<|im_end|>',
        PATCH + "<|im_end|>",
        PREDICTION + "<|im_end|>",
        TEST + "<|im_end|>",
        FINAL + "<|im_end|>",
    ]
    assert off[0].startswith("<|im_start|>system\nYou are a coding agent.")
    assert off[0].endswith("assert add(1, 2) == 3<|im_end|>\n<|im_start|>assistant\n")
    assert (
        off[1]
        == "\n<|im_start|>user\nstatus: success\n# Write your function here.\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert off[-1] == "\n<|im_start|>user\nstatus: success\ntests passed<|im_end|>\n<|im_start|>assistant\n"
    assert s.kind == "sft" and s.task_id == 7 and s.ce_weights[0] == 0
    assert s.mask == [w > 0 for w in s.ce_weights] and not any(s.rl_weights)


def test_ids_equal_an_incremental_rendering_and_avoid_the_final_think_block(tok) -> None:
    msgs = _trace()
    s = render_messages(msgs, tok, enable_thinking=True)
    # Every assistant turn follows exactly the generation prompt the model sees at inference.
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=True, return_dict=False)
        assert s.token_ids[: len(prompt)] == list(prompt)
        reply = tok.encode(m["content"], add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        assert s.token_ids[len(prompt) : len(prompt) + len(reply)] == reply
    # The whole-conversation rendering agrees up to the last turn, which it renders with an empty think block.
    whole = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False))
    head = list(tok.apply_chat_template(msgs[:-1], add_generation_prompt=True, tokenize=True, return_dict=False))
    assert whole[: len(head)] == head == s.token_ids[: len(head)]
    assert tok.decode(whole[len(head) :]).startswith("<think>\n\n</think>\n\n" + FINAL)
    assert tok.decode(s.token_ids[len(head) :]) == FINAL + "<|im_end|>"


def test_bad_traces_are_named(tok, tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="first message must be the system prompt"):
        render_messages(_trace()[1:], tok, enable_thinking=True)
    with pytest.raises(TraceError, match="last message must be the assistant"):
        render_messages(_trace()[:-1], tok, enable_thinking=True)
    bad = _trace()
    bad[2]["role"] = "tool"
    with pytest.raises(TraceError, match="message 2 has role 'tool'"):
        render_messages(bad, tok, task_id=3, enable_thinking=True)
    pq.write_table(pa.table({"task_id": [1]}), tmp_path / "t.parquet")
    with pytest.raises(TraceError, match="no 'messages' column"):
        render_traces(tmp_path / "t.parquet", tok, enable_thinking=True)


def test_plan_and_schedule() -> None:
    cfg = SFTConfig(lr=1.0, epochs=2, batch_tokens=10, warmup_steps=2, min_lr_ratio=0.1)
    steps = plan_steps([4, 4, 4, 12, 3], cfg)
    for epoch in (0, 1):
        flat = sorted(i for e, idx in steps if e == epoch for i in idx)
        assert flat == [0, 1, 2, 3, 4]
    assert all(len(idx) == 1 or sum([4, 4, 4, 12, 3][i] for i in idx) <= 10 for _, idx in steps)
    assert steps == plan_steps([4, 4, 4, 12, 3], cfg)  # seeded
    total = len(steps)
    assert lr_at(0, total, cfg) == 0.5 and lr_at(1, total, cfg) == 1.0
    assert lr_at(total - 1, total, cfg) == pytest.approx(0.1, abs=0.2) and lr_at(total, total, cfg) == 0.1


def _write_traces(path: Path, n: int) -> None:
    schema = pa.schema(
        [
            ("task_id", pa.int64()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ]
    )
    rows = [{"task_id": i, "messages": _trace("reactive" if i % 2 else "predictive")} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def test_sft_stage_resumes_from_its_saved_state(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from predict.tiny_model import cached_tiny_qwen3
    from predict.train.trainer import Trainer

    base = cached_tiny_qwen3(tmp_path / "models")
    traces = tmp_path / "B.parquet"
    _write_traces(traces, 6)
    cfg = SFTConfig(lr=3e-3, epochs=2, batch_tokens=1500, save_every=2, device="cpu", micro_batch_tokens=1500)
    paths = {
        "enable_thinking": True,
        "traces": traces,
        "base_model": base,
        "out_dir": tmp_path / "ckpt",
        "metrics_out": tmp_path / "metrics.parquet",
        "state_dir": tmp_path / "state",
    }
    total = len(plan_steps([500] * 6, cfg))
    assert total >= 4

    # A "killed" run: stop after 3 steps; the state saved at step 2 is what a rerun finds.
    import predict.train.sft as sft

    class Killed(Exception):
        pass

    real_step = Trainer.step

    def step_then_die(self, samples, **kw):
        if self.step_count == 3:
            raise Killed
        return real_step(self, samples, **kw)

    Trainer.step = step_then_die
    try:
        with pytest.raises(Killed):
            sft.run_sft(**paths, cfg=cfg, arm="B", progress=False)
    finally:
        Trainer.step = real_step
    assert Trainer.read_state_info(tmp_path / "state" / "trainer")["step"] == 2
    assert not (tmp_path / "ckpt").exists()

    summary = sft.run_sft(**paths, cfg=cfg, arm="B", progress=False)
    metrics = pq.read_table(tmp_path / "metrics.parquet").to_pylist()
    assert [r["step"] for r in metrics] == list(range(1, total + 1))
    assert summary["steps"] == total and summary["last_loss"] < summary["first_loss"]
    assert not (tmp_path / "state").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert model.config.vocab_size == 151936



def test_sft_state_from_other_traces_or_settings_is_not_resumed(tiny: Path, tmp_path: Path) -> None:
    """Issue 15: a rerun after a change (a new lr, new traces) trains from the base model, never from the old state;
    the unchanged rerun after a kill still resumes."""
    import predict.train.sft as sft
    from predict.train.trainer import Trainer

    traces = tmp_path / "B.parquet"
    _write_traces(traces, 3)
    cfg = SFTConfig(lr=3e-3, epochs=2, batch_tokens=600, save_every=2, device="cpu", micro_batch_tokens=600)
    paths = {"traces": traces, "base_model": tiny, "out_dir": tmp_path / "ckpt",
             "metrics_out": tmp_path / "metrics.parquet", "state_dir": tmp_path / "state", "arm": "B",
             "progress": False, "max_steps": 4, "enable_thinking": True}
    real_step = Trainer.step
    calls: list[int] = []

    class Killed(Exception):
        pass

    def counted(self, samples, **kw):
        calls.append(self.step_count)
        return real_step(self, samples, **kw)

    def dies_at_3(self, samples, **kw):
        if self.step_count == 3:
            raise Killed
        return real_step(self, samples, **kw)

    def killed_then_rerun(rerun_cfg: SFTConfig) -> list[int]:
        Trainer.step = dies_at_3
        with pytest.raises(Killed):
            sft.run_sft(**paths, cfg=cfg)  # leaves its state at step 2
        Trainer.step = counted
        calls.clear()
        sft.run_sft(**paths, cfg=rerun_cfg)
        return list(calls)

    try:
        assert killed_then_rerun(replace(cfg, lr=1e-3)) == [0, 1, 2, 3], "a new lr must train from step 0"
        _write_traces(traces, 3)
        Trainer.step = dies_at_3
        with pytest.raises(Killed):
            sft.run_sft(**paths, cfg=cfg)
        _write_traces(traces, 4)  # the traces stage reran: other traces
        Trainer.step = counted
        calls.clear()
        sft.run_sft(**paths, cfg=cfg)
        assert calls == [0, 1, 2, 3], "new traces must train from step 0"
        assert killed_then_rerun(cfg) == [2, 3], "unchanged inputs resume from the saved state"
    finally:
        Trainer.step = real_step


def test_sft_trains_on_the_threads_it_was_given(tiny: Path, tmp_path: Path) -> None:
    """The rule's threads: reach torch (`--threads`): with torch's default every job used every core, and the two
    arms' SFT jobs oversubscribed the embedded default's 2 cores."""
    import torch

    import predict.train.sft as sft
    from predict.train.trainer import Trainer

    traces = tmp_path / "A.parquet"
    _write_traces(traces, 2)
    cfg = SFTConfig(lr=3e-3, epochs=1, batch_tokens=600, device="cpu", micro_batch_tokens=600)
    seen: list[int] = []
    real_step, before = Trainer.step, torch.get_num_threads()

    def step(self, samples, **kw):
        seen.append(torch.get_num_threads())
        return real_step(self, samples, **kw)

    Trainer.step = step
    try:
        torch.set_num_threads(2)
        sft.run_sft(traces=traces, base_model=tiny, out_dir=tmp_path / "ckpt", metrics_out=tmp_path / "m.parquet",
                    state_dir=tmp_path / "state", cfg=cfg, arm="A", progress=False, max_steps=1, threads=1, enable_thinking=True)
    finally:
        Trainer.step = real_step
        torch.set_num_threads(before)
    assert seen == [1]

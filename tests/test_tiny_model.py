"""The tiny random Qwen3 checkpoint: deterministic, well-formed, with the real Qwen3 tokenizer and template."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from predict.serving.server import default_cache_dir
from predict.tiny_model import (
    QWEN3_VOCAB_SIZE,
    TOKENIZER_FILES,
    _f32_to_bf16_bits,
    build_tiny_qwen3,
    cached_tiny_qwen3,
    tokenizer_dir,
)


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


@pytest.fixture(scope="module")
def big_tmp() -> Iterator[Path]:
    """Scratch space for ~55 MB checkpoints: under our cache dir, since /tmp may be a small tmpfs."""
    root = default_cache_dir() / "pytest"
    root.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="tiny-model-", dir=root))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(big_tmp: Path) -> Path:
    return build_tiny_qwen3(big_tmp / "ckpt", seed=0)


def test_tokenizer_dir_has_files() -> None:
    d = tokenizer_dir()
    for name in TOKENIZER_FILES:
        assert (d / name).is_file()
    assert "chat_template" in json.loads((d / "tokenizer_config.json").read_text())


def test_deterministic(tiny: Path, big_tmp: Path) -> None:
    again = build_tiny_qwen3(big_tmp / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert (again / "config.json").read_text() == (tiny / "config.json").read_text()
    shutil.rmtree(again)
    other = build_tiny_qwen3(big_tmp / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    shutil.rmtree(other)


def test_cached_build_is_the_same_checkpoint(tiny: Path, big_tmp: Path) -> None:
    c = cached_tiny_qwen3(big_tmp / "cache", seed=0)
    assert c.name == "tiny-qwen3-s0-h64-l2"
    assert (c / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert cached_tiny_qwen3(big_tmp / "cache", seed=0) == c  # second call reuses it
    assert [p.name for p in (big_tmp / "cache").iterdir()] == [c.name]  # no temp folders left
    shutil.rmtree(big_tmp / "cache")


def test_config_and_weights_consistent(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["vocab_size"] == QWEN3_VOCAB_SIZE
    assert cfg["max_position_embeddings"] >= 4096
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["tie_word_embeddings"] is False
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    hdr = _header(tiny / "model.safetensors")
    meta = hdr.pop("__metadata__")
    assert meta == {"format": "pt"}
    assert {v["dtype"] for v in hdr.values()} == {"BF16"}
    assert hdr["model.embed_tokens.weight"]["shape"] == [QWEN3_VOCAB_SIZE, h]
    assert hdr["lm_head.weight"]["shape"] == [QWEN3_VOCAB_SIZE, h]
    assert hdr["model.layers.0.self_attn.q_proj.weight"]["shape"] == [cfg["num_attention_heads"] * hd, h]
    assert hdr["model.layers.0.self_attn.k_proj.weight"]["shape"] == [cfg["num_key_value_heads"] * hd, h]
    assert hdr["model.layers.0.self_attn.q_norm.weight"]["shape"] == [hd]
    assert hdr["model.layers.1.mlp.down_proj.weight"]["shape"] == [h, cfg["intermediate_size"]]
    assert len([k for k in hdr if k.startswith("model.layers.")]) == 11 * cfg["num_hidden_layers"]
    size = (tiny / "model.safetensors").stat().st_size
    assert size < 64 * 2**20, size
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert cfg["eos_token_id"] in gen["eos_token_id"]
    assert "temperature" not in gen  # no hidden sampling defaults for the server to apply


def test_tied_float32_variant(big_tmp: Path) -> None:
    d = build_tiny_qwen3(big_tmp / "t", tie_word_embeddings=True, dtype="float32", num_layers=1)
    hdr = _header(d / "model.safetensors")
    assert "lm_head.weight" not in hdr
    assert hdr["model.embed_tokens.weight"]["dtype"] == "F32"
    assert json.loads((d / "config.json").read_text())["tie_word_embeddings"] is True
    shutil.rmtree(d)


def test_bf16_rounding() -> None:
    x = np.array([1.0, -2.0, 0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.14159], dtype=np.float32)
    bits = _f32_to_bf16_bits(x)
    # 1+2^-8 and 1+3*2^-8 are exact ties: round half to even -> 1.0 (0x3F80) and 1+2^-6 (0x3F82).
    assert bits.tolist()[:5] == [0x3F80, 0xC000, 0x0000, 0x3F80, 0x3F82]
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    assert abs(float(back[5]) - 3.14159) < 0.01


def test_tokenizer_and_chat_template(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    assert len(tok) == 151669 <= QWEN3_VOCAB_SIZE  # 151643 BPE + 26 added tokens, embedding padded
    cfg = json.loads((tiny / "config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") == cfg["eos_token_id"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    # Qwen3-specific template features: thinking switch and tools block.
    no_think = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
    assert "<tools>" in tok.apply_chat_template(msgs, tools=tools, tokenize=False)


def test_the_stage_reads_model_tiny_typed_and_its_defaults_when_left_out(big_tmp: Path) -> None:
    """`predict build-tiny-model` takes its slice as the typed view: model.tiny's keys, or the model's defaults."""
    from predict.cli import main
    from predict.config.models import TinyModelSettings

    for name, tiny in (("set", {"hidden_size": 32, "num_layers": 1}), ("left-out", None)):
        path = big_tmp / f"slice-{name}.json"
        path.write_text(json.dumps({"model": {"tiny": tiny}} if tiny else {}))
        out = big_tmp / f"stage-{name}"
        assert main(["build-tiny-model", "--config-slice", str(path), "--out-dir", str(out), "--dtype", "float32"]) == 0
        config = json.loads((out / "config.json").read_text())
        want = TinyModelSettings(**(tiny or {}))
        assert (config["hidden_size"], config["num_hidden_layers"]) == (want.hidden_size, want.num_layers)
        shutil.rmtree(out)


def test_a_released_shape_can_be_built_tied_as_released(big_tmp: Path) -> None:
    """model.tiny.tie_word_embeddings: the Qwen3-4B shape as released has 4.02B parameters (tied); untied, 4.41B.
    The stage builds what the key says (tied: no lm_head tensor), and leaves today's untied model when it is left
    out."""
    from predict.cli import main
    from predict.config.models import TinyModelSettings
    from predict.tiny_model import parameter_count

    assert parameter_count(TinyModelSettings(shape="qwen3-4b", tie_word_embeddings=True)) == 4_022_468_096
    assert parameter_count(TinyModelSettings(shape="qwen3-4b")) == 4_411_424_256
    for tie in (True, False, None):
        tiny = {"hidden_size": 32, "num_layers": 1, **({"tie_word_embeddings": tie} if tie is not None else {})}
        path = big_tmp / f"slice-tie-{tie}.json"
        path.write_text(json.dumps({"model": {"tiny": tiny}}))
        out = big_tmp / f"stage-tie-{tie}"
        assert main(["build-tiny-model", "--config-slice", str(path), "--out-dir", str(out), "--dtype", "float32"]) == 0
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is bool(tie)
        names = set(_header(out / "model.safetensors")) - {"__metadata__"}
        assert ("lm_head.weight" in names) is not bool(tie)
        n = sum(int(np.prod(v["shape"])) for k, v in _header(out / "model.safetensors").items() if k != "__metadata__")
        assert n == parameter_count(TinyModelSettings(**tiny))
        shutil.rmtree(out)

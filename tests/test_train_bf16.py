"""bf16 training keeps its updates: at a learning rate whose AdamW updates fall below half an ulp of bf16, our trainer
in bfloat16 tracks a float32 run of the same steps, and a resumed bf16 run continues bit for bit.

A small Qwen3 (vocab 512, hidden 64, 2 layers; weights ~0.02, whose bf16 half-ulp is ~6e-5) trains 30 steps at
lr 1e-5 on one fixed batch, once in float32 and once in bfloat16, from the same (bf16-representable) weights.
Tolerances, on the weight update d = w_30 - w_0 of every parameter against the float32 run's d_ref:
* realised = <d, d_ref> / |d_ref|^2 within 0.85 .. 1.15 (plain AdamW on bf16 weights keeps ~0.2 of it);
* drift = |d - d_ref| / |d_ref| below 0.3 (plain AdamW: ~0.95);
* the bf16 run's loss falls by at least 0.8 times what the float32 run's falls.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from predict.tiny_model import TOKENIZER_FILES, tokenizer_dir  # noqa: E402
from predict.train.optim import KahanAdamW, effective_weight  # noqa: E402
from predict.train.sample import TrainSample  # noqa: E402
from predict.train.trainer import Trainer  # noqa: E402

LR = 1e-5
STEPS = 30
VOCAB = 512


def _small_model():
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # start both runs from the same bf16-representable weights
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def _batch() -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for n in (40, 33, 57):
        ids = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        w = [0.0] + [1.0] * (n - 1)
        z = [0.0] * n
        out.append(TrainSample(ids, [x > 0 for x in w], z, z, z, w, kind="sft"))
    return out


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A folder with the tokenizer files only (the trainer copies them into checkpoints)."""
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir() / name, tmp_path / name)
    return tmp_path


def _train(model_dir: Path, dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[float]]:
    trainer = Trainer(model_dir, model=_small_model(), lr=LR, device="cpu", dtype=dtype, seed=0, weight_decay=0.0,
                      grad_clip=1.0, micro_batch_tokens=8192)
    w0 = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters()}
    losses = [trainer.step(_batch())["loss"] for _ in range(STEPS)]
    w = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters()}
    return w0, w, losses


def test_bf16_training_tracks_a_float32_run_below_bf16_resolution(model_dir: Path) -> None:
    w0, w_ref, loss_ref = _train(model_dir, "float32")
    w0_bf16, w_bf16, loss_bf16 = _train(model_dir, "bfloat16")
    assert all(torch.equal(w0[n], w0_bf16[n]) for n in w0), "both runs must start from the same weights"
    d_ref = torch.cat([(w_ref[n] - w0[n]).flatten() for n in w0])
    d = torch.cat([(w_bf16[n] - w0[n]).flatten() for n in w0])
    # The premise: one AdamW step moves a weight by about lr, below half an ulp of most weights in bf16.
    half_ulp = torch.cat([p.abs().flatten() for p in w0.values()]) * 2.0**-9
    assert float((half_ulp > LR).float().mean()) > 0.5
    realised = float(d @ d_ref / (d_ref @ d_ref))
    drift = float((d - d_ref).norm() / d_ref.norm())
    assert 0.85 <= realised <= 1.15, f"bf16 run realised {realised:.3f} of the float32 update (drift {drift:.3f})"
    assert drift < 0.3, f"bf16 weights drift {drift:.3f} from the float32 run"
    fall_ref, fall = loss_ref[0] - loss_ref[-1], loss_bf16[0] - loss_bf16[-1]
    assert fall_ref > 0
    assert fall >= 0.8 * fall_ref, f"bf16 loss fell {fall:.4f}, float32 {fall_ref:.4f}"


def test_kahan_adamw_equals_torch_adamw_in_float32() -> None:
    """On float32 weights the same arithmetic as torch's AdamW (the compensation has nothing to keep)."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(257))
    b = torch.nn.Parameter(a.detach().clone())
    opt_a = torch.optim.AdamW([a], lr=1e-2, weight_decay=0.1)
    opt_b = KahanAdamW([b], lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        g = torch.randn(257)
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bf16_save_state_and_resume_continue_bit_exactly(model_dir: Path, tmp_path: Path) -> None:
    """float32 moments and the compensation come back as saved (torch's loader would cast them to bf16)."""
    samples = _batch()
    a = Trainer(model_dir, model=_small_model(), lr=LR, device="cpu", dtype="bfloat16", seed=3, weight_decay=0.0,
                grad_clip=1.0, micro_batch_tokens=8192)
    a.step(samples)
    a.save_state(tmp_path / "state")
    a.step(samples)
    b = Trainer.resume(tmp_path / "state", device="cpu")
    assert isinstance(b.optimizer, KahanAdamW)
    b.step(samples)
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
        assert torch.equal(effective_weight(a.optimizer, pa), effective_weight(b.optimizer, pb)), name
        for key, value in a.optimizer.state[pa].items():
            assert torch.equal(value, b.optimizer.state[pb][key]), (name, key)


def test_a_state_saved_by_torch_adamw_resumes_under_kahan_adamw() -> None:
    """A trainer state written before KahanAdamW (torch's AdamW, bf16 moments) loads and steps, its moments in the
    dtype KahanAdamW keeps (bf16 by default, float32 with moments="float32")."""
    p = torch.nn.Parameter(torch.randn(64).bfloat16())
    old = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.randn(64).bfloat16()
    old.step()
    for moments, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        new = KahanAdamW([p], lr=1e-3, moments=moments)
        new.load_state_dict(copy.deepcopy(old.state_dict()))  # torch's loader shares the step tensor
        p.grad = torch.randn(64).bfloat16()
        new.step()
        assert new.state[p]["exp_avg"].dtype == new.state[p]["exp_avg_sq"].dtype == dtype
        assert new.state[p]["compensation"].dtype == torch.bfloat16 and int(new.state[p]["step"]) == 2


def test_bf16_weights_keep_six_bytes_of_optimizer_state_a_weight() -> None:
    """The compensation and both moments in bf16: 6 bytes a weight beside the weight's 2 (float32 moments took 10),
    which is what lets SFT of the 4B shape fit within 1.1x the plain bf16 loop's memory (docs/training.md)."""
    p = torch.nn.Parameter(torch.randn(1000).bfloat16())
    opt = KahanAdamW([p], lr=1e-3)
    p.grad = torch.randn(1000).bfloat16()
    opt.step()
    state = {k: v for k, v in opt.state[p].items() if k != "step"}
    assert sorted(state) == ["compensation", "exp_avg", "exp_avg_sq"]
    assert sum(v.nbytes for v in state.values()) == 6 * p.numel()
    wide = KahanAdamW([p], lr=1e-3, moments="float32")
    wide.step()
    assert sum(v.nbytes for k, v in wide.state[p].items() if k != "step") == 10 * p.numel()


def test_stochastically_rounded_moments_follow_their_float32_course() -> None:
    """A second moment with beta2 = 0.999 moves 0.1 % a step, below half of bf16's resolution: rounded to nearest it
    sticks where it was when the gradients shrink; rounded stochastically it follows float32 moments' course."""
    n, steps = 4096, 350
    g = torch.Generator().manual_seed(0)
    init = torch.randn(n, generator=g).bfloat16()
    p16, p32 = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    ours, wide = KahanAdamW([p16], lr=1e-4), KahanAdamW([p32], lr=1e-4, moments="float32")
    nearest = torch.zeros(n, dtype=torch.bfloat16)  # the same EMA, bf16 rounded to nearest: the premise
    for t in range(steps):
        grad = (torch.randn(n, generator=g) * (1.0 if t < 50 else 0.1)).bfloat16()  # shrinking gradients
        p16.grad, p32.grad = grad.clone(), grad.clone()
        ours.step()
        wide.step()
        nearest = (nearest.float() * 0.999 + grad.float() ** 2 * 0.001).bfloat16()
    v16, v32 = ours.state[p16]["exp_avg_sq"].float(), wide.state[p32]["exp_avg_sq"]
    assert float(nearest.float().mean() / v32.mean()) > 1.15  # stuck near its step-50 value
    assert 0.98 < float(v16.mean() / v32.mean()) < 1.02
    assert float(((v16 - v32) / v32).pow(2).mean().sqrt()) < 0.06
    m16, m32 = ours.state[p16]["exp_avg"].float(), wide.state[p32]["exp_avg"]
    assert float((m16 - m32).norm() / m32.norm()) < 0.02
    d16, d32 = effective_weight(ours, p16) - init.float(), effective_weight(wide, p32) - init.float()
    assert float((d16 - d32).norm() / d32.norm()) < 0.03, "the weights' updates follow float32 moments' updates"


def test_the_gpu_memory_arithmetic_counts_what_the_optimizer_holds() -> None:
    """`predict.serving.gpu_memory`'s trainer estimate (bytes a parameter) is the weight, its gradient and the
    optimizer's state as KahanAdamW keeps them."""
    from predict.serving.gpu_memory import TRAINER_BYTES_PER_PARAM

    p = torch.nn.Parameter(torch.randn(100).bfloat16())
    p.grad = torch.randn(100).bfloat16()
    opt = KahanAdamW([p], lr=1e-3)
    opt.step()
    state = sum(v.nbytes for k, v in opt.state[p].items() if k != "step")
    assert (p.nbytes + p.grad.nbytes + state) / p.numel() == TRAINER_BYTES_PER_PARAM


def _uint32_hash(index: int, seed: int) -> int:
    """The stochastic rounding's hash as written for unsigned 32-bit integers (Python ints, no wrapping tricks)."""
    x = (index & 0xFFFFFFFF) ^ seed
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    return ((x >> 16) ^ x) & 0xFFFF


@pytest.mark.parametrize("start", [0, 2**31 - 3, 2**32 - 2, 3 * 2**31 + 5])
def test_the_int32_rounding_hash_is_the_unsigned_32_bit_hash(start: int) -> None:
    """The kernel hashes in int32 (a GPU multiplies int64 in several instructions) with wrapping products and masked
    shifts: its bits must be those of the unsigned hash, also where a 4B model's weight indices pass 2^31 and 2^32."""
    from predict.train.optim import _random_bits, first_index_tensor, rounding_seed

    seed = rounding_seed(7, 1)
    like = torch.empty(6)
    got = _random_bits(like, first_index_tensor(start), torch.tensor(float(seed))).tolist()
    assert got == [_uint32_hash(start + i, seed) for i in range(6)]

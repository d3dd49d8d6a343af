"""The compact trainer: chunked logprobs and loss equal the plain computation, a step learns, save/resume is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from predict.tiny_model import cached_tiny_qwen3  # noqa: E402
from predict.train.loss import LossConfig, predict_loss  # noqa: E402
from predict.train.sample import TrainSample  # noqa: E402
from predict.train.trainer import ChunkedLMLoss, Trainer, pack_micro_batches  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_tiny_qwen3(tmp_path_factory.mktemp("models"))


def _sft_sample(ids: list[int], start: int) -> TrainSample:
    n = len(ids)
    w = [0.0] * start + [1.0] * (n - start)
    return TrainSample(
        token_ids=ids,
        mask=[x > 0 for x in w],
        logprobs=[0.0] * n,
        advantages=[0.0] * n,
        rl_weights=[0.0] * n,
        ce_weights=w,
        kind="sft",
    )


def _rl_sample(ids: list[int], start: int, adv: float, old: list[float]) -> TrainSample:
    n = len(ids)
    w = [0.0] * start + [1.0] * (n - start)
    return TrainSample(
        token_ids=ids,
        mask=[x > 0 for x in w],
        logprobs=[o if x else 0.0 for o, x in zip(old, w, strict=True)],
        advantages=[adv * x for x in w],
        rl_weights=w,
        ce_weights=[0.0] * n,
        kind="rl",
    )


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 151000, (23,), generator=g).tolist()
    b = torch.randint(0, 151000, (17,), generator=g).tolist()
    c = torch.randint(0, 151000, (30,), generator=g).tolist()
    return [_sft_sample(a, 5), _sft_sample(b, 3), _sft_sample(c, 10)]


def _reference_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    return [0.0, *lp.tolist()]


def test_pack_micro_batches_keeps_order_and_budget() -> None:
    assert pack_micro_batches([3, 4, 2, 9, 1], 8) == [[0, 1], [2], [3], [4]]
    assert pack_micro_batches([], 8) == []


def test_packed_chunked_logprobs_equal_per_sequence_full_logits(tiny: Path) -> None:
    trainer = Trainer(tiny, lr=1e-3, device="cpu", micro_batch_tokens=100, logit_chunk_tokens=7, weight_decay=0.0,
                      grad_clip=1.0, dtype="auto", seed=0)
    samples = _samples()
    got = trainer.token_logprobs(samples)  # all three in one packed row, logits in chunks of 7
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa")
    for s, lp in zip(samples, got, strict=True):
        ref = _reference_logprobs(ref_model, s.token_ids)
        assert lp[0] == 0.0
        assert torch.allclose(torch.tensor(lp), torch.tensor(ref), atol=2e-5), "packing or chunking changed logprobs"
    weighted = trainer.token_logprobs(samples, weighted_only=True)
    assert weighted[0][:5] == [0.0] * 5 and weighted[0][5:] == pytest.approx(got[0][5:], abs=1e-6)


@pytest.mark.parametrize("tile_elements", [None, 8 * 7])
def test_chunked_loss_gradient_equals_full_loss_gradient(tile_elements: int | None, monkeypatch) -> None:
    """Chunks of 8 tokens; on the CPU each chunk's logits in vocabulary tiles: one tile, or tiles of 7 rows (the
    last one of 1) so the tile maxima, sums and the targets' one-hot part cross tile boundaries."""
    if tile_elements is not None:
        monkeypatch.setattr("predict.train.trainer._TILE_ELEMENTS", tile_elements)
    torch.manual_seed(0)
    n, h, v = 37, 8, 50
    hidden = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    with torch.no_grad():
        lp0 = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1)
    streams = {
        "logprobs": lp0 + torch.randn(n, dtype=torch.float64) * 0.3,  # ratios on both sides of the clip range
        "advantages": torch.randn(n, dtype=torch.float64),
        "rl_weights": (torch.rand(n) > 0.4).double(),
        "ce_weights": (torch.rand(n) > 0.6).double() * 0.5,
    }
    cfg = LossConfig(kl_coef=0.1)
    n_rl, n_ce = 40, 30  # the whole step's counts, larger than this micro-batch's
    metrics: dict[str, float] = {}
    loss = ChunkedLMLoss.apply(hidden, weight, targets, streams, cfg, n_rl, n_ce, 8, metrics)
    gh, gw = torch.autograd.grad(loss * 1.7, (hidden, weight))

    lp = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1)
    ref, ref_m = predict_loss(lp[None], {k: t[None] for k, t in streams.items()}, cfg, n_rl=n_rl, n_ce=n_ce)
    rh, rw = torch.autograd.grad(ref * 1.7, (hidden, weight))
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-9)
    assert metrics["rl_loss"] == pytest.approx(ref_m["rl_loss"]) and metrics["ce_loss"] == pytest.approx(
        ref_m["ce_loss"]
    )
    assert torch.allclose(gh, rh, atol=1e-10) and torch.allclose(gw, rw, atol=1e-10)


def test_step_lowers_the_loss_and_counts_tokens_over_the_step(tiny: Path) -> None:
    trainer = Trainer(tiny, lr=3e-3, device="cpu", micro_batch_tokens=30, weight_decay=0.0, grad_clip=1.0,
                      dtype="auto", seed=0)  # 3 micro-batches
    samples = _samples()
    first = trainer.step(samples)
    assert first["n_micro_batches"] == 3
    assert first["n_ce_tokens"] == sum(s.n_ce_tokens for s in samples) == 18 + 14 + 20
    for _ in range(5):
        last = trainer.step(samples)
    assert last["ce_loss"] < first["ce_loss"] - 0.5
    assert trainer.step_count == 6


def test_rl_step_runs_and_reports_clipping(tiny: Path) -> None:
    trainer = Trainer(tiny, lr=1e-2, device="cpu", weight_decay=0.0, grad_clip=1.0, dtype="auto",
                      micro_batch_tokens=8192, seed=0)
    base = _samples()[0]
    old = trainer.token_logprobs([base])[0]
    samples = [_rl_sample(base.token_ids, 5, 1.0, old), _rl_sample(base.token_ids, 5, -1.0, old)]
    m = trainer.step(samples)
    assert m["ce_loss"] == 0.0 and m["n_rl_tokens"] == 36 and m["clip_frac"] == 0.0
    m2 = trainer.step(samples)
    assert 0.0 <= m2["clip_frac"] <= 1.0


def test_save_state_and_resume_continue_bit_exactly(tiny: Path, tmp_path: Path) -> None:
    samples = _samples()
    a = Trainer(tiny, lr=3e-3, device="cpu", seed=3, weight_decay=0.0, grad_clip=1.0, dtype="auto",
                micro_batch_tokens=8192)
    a.step(samples)
    a.save_state(tmp_path / "state")
    a.step(samples)
    b = Trainer.resume(tmp_path / "state", device="cpu")
    assert b.step_count == 1
    b.step(samples)
    assert b.step_count == 2
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_checkpoint_loads_with_transformers_and_tokenizer(tiny: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = Trainer(tiny, lr=3e-3, device="cpu", weight_decay=0.0, grad_clip=1.0, dtype="auto",
                      micro_batch_tokens=8192, seed=0)
    trainer.step(_samples())
    out = trainer.save_checkpoint(tmp_path / "ckpt")
    assert not list(tmp_path.glob(".ckpt*")), "temp folder left behind"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.dtype == torch.bfloat16  # the base checkpoint's dtype
    w = trainer.model.get_output_embeddings().weight.detach().to(torch.bfloat16)
    assert torch.equal(model.get_output_embeddings().weight, w)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and tok.convert_tokens_to_ids("<|im_end|>") == 151645
    trainer.save_checkpoint(out)  # overwriting an existing checkpoint is atomic too
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_fused_and_inplace_logit_gradients_agree() -> None:
    from predict.train.trainer import _grad_logits, _grad_logits_inplace, _lse_target

    torch.manual_seed(0)
    logits = torch.randn(6, 40)
    targets = torch.randint(0, 40, (6,))
    g = torch.randn(6)
    lse, lp = _lse_target(logits, targets)
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1), atol=1e-6)
    assert torch.allclose(_grad_logits(logits, lse, g, targets), _grad_logits_inplace(logits.clone(), lse, g, targets))


@pytest.mark.parametrize("lengths", [[5, 5, 5], [3, 7, 5]])
def test_packed_attention_keeps_documents_apart(lengths: list[int]) -> None:
    """Equal-length documents take one batched SDPA call, uneven ones a call per document: both equal attention
    computed on each document alone (GQA: 4 query heads over 2 key/value heads)."""
    from predict.train.trainer import packed_attention

    torch.manual_seed(0)
    t = sum(lengths)
    q, k, v = torch.randn(1, 4, t, 8), torch.randn(1, 2, t, 8), torch.randn(1, 2, t, 8)
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    out, _ = packed_attention(torch.nn.Module(), q, k, v, None, scaling=None, cu_seqlens=cu, max_seqlen=max(lengths))
    assert out.shape == (1, t, 4, 8)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True, enable_gqa=True
        )
        torch.testing.assert_close(out[0, s:e], alone[0].transpose(0, 1))


def test_activation_checkpointing_recomputes_each_layer_and_gives_the_same_update(tiny: Path) -> None:
    """rl.activation_checkpointing (what fits the 4B RL step in 80 GB): every decoder layer runs its forward again in
    the backward (counted), and the weights after two steps (an SFT and an RL one) are the ones without it."""
    base = _samples()

    def run(checkpointing: bool) -> tuple[Trainer, int]:
        trainer = Trainer(tiny, lr=3e-3, device="cpu", seed=0, weight_decay=0.0, grad_clip=1.0, dtype="auto",
                          micro_batch_tokens=8192)
        if checkpointing:
            trainer.checkpoint_activations()
        calls = []
        trainer.model.model.layers[0].mlp.act_fn.register_forward_hook(lambda *_: calls.append(1))
        trainer.step(base)
        old = trainer.token_logprobs([base[0]])[0]
        calls.clear()
        trainer.step([_rl_sample(base[0].token_ids, 5, 1.0, old), _rl_sample(base[0].token_ids, 5, -1.0, old)])
        return trainer, len(calls)

    plain, plain_calls = run(False)
    checkpointed, checkpointed_calls = run(True)
    assert (plain_calls, checkpointed_calls) == (1, 2)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), checkpointed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_rl_driver_checkpoints_activations_as_the_config_says_on_start_and_resume(
    tiny: Path, tmp_path: Path, checkpointing: bool
) -> None:
    """The RL driver's trainer follows rl.activation_checkpointing, fresh and resumed (an untracked key: a resumed run
    takes the config's value, not the saved state's)."""
    from predict.config import load_config
    from predict.train.driver import RLJob, TrainingRun

    config = load_config(Path(__file__).resolve().parents[1] / "config" / "local.yaml")
    config["rl"] = {**config["rl"], "activation_checkpointing": checkpointing}
    job = RLJob(run="B", seed=42, init=tiny, tasks=tmp_path / "rl.parquet", out_dir=tmp_path / "B" / "seed42")
    run = TrainingRun(job, config, "rl")
    trainer, done, _ = run.open_trainer()
    assert done == 0 and all(layer.gradient_checkpointing == checkpointing for layer in trainer.model.model.layers)
    trainer.save_state(run.state_dir)
    run.resumable = True
    resumed, _, _ = run.open_trainer()
    assert all(layer.gradient_checkpointing == checkpointing for layer in resumed.model.model.layers)


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_the_step_reads_the_gradient_norm_after_queuing_the_optimizer(tiny: Path, grad_clip: float,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the norm waits for the GPU; before the optimizer's step that left the GPU idle while KahanAdamW made
    its ~400 per-parameter launches. The step must queue the optimizer first and report the same norm."""
    trainer = Trainer(tiny, lr=1e-3, device="cpu", micro_batch_tokens=8192, weight_decay=0.0, grad_clip=grad_clip,
                      dtype="float32", seed=0)
    events: list[str] = []
    wrapped = "clip_grad_norm_" if grad_clip else "get_total_norm"
    real_norm, real_step = getattr(torch.nn.utils, wrapped), trainer.optimizer.step

    class Norm(torch.Tensor):
        def __float__(self) -> float:
            events.append("norm read")
            return super().__float__()

    def norm(*args, **kwargs):
        value = real_norm(*args, **kwargs)
        expected.append(float(value))
        return value.as_subclass(Norm)

    def step(*args, **kwargs):
        events.append("optimizer step")
        return real_step(*args, **kwargs)

    expected: list[float] = []
    monkeypatch.setattr(torch.nn.utils, wrapped, norm)
    monkeypatch.setattr(trainer.optimizer, "step", step)
    out = trainer.step(_samples())
    assert events == ["optimizer step", "norm read"]
    assert out["grad_norm"] == expected[0] > 0


def _fresh(tiny: Path, dtype: str = "auto") -> Trainer:
    return Trainer(tiny, lr=3e-3, device="cpu", seed=0, weight_decay=0.0, grad_clip=1.0, dtype=dtype,
                   micro_batch_tokens=8192)


def _two_steps(trainer: Trainer, between: Any = None) -> Trainer:
    """An SFT step, then an RL step (with `between(trainer)` run between them)."""
    base = _samples()
    trainer.step(base)
    if between is not None:
        between(trainer)
    old = trainer.token_logprobs([base[0]])[0]
    trainer.step([_rl_sample(base[0].token_ids, 5, 1.0, old), _rl_sample(base[0].token_ids, 5, -1.0, old)])
    return trainer


def _same_weights(a: Trainer, b: Trainer) -> None:
    for (name, x), (_, y) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(x, y), name


def test_selective_checkpointing_recomputes_only_the_first_layers_and_gives_the_same_update(tiny: Path) -> None:
    """rl.activation_checkpointing_layers: the first N decoder layers run their forward again in the backward, the
    others keep their activations; the weights are those of a step without checkpointing."""
    trainer = _fresh(tiny)
    trainer.checkpoint_activations(layers=1)
    assert [layer.gradient_checkpointing for layer in trainer.model.model.layers] == [True, False]
    calls = {0: [], 1: []}
    for i in calls:
        trainer.model.model.layers[i].mlp.act_fn.register_forward_hook(lambda *_, i=i: calls[i].append(1))
    trainer.step(_samples())
    assert (len(calls[0]), len(calls[1])) == (2, 1)
    _same_weights(_two_steps(_fresh(tiny)), _two_steps(_checkpointed(tiny, 1)))


def _checkpointed(tiny: Path, layers: int) -> Trainer:
    trainer = _fresh(tiny)
    trainer.checkpoint_activations(layers=layers)
    return trainer


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_offloaded_optimizer_state_moves_off_and_back_and_the_update_is_the_same(tiny: Path, dtype: str) -> None:
    """rl.offload_optimizer: after a step the moments (and in bf16 the Kahan buffers) move into the trainer's host
    buffers, all of them (6 bytes a parameter in bf16, 8 in float32); the next step brings them back, and the
    weights after it are bit for bit those of a trainer that kept its state in place."""
    n_params = sum(p.numel() for p in _fresh(tiny).model.parameters())
    moved = []

    def offload(trainer: Trainer) -> None:
        before = [t for st in trainer.optimizer.state.values() for t in st.values() if t.dim() > 0]  # held: ids stay
        moved.append(trainer.offload_optimizer_state())
        after = [t for st in trainer.optimizer.state.values() for t in st.values() if t.dim() > 0]
        assert trainer.optimizer_offloaded and len(after) == len(before)
        assert not {id(t) for t in before} & {id(t) for t in after}  # every state tensor was replaced by its buffer
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        assert trainer.offload_optimizer_state() == 0  # a second offload has nothing left to move

    offloaded = _two_steps(_fresh(tiny, dtype), offload)
    assert moved == [n_params * (6 if dtype == "bfloat16" else 8)]
    assert not offloaded.optimizer_offloaded  # the second step brought it back
    _same_weights(_two_steps(_fresh(tiny, dtype)), offloaded)


def test_an_offloaded_optimizer_state_comes_back_only_after_the_backward(tiny: Path) -> None:
    """The state returns once the activations are gone: every forward and backward of the next step runs with the
    state still off the device (the update's peak is weights + gradients + activations, or + state, never both),
    and the step ends with it back."""
    trainer = _fresh(tiny, "bfloat16")
    trainer.step(_samples())
    trainer.offload_optimizer_state()
    seen = []
    layer = trainer.model.model.layers[0]
    layer.register_forward_hook(lambda *_: seen.append(("forward", trainer.optimizer_offloaded)))
    layer.register_full_backward_hook(lambda *_: seen.append(("backward", trainer.optimizer_offloaded)))
    trainer.step(_samples())
    assert {kind for kind, _ in seen} == {"forward", "backward"}
    assert all(offloaded for _, offloaded in seen), seen
    assert not trainer.optimizer_offloaded


def test_a_state_saved_while_the_optimizer_is_offloaded_resumes_the_same_run(tiny: Path, tmp_path: Path) -> None:
    """A save between steps (the RL driver saves after the update, when the state is off the device) holds the
    optimizer's state, and a resume from it steps as the trainer that never stopped."""
    kept = _two_steps(_fresh(tiny, "bfloat16"))

    def offload_and_save(trainer: Trainer) -> None:
        trainer.offload_optimizer_state()
        trainer.save_state(tmp_path / "state")

    _two_steps(_fresh(tiny, "bfloat16"), offload_and_save)
    resumed = Trainer.resume(tmp_path / "state", device="cpu")
    base = _samples()
    old = resumed.token_logprobs([base[0]])[0]
    resumed.step([_rl_sample(base[0].token_ids, 5, 1.0, old), _rl_sample(base[0].token_ids, 5, -1.0, old)])
    _same_weights(kept, resumed)


def test_the_rl_step_offloads_the_optimizer_inside_the_update_window_and_times_it(tiny: Path) -> None:
    """With rl.offload_optimizer the RL step's update leaves the optimizer's state off the device before the
    server wakes (the window closes), and its metrics row has the offload's seconds."""
    import contextlib
    from types import SimpleNamespace

    from predict.train.rl import update_and_sync

    seen = []

    class Run:
        rl = SimpleNamespace(offload_optimizer=True)

        @contextlib.contextmanager
        def update_window(self, server):
            yield SimpleNamespace(slept=False, sync=lambda fn: None)
            seen.append(trainer.optimizer_offloaded)  # as the window closes

    trainer = _fresh(tiny, "bfloat16")
    trainer.offload_optimizer_state()  # nothing yet: the state is made by the first step
    row = update_and_sync(Run(), None, trainer, _samples(), 1, grad_terms_every=0, push=None)
    assert seen == [True] and row["offload_s"] >= 0 and row["updated"]
    Run.rl = SimpleNamespace(offload_optimizer=False)
    kept = _fresh(tiny, "bfloat16")
    row = update_and_sync(Run(), None, kept, _samples(), 1, grad_terms_every=0, push=None)
    assert "offload_s" not in row and not kept.optimizer_offloaded
    _same_weights(kept, trainer)


@pytest.mark.parametrize("offload", [False, True])
def test_the_rl_driver_offloads_a_resumed_optimizer_before_the_first_rollout(tiny: Path, tmp_path: Path,
                                                                             offload: bool) -> None:
    from predict.config import load_config
    from predict.train.driver import RLJob, TrainingRun

    config = load_config(Path(__file__).resolve().parents[1] / "config" / "local.yaml")
    config["rl"] = {**config["rl"], "offload_optimizer": offload, "dtype": "bfloat16"}
    job = RLJob(run="B", seed=42, init=tiny, tasks=tmp_path / "rl.parquet", out_dir=tmp_path / "B" / "seed42")
    run = TrainingRun(job, config, "rl")
    trainer, _, _ = run.open_trainer()
    trainer.step(_samples())
    trainer.save_state(run.state_dir)
    run.resumable = True
    resumed, _, _ = run.open_trainer()
    assert resumed.optimizer_offloaded == offload


def test_checkpointed_layers_without_checkpointing_is_refused_naming_both_keys() -> None:
    from predict.config.models import RLSettings

    base = {"steps": 2, "group_size": 2, "tasks_per_step": 1, "checkpoint_every": 1, "lr": 1e-5}
    assert RLSettings(**base, activation_checkpointing=True, activation_checkpointing_layers=12)
    with pytest.raises(ValueError, match="rl.activation_checkpointing_layers is set but rl.activation_checkpointing"):
        RLSettings(**base, activation_checkpointing_layers=12)

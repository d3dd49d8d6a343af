"""The MLP whose down projection's input is made again in the backward (`predict.train.mlp`): same loss and
gradients as transformers' Qwen3 MLP, and fewer activations kept for the backward."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from predict.train.mlp import recompute_mlp_inputs  # noqa: E402


def _model():
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def _saved_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward of ``module(x)``: activations, not the input
    or the weights."""
    kept: dict[int, int] = {}
    not_activations = {x.data_ptr()} | {p.data_ptr() for p in module.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in not_activations:
            kept[t.data_ptr()] = t.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(kept.values())


def test_same_loss_and_gradients_as_the_modules() -> None:
    ref = _model()
    ours = copy.deepcopy(ref)
    assert recompute_mlp_inputs(ours) == 3  # one MLP a layer
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (ref, ours):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss)
    assert torch.equal(losses[0], losses[1])  # the forward is the same products in the same order
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_mlp_keeps_gate_and_up_only() -> None:
    """transformers' MLP keeps gate, silu(gate), up and their product (4 tensors of the MLP's width); this one keeps
    gate and up."""
    model = _model()
    mlp = model.model.layers[0].mlp
    x = torch.randn(5, 32, requires_grad=True)
    width_bytes = 5 * 96 * 4  # one [tokens, intermediate] float32 tensor
    assert _saved_bytes(mlp, x) == 4 * width_bytes
    recompute_mlp_inputs(model)
    assert _saved_bytes(mlp, x) == 2 * width_bytes


def test_only_swiglu_mlps_change() -> None:
    """Modules without the three bias-free projections, or with another activation, keep their forward."""
    model = _model()
    mlp = model.model.layers[0].mlp
    mlp.config = copy.copy(mlp.config)
    mlp.config.hidden_act = "gelu"
    assert recompute_mlp_inputs(model) == 2
    assert "forward" not in vars(mlp)

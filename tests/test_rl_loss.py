"""The one loss (`predict.train.loss`) on small hand-computed cases, and where Arm B's label gradient comes from."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from predict.train.loss import LossConfig, predict_loss  # noqa: E402


def batch(**streams: list[list[float]]) -> dict[str, Any]:
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in streams.items()}
    shape = next(iter(t.values())).shape
    for k in ("logprobs", "advantages", "rl_weights", "ce_weights"):
        t.setdefault(k, torch.zeros(shape, dtype=torch.float64))
    return t


def test_rl_term_clipped_ratio_by_hand() -> None:
    old = [[0.0, math.log(0.5), math.log(0.5), math.log(0.5), math.log(0.5)]]
    new = torch.tensor([[0.0, math.log(0.75), math.log(0.75), math.log(0.25), math.log(0.55)]], dtype=torch.float64)
    b = batch(logprobs=old, advantages=[[0, 1, -1, -1, 2]], rl_weights=[[0, 1, 1, 1, 1]])
    loss, m = predict_loss(new, b, LossConfig(eps_low=0.2, eps_high=0.2))
    # ratios 1.5, 1.5, 0.5, 1.1
    # A=+1, r=1.5: min(1.5, 1.2) = 1.2;  A=-1, r=1.5: min(-1.5, -1.2) = -1.5
    # A=-1, r=0.5: min(-0.5, -0.8) = -0.8;  A=2, r=1.1: 2.2 (inside the clip)
    expected = -(1.2 - 1.5 - 0.8 + 2.2) / 4
    assert float(loss) == pytest.approx(expected, abs=1e-12)
    assert m["ce_loss"] == 0.0 and m["n_rl_tokens"] == 4 and m["n_ce_tokens"] == 0
    assert m["clip_frac"] == pytest.approx(3 / 4)


def test_asymmetric_clip_and_weights() -> None:
    old = [[0.0, 0.0, 0.0]]
    new = torch.tensor([[0.0, math.log(1.5), math.log(1.5)]], dtype=torch.float64)
    b = batch(logprobs=old, advantages=[[0, 1, 1]], rl_weights=[[0, 1, 0.5]])
    loss, _ = predict_loss(new, b, LossConfig(eps_low=0.2, eps_high=0.28))
    assert float(loss) == pytest.approx(-(1.28 * 1 + 1.28 * 0.5) / 2, abs=1e-12)


def test_ce_term_by_hand_and_each_term_over_its_own_count() -> None:
    new = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, -4.0, -1.0]], dtype=torch.float64)
    b = batch(
        logprobs=[[0, -1.0, 0, 0], [0, -0.5, 0, 0]],
        advantages=[[0, 0.5, 0, 0], [0, -1.0, 0, 0]],
        rl_weights=[[0, 1, 0, 0], [0, 1, 0, 0]],
        ce_weights=[[0, 0, 0.5, 0.5], [0, 0, 0, 0.5]],
    )
    loss, m = predict_loss(new, b)
    rl = -(0.5 * 1 + (-1.0) * 1) / 2  # ratios 1
    ce = (0.5 * 2.0 + 0.5 * 3.0 + 0.5 * 1.0) / 3
    assert (m["n_rl_tokens"], m["n_ce_tokens"]) == (2, 3)
    assert float(loss) == pytest.approx(rl + ce, abs=1e-12)
    assert m["rl_loss"] == pytest.approx(rl) and m["ce_loss"] == pytest.approx(ce)


def test_microbatches_with_step_counts_equal_one_batch() -> None:
    g = torch.Generator().manual_seed(0)
    new = torch.randn(4, 6, generator=g, dtype=torch.float64) - 2
    b = batch(
        logprobs=(torch.randn(4, 6, generator=g, dtype=torch.float64) - 2).tolist(),
        advantages=torch.randn(4, 6, generator=g, dtype=torch.float64).tolist(),
        rl_weights=[[0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]],
        ce_weights=[[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]],
    )
    whole, _ = predict_loss(new, b)
    n_rl, n_ce = 7, 2
    parts = [
        predict_loss(new[i : i + 2], {k: v[i : i + 2] for k, v in b.items()}, n_rl=n_rl, n_ce=n_ce)[0] for i in (0, 2)
    ]
    assert float(sum(parts)) == pytest.approx(float(whole), abs=1e-12)


def test_kl_is_zero_on_policy_and_positive_off_policy() -> None:
    b = batch(logprobs=[[0, -1.0, -2.0]], advantages=[[0, 1, 1]], rl_weights=[[0, 1, 1]])
    on = torch.tensor([[0, -1.0, -2.0]], dtype=torch.float64)
    _, m = predict_loss(on, b, LossConfig(kl_coef=0.1))
    assert m["kl"] == 0.0
    off = torch.tensor([[0, -0.5, -2.5]], dtype=torch.float64)
    loss, m = predict_loss(off, b, LossConfig(kl_coef=0.1))
    k3 = sum(math.exp(-d) + d - 1 for d in (0.5, -0.5)) / 2
    assert m["kl"] == pytest.approx(k3) and float(loss) == pytest.approx(m["rl_loss"] + 0.1 * k3)


def test_zero_weight_tokens_cannot_leak_inf_or_nan() -> None:
    new = torch.tensor([[0.0, -math.inf, -1.0]], dtype=torch.float64, requires_grad=True)
    b = batch(logprobs=[[0, 0, -1.0]], advantages=[[0, 1, 1]], rl_weights=[[0, 0, 1]], ce_weights=[[0, 0, 0]])
    loss, _ = predict_loss(new, b)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(new.grad).all()


# -- the Arm B properties, with real samples -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok() -> Any:
    from tokenizers import Tokenizer

    from predict.env.runner import default_tokenizer_dir

    return Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))


def collate(samples: list[Any]) -> dict[str, Any]:
    """Right-padded [B, T] float64 tensors of the streams (+ token ids)."""
    t = max(len(s.token_ids) for s in samples)

    def pad(rows: list[list[float]]) -> Any:
        return torch.tensor([list(r) + [0] * (t - len(r)) for r in rows], dtype=torch.float64)

    out = {k: pad([getattr(s, k) for s in samples]) for k in ("logprobs", "advantages", "rl_weights", "ce_weights")}
    out["token_ids"] = pad([s.token_ids for s in samples]).long()
    return out


def fake_policy_logprobs(token_ids: Any, vocab: int = 151936) -> Any:
    """A tiny differentiable 'policy': logits = emb[prev token] @ W; returns logprob of token t given t-1."""
    g = torch.Generator().manual_seed(1)
    emb = torch.nn.Parameter(torch.randn(vocab, 4, generator=g, dtype=torch.float64) * 0.01)
    head = torch.nn.Parameter(torch.randn(4, 64, generator=g, dtype=torch.float64))
    ids = token_ids % 64
    h = emb[token_ids.roll(1, dims=1)]  # position t sees token t-1
    logp = torch.log_softmax(h @ head, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return logp, (emb, head)


def test_label_tokens_get_gradient_only_from_ce(tok: Any) -> None:
    from predict.train.from_rollouts import SampleSettings, rollout_calls, rollout_samples
    from predict.train.labels import label_token_span

    from .test_rl_samples import revised_shadow_rollout

    rec = revised_shadow_rollout(tok)
    rl, ce = rollout_samples(rec, 1.0, tok, SampleSettings(predictive=True, alpha=0.5))
    call = rollout_calls(rec["tokens"])[1]
    start, end = label_token_span(call.completion_ids, tok)
    label_pos = call.positions[start:end]
    b = collate([rl, ce])
    new = torch.randn(b["logprobs"].shape, dtype=torch.float64).requires_grad_(True)
    loss, m = predict_loss(new, b)
    loss.backward()
    assert all(new.grad[0, t] == 0.0 for t in label_pos), "the sampled label gets no policy gradient"
    ce_pos = [t for t, w in enumerate(ce.ce_weights) if w]
    n_ce = m["n_ce_tokens"]
    assert all(new.grad[1, t] == pytest.approx(-0.5 / n_ce) for t in ce_pos)
    assert torch.count_nonzero(new.grad[1]) == len(ce_pos)
    # the RL row's gradient is unchanged when the CE row is dropped, except for normalisation (own counts)
    new2 = new.detach().clone().requires_grad_(True)
    rl_only, _ = predict_loss(new2[:1], {k: v[:1] for k, v in b.items()})
    rl_only.backward()
    assert torch.equal(new.grad[0], new2.grad[0])


def test_alpha_zero_adds_nothing_bit_for_bit(tok: Any) -> None:
    """alpha = 0: no CE samples, and the loss and gradients are bit-identical to Arm A's code path (no CE at all).
    On a rollout without prediction points the two arms' samples are identical; with prediction points they
    differ only by the zero rl weight on the sampled label (the study's design), which this test pins down."""
    from predict.train.from_rollouts import SampleSettings, rollout_samples

    from .test_rl_samples import revised_shadow_rollout

    rec = revised_shadow_rollout(tok)
    b0 = rollout_samples(rec, -0.7, tok, SampleSettings(predictive=True, alpha=0.0))
    assert [s.kind for s in b0] == ["rl"]
    arm_a = rollout_samples(rec, -0.7, tok, SampleSettings(predictive=False))
    (a,) = arm_a
    (b,) = b0
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    label = [t for t in range(len(a.rl_weights)) if a.rl_weights[t] != b.rl_weights[t]]
    assert label and all(b.rl_weights[t] == 0.0 for t in label)
    a.rl_weights = list(b.rl_weights)
    a.mask = list(b.mask)
    a.advantages = list(b.advantages)
    ta, tb = collate([a]), collate(b0)
    la, _ = predict_loss(*fake_policy_logprobs(ta["token_ids"])[:1], ta)
    logp, params = fake_policy_logprobs(tb["token_ids"])
    lb, _ = predict_loss(logp, tb)
    assert torch.equal(la, lb)
    (g_b,) = torch.autograd.grad(lb, params[1])
    logp_a, params_a = fake_policy_logprobs(ta["token_ids"])
    (g_a,) = torch.autograd.grad(predict_loss(logp_a, ta)[0], params_a[1])
    assert torch.equal(g_a, g_b)
    # and a rollout with no prediction point: the two arms' samples are the same object, field for field
    rec_a = {**rec, "steps": [{**s, "action": "read_file"} if s["action"] == "prediction" else s for s in rec["steps"]]}
    assert rollout_samples(rec_a, 0.3, tok, SampleSettings(predictive=True, alpha=0.0)) == rollout_samples(
        rec_a, 0.3, tok, SampleSettings(predictive=False)
    )

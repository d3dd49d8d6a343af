"""The study's loss, one function for every trainer: clipped GRPO over rl tokens + CE over ce tokens.

    loss = sum_rl( -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) * w_rl ) / N_rl
         + sum_ce( -logp * w_ce ) / N_ce
         [+ kl_coef * sum_rl( exp(q - logp) - (q - logp) - 1 ) / N_rl]      (k3 estimator; off by default)

with r = exp(logp - q), logp the current policy's logprob of the token, q the sampling logprob, A the advantage.
N_rl / N_ce count the tokens whose weight is > 0 (over the whole optimizer step when given explicitly, so gradient
accumulation over micro-batches matches one big batch), as prime-rl normalises each term by its own token count.
Arm B's CE samples carry ce weight alpha on the verified label tokens, so alpha multiplies the CE term; with
alpha = 0 there are no CE samples and the loss is Arm A's exactly. A token with rl weight 0 (Arm B's sampled label)
gets no policy gradient at all: its gradient comes only from CE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from predict.config import config_default
from predict.config.models import RLSettings

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LossConfig:
    eps_low: float = config_default(RLSettings, "eps_low")
    eps_high: float = config_default(RLSettings, "eps_high")
    kl_coef: float = config_default(RLSettings, "kl_coef")


def predict_loss(
    new_logprobs: torch.Tensor,
    batch: Mapping[str, torch.Tensor],
    config: LossConfig = LossConfig(),
    *,
    n_rl: int | None = None,
    n_ce: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one (micro-)batch and its parts.

    new_logprobs: [B, T] logprob of token t under the current policy (any value where no weight applies).
    batch: float tensors [B, T] "logprobs" (sampling), "advantages", "rl_weights", "ce_weights".
    n_rl, n_ce: token counts to normalise by (default: this batch's own).
    """
    import torch

    rl_w, ce_w = batch["rl_weights"], batch["ce_weights"]
    own_rl, own_ce = int((rl_w > 0).sum()), int((ce_w > 0).sum())  # this batch's N_rl, N_ce
    n_rl = max(own_rl if n_rl is None else n_rl, 1)
    n_ce = max(own_ce if n_ce is None else n_ce, 1)
    rl_on = rl_w > 0
    # Only rl tokens enter the ratio; elsewhere it is pinned to 1 so no inf/nan can leak through a zero weight.
    log_ratio = torch.where(rl_on, new_logprobs - batch["logprobs"], torch.zeros_like(new_logprobs))
    ratio = torch.exp(log_ratio)
    adv = batch["advantages"]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - config.eps_low, 1 + config.eps_high) * adv)
    rl = -(surrogate * rl_w).sum() / n_rl
    ce = -(torch.where(ce_w > 0, new_logprobs, torch.zeros_like(new_logprobs)) * ce_w).sum() / n_ce
    loss = rl + ce
    metrics = {
        "rl_loss": float(rl.detach()),
        "ce_loss": float(ce.detach()),
        "n_rl_tokens": own_rl,
        "n_ce_tokens": own_ce,
    }
    if config.kl_coef:
        k3 = torch.exp(-log_ratio) + log_ratio - 1
        kl = (k3 * rl_on).sum() / n_rl
        loss = loss + config.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    with torch.no_grad():
        clipped = rl_on & ((ratio < 1 - config.eps_low) | (ratio > 1 + config.eps_high))
        metrics["clip_frac"] = float(clipped.sum()) / max(own_rl, 1)
    metrics["loss"] = float(loss.detach())
    return loss, metrics

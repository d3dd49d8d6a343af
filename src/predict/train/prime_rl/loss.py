"""The study's policy loss as prime-rl's custom rl loss: `predict.train.loss.predict_loss`, one sample at a time.

Rendered by `predict.train.prime_rl.configs.loss_table` as ``[trainer.loss] type = "custom"`` with
``import_path = "predict.train.prime_rl.loss.clipped_surrogate"`` and the ``rl:`` section's ``eps_low``,
``eps_high`` and ``kl_coef`` as kwargs, so one ``rl:`` design means one loss on both backends.

Rules it follows:
* one formula: it calls `predict_loss` itself (no second copy of the clipped surrogate or the KL term);
* prime-rl's contract (``prime_rl.trainer.rl.loss.compute_loss`` at the pin): the function gets one sample's
  ``LossInputs`` with ``loss_mask`` already the rl tokens (mask & rl weight != 0) and ``loss_weights`` the rl
  weights (None = 1), returns the sample's *sum* (prime-rl divides by the step's global rl token count, as
  `predict_loss` divides by N_rl), and 0-dim tensor metrics;
* it imports prime-rl only when called (inside prime-rl's trainer), so this module imports anywhere;
* it cannot measure the RL and CE terms' gradient norms (`predict.train.grad_terms`): it gets one sample's
  logprobs, never the CE term (prime-rl's own ``ce_loss_fn``), the parameters or their gradients, and the one
  backward of the summed loss runs after it; the paper backend's metrics leave those columns null.
"""

from __future__ import annotations

from typing import Any

from predict.train.loss import LossConfig, predict_loss


def clipped_surrogate(inputs: Any, *, eps_low: float, eps_high: float, kl_coef: float) -> Any:
    """One sample's rl loss sum: -min(r A, clip(r) A) w (+ kl_coef k3) over its rl tokens."""
    import torch
    from prime_rl.trainer.rl.loss import LossOutputs

    mask = inputs.loss_mask
    weights = inputs.loss_weights if inputs.loss_weights is not None else torch.ones_like(inputs.trainer_logprobs)
    rl_weights = torch.where(mask, weights, torch.zeros_like(weights))
    batch = {
        "logprobs": inputs.inference_logprobs.unsqueeze(0),
        "advantages": inputs.advantages.unsqueeze(0),
        "rl_weights": rl_weights.unsqueeze(0),
        "ce_weights": torch.zeros_like(rl_weights).unsqueeze(0),
    }
    config = LossConfig(eps_low=eps_low, eps_high=eps_high, kl_coef=kl_coef)
    # n_rl = 1: the sum; prime-rl normalises by the step's rl token count afterwards.
    loss, metrics = predict_loss(inputs.trainer_logprobs.unsqueeze(0), batch, config, n_rl=1, n_ce=1)
    return LossOutputs(loss=loss, metrics={"clip_frac": torch.tensor(metrics["clip_frac"])})

"""Training: the sample records every trainer consumes, the one loss, and the trainers.

* `samples` - `TrainSample`: token ids + per-token streams (mask, sampling logprobs, advantages, rl/ce weights);
  the one record shared by SFT, the local RL trainer and the prime-rl plugin.
* `loss`    - `predict_loss`: clipped GRPO policy loss over rl tokens + CE over ce tokens, each normalised by its
  own token count (as prime-rl does).
"""

"""Training: the sample records every trainer consumes, the one loss, and the trainers.

* `samples` - `TrainSample`: token ids + per-token streams (mask, sampling logprobs, advantages, rl/ce weights);
  the one record shared by SFT, the local RL trainer and the prime-rl plugin; RL and CE samples of rollouts
  (`build_samples`: token graph -> merged call sequences, GRPO advantages, Arm B label masking + CE samples).
* `labels`  - Arm B's label tokens and CE-only samples, pure and torch-free (imported by the prime-rl plugin too).
* `rl`      - `predict rl`: the local RL backend (rollouts against a running vLLM, one `Trainer` step, in-place
  weight sync), resumable; runs = arms + ablations.
* `loss`    - `predict_loss`: clipped GRPO policy loss over rl tokens + CE over ce tokens, each normalised by its
  own token count (as prime-rl does).
"""

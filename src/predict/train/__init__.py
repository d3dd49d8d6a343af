"""Training: the sample record every trainer consumes, the one loss, the trainer and its optimizer, the stages.

* `sample` - `TrainSample`: token ids + per-token streams (mask, sampling logprobs, advantages, rl/ce
  weights), the one record shared by SFT, the local RL trainer and the prime-rl plugin; its parquet schema.
* `from_rollouts` - RL and CE samples of rollouts (`build_samples`: token graph -> merged call sequences, GRPO
  advantages, Arm B label masking + CE samples; `rft_samples` for RFT).
* `labels`  - Arm B's label tokens (located by the protocol's own parse) and CE-only samples, pure and torch-free
  (imported by the prime-rl plugin too).
* `loss`    - `predict_loss`: clipped GRPO policy loss over rl tokens + CE over ce tokens, each normalised by its
  own token count (as prime-rl does).
* `trainer` - `Trainer`: the compact trainer SFT, RFT and local RL share (packed micro-batches, chunked lm_head
  loss, exact save/resume).
* `optim`   - `KahanAdamW`: AdamW for bf16 weights whose small updates are kept (the trainer's optimizer below
  float32).
* `mlp`     - the SwiGLU MLP that makes its down projection's input again in the backward (the trainer's, on a GPU).
* `sft`     - `predict sft`: rendering traces into samples and the SFT stage.
* `rl`      - `predict rl`: the local RL backend (rollouts against a running vLLM, one `Trainer` step, in-place
  weight sync), resumable; runs = arms + ablations.
* `rft`     - `predict rft`: rejection-sampling fine-tuning (keep the verified-reward-1 rollouts, train on them).
* `driver`  - what every run of our trainer does around its steps (RL and RFT): serving, resume, checkpoints,
  publishing, the metrics log, deleting the state once published.
* `metrics` - the one per-step metrics schema every trainer writes (local RL, RFT, prime-rl via its converter), pure.
* `prime_rl/` - the cluster backend: prime-rl configs, `PredictAlgorithm` and its metrics.
"""

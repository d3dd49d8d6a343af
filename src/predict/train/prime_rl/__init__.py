"""The cluster backend: SFT and RL on prime-rl (pinned in ``config: prime_rl.commit``, v0.8.0).

* `configs`: prime-rl ``rl`` / ``sft`` TOMLs and the SFT ``messages`` dataset, rendered from the study config;
  checkpoint collection into the shared paths.
* `points`: Arm B's prediction points in a rollout (program steps <-> sampled tokens, verified labels); pure.
* `algorithm`: `PredictAlgorithm`, registered in prime-rl by ``workflow/prime-rl/predict-algorithm.patch``; it
  imports prime-rl, so it is imported only inside prime-rl's venv (and by the tests, with prime-rl faked).
* `cluster`: clone + patch + ``uv sync`` + install, and the launcher of ``rl`` / ``sft``.

Arm B's token-level logic (label span, CE sample) is `predict.train.labels`, shared with the local trainer.
"""

"""The rollout environment shared by both arms (verifiers v1): protocol, agent program, harness, taskset,
records and the rollout API.

Modules (kept import-light: the agent program imports only `protocol` and `predict.sandbox`):

* `protocol`  - the published rollout format as pure logic: prompts, action parsing, the episode state machine.
* `program`   - the agent program run inside the verifiers runtime (stdlib HTTP loop over `protocol.Episode`).
* `check`     - grades a workdir's final solution.py in the sandbox (used by the task's reward).
* `harness`   - `LocalAgentHarness`: starts the program with the local Python (no uv, no network).
* `taskset`   - `MbppTaskset`/`MbppTask`: MBPP rows as tasks; setup, finalize, reward.
* `records`   - one trace -> one per-trajectory row; parquet schema and writers (atomic, resumable).
* `runner`    - `RolloutSettings` and `run_rollouts`: many rollouts through the verifiers runtime (the `predict
  rollout` stage that drives it is `predict.rollouts`).

The env of clients we do not drive (`MbppEnv`: vf-eval, prime-rl's env server) is `predict_mbpp.environment`, beside
the taskset id it is exported under: its seat defaults come from the study's runs (`predict.runs`), which stand above
this package.
"""

"""The taskset id ``predict_mbpp`` as verifiers resolves it: a top-level module whose ``__all__`` exports one
Taskset, one Harness and one Env subclass (verifiers picks each kind from ``__all__``).

* `MbppTaskset` (`predict.env.taskset`): prime-rl names environments by taskset id
  (``[orchestrator.train.source.env.taskset] id = "predict_mbpp"``) and imports this module in its env server;
  ``vf-eval predict_mbpp`` does the same.
* `LocalAgentHarness` (`predict.env.harness`): the taskset's own harness, so a seat that pins none runs our agent
  program (verifiers' fallback is its ``bash`` harness). Importing this also registers the harness id
  ``predict_local_agent``, which prime-rl's TOML pins.
* `MbppEnv` (`predict_mbpp.environment`): the single-agent env with the study's seat defaults (runtime, sampling, turn
  cap) and one sample index per rollout of ``-r n``.
"""

from predict.env.harness import LocalAgentHarness
from predict.env.taskset import MbppTaskset
from predict_mbpp.environment import MbppEnv

__all__ = ["LocalAgentHarness", "MbppEnv", "MbppTaskset"]

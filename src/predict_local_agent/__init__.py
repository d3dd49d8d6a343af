"""The harness id ``predict_local_agent`` as verifiers resolves it in a fresh process (prime-rl's env server).

The harness is `predict.env.harness.LocalAgentHarness`; that module also registers this id when imported first.
"""

from predict.env.harness import LocalAgentHarness

__all__ = ["LocalAgentHarness"]

"""Per-request sampling seeds: every model call of a rollout gets its own seed, derived from the rollout's identity.

Rules: the seed of call ``call`` (0-based, in the order the program makes them; a retry of one call reuses its
seed) is the first 4 bytes of ``sha256(f"{key}#{call}")`` as an unsigned int, masked to 31 bits (vLLM and the
OpenAI API take any int; 31 bits stay an int32 wherever one is expected). ``key`` is the rollout's
`predict.env.records.rollout_key`, ``arm|seed|checkpoint|task_id|sample``: the run, the run's seed, the step (its
checkpoint), the task and the sample, so a run repeats on the same machine and no two rollouts or calls share a
seed. Standard library only: the agent program imports it.
"""

from __future__ import annotations

import hashlib


def request_seed(key: str, call: int) -> int:
    """The seed of model call `call` of the rollout whose key is `key`."""
    digest = hashlib.sha256(f"{key}#{call}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

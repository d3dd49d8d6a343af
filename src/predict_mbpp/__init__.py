"""The taskset id ``predict_mbpp`` as verifiers resolves it (a top-level module exporting one Taskset subclass).

prime-rl names environments by taskset id (``[orchestrator.train.source.env.taskset] id = "predict_mbpp"``) and
imports that module in its env server; the taskset itself is `predict.env.taskset`. Importing this also registers
the harness id ``predict_local_agent`` (see `predict.env.harness`).
"""

import predict.env.harness  # noqa: F401 - registers the harness id for a process that imports only the taskset
from predict.env.taskset import MbppTaskset

__all__ = ["MbppTaskset"]

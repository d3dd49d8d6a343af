"""The sandboxed verifier: what verifiably happened when a candidate ``solution.py`` ran against a task's tests.

Modules:

* `child`: the stdlib-only side that runs in fork servers and their children (isolation, the harness, verdicts,
  `check_once`); one file, because a fork server re-executes it (``python -m predict.sandbox serve``).
* `verifier`: `Verifier`, the pool of fork servers a stage checks through (the parent side).
* `policy`: the isolation a stage requires (``verifier.isolation.require``) and its record in parquet metadata.
* `gold`: the ``verify-gold`` stage (every MBPP gold solution through the verifier).
* ``__main__``: ``python -m predict.sandbox serve | report | check``.
"""

from predict.sandbox.child import LAYERS, Verdict, check_once, isolation_report, isolation_status, label_original
from predict.sandbox.policy import (
    ISOLATION_METADATA_KEY,
    ROOT_LAYERS,
    UNPRIVILEGED_LAYERS,
    IsolationError,
    check_isolation,
    isolation_metadata,
    required_layers,
)
from predict.sandbox.verifier import Verifier, close_shared_verifiers, shared_verifier

__all__ = ["ISOLATION_METADATA_KEY", "LAYERS", "ROOT_LAYERS", "UNPRIVILEGED_LAYERS", "IsolationError", "Verdict",
           "Verifier", "check_isolation", "check_once", "isolation_metadata", "isolation_report", "isolation_status",
           "close_shared_verifiers", "label_original", "required_layers", "shared_verifier"]

"""What isolation a verifier must have: the required layers (config ``verifier.isolation.require``), the check that
stops a stage naming each missing layer and why, and the record that goes into parquet metadata.

A layer that cannot be had is never silent.
"""

from __future__ import annotations

# Only what fork servers and their children need (see "Cost per check" above): client-side modules (subprocess,
# threading, queue, tempfile) are imported where they are used; test_fork_server_stays_lean checks the server.
import json
import os
from collections.abc import Sequence
from typing import Any

from predict.sandbox.child import LAYERS

# "auto": every layer a Linux machine gives a root verifier, or, when not root, the user-namespace set (no privilege
# to drop: the child stays the invoking user, mapped to root in its own user namespace).
ROOT_LAYERS: tuple[str, ...] = tuple(n for n in LAYERS if n != "user_namespace")
UNPRIVILEGED_LAYERS: tuple[str, ...] = tuple(n for n in LAYERS if n != "dropped_privileges")
ISOLATION_METADATA_KEY = "predict.isolation"  # parquet schema metadata: the isolation record (JSON)


class IsolationError(ValueError):
    """A layer the config requires is not active on this machine; names each layer and why."""


def required_layers(require: str | Sequence[str], *, root: bool | None = None) -> tuple[str, ...]:
    """The layers ``require`` names: ``"auto"`` picks ROOT_LAYERS or UNPRIVILEGED_LAYERS by who runs the verifier."""
    if isinstance(require, str):
        if require != "auto":
            raise ValueError(f"verifier.isolation.require: expected 'auto' or a list of layers, not {require!r}")
        root = os.geteuid() == 0 if root is None else root
        return ROOT_LAYERS if root else UNPRIVILEGED_LAYERS
    unknown = [n for n in require if n not in LAYERS]
    if unknown:
        raise ValueError(f"verifier.isolation.require: unknown layer {unknown[0]!r} (layers: {', '.join(LAYERS)})")
    return tuple(dict.fromkeys(require))


def _why_inactive(layer: str, reasons: dict[str, str]) -> str:
    if layer in reasons:
        return reasons[layer]
    if layer == "user_namespace" and os.geteuid() == 0:
        return "not used when the verifier runs as root (its children drop to nobody instead)"
    if layer == "dropped_privileges" and os.geteuid() != 0:
        return "the verifier does not run as root: there is no privilege to drop"
    return "not active (the sandbox child gave no reason)"


def check_isolation(status: tuple[dict[str, bool], dict[str, str]], require: str | Sequence[str],
                    accept_weaker: bool) -> dict[str, Any]:
    """The isolation record (for reports and parquet metadata); raises IsolationError if a required layer is missing.

    ``status`` is ``isolation_status()`` (check_once children) or ``Verifier.isolation_status()`` (a pool's);
    ``require`` and ``accept_weaker`` are config verifier.isolation's.
    With ``accept_weaker`` a missing layer is only recorded (``missing`` in the record), never silently dropped.
    """
    layers, reasons = status
    required = required_layers(require)
    if not layers:
        raise IsolationError("sandbox isolation: the sandbox child reported no layers at all (it did not start)")
    missing = [n for n in required if not layers.get(n)]
    record = {
        "active": [n for n in LAYERS if layers.get(n)],
        "inactive": {n: _why_inactive(n, reasons) for n in LAYERS if not layers.get(n)},
        "required": list(required),
        "missing": missing,
        "accept_weaker": bool(accept_weaker),
        "euid": os.geteuid(),
    }
    if missing and not accept_weaker:
        detail = "; ".join(f"{n} ({record['inactive'][n]})" for n in missing)
        raise IsolationError(
            f"sandbox isolation: required layer{'s' if len(missing) > 1 else ''} not active on this machine: {detail}. "
            "Fix the machine, or set verifier.isolation.accept_weaker: true to run with weaker isolation "
            "(recorded in every output)"
        )
    return record


def isolation_metadata(record: dict[str, Any]) -> dict[str, str]:
    """Parquet schema metadata carrying the isolation record."""
    return {ISOLATION_METADATA_KEY: json.dumps(record, sort_keys=True)}

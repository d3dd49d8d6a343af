"""Required isolation layers: a layer that cannot be had stops the stage, naming it and why; the record of the active
layers goes into the verifier report and every rollout parquet.

A machine without a layer is simulated with PREDICT_SANDBOX_WITHOUT (the sandbox then really does not set that layer
up, in fork servers and check_once children alike), so the stages are tested end to end in subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from predict.data import MBPP_SCHEMA
from predict.outputs import write_rows
from predict.sandbox import (
    ISOLATION_METADATA_KEY,
    LAYERS,
    ROOT_LAYERS,
    UNPRIVILEGED_LAYERS,
    IsolationError,
    check_isolation,
    isolation_status,
    required_layers,
)

from .conftest import REPO

ALL_ON = dict.fromkeys(LAYERS, True)


def test_auto_requires_every_layer_of_this_kind_of_machine() -> None:
    assert required_layers("auto", root=True) == ROOT_LAYERS
    assert "dropped_privileges" in ROOT_LAYERS and "user_namespace" not in ROOT_LAYERS
    assert required_layers("auto", root=False) == UNPRIVILEGED_LAYERS
    assert "user_namespace" in UNPRIVILEGED_LAYERS and "dropped_privileges" not in UNPRIVILEGED_LAYERS
    assert required_layers(["private_tmp", "setsid", "private_tmp"]) == ("private_tmp", "setsid")
    with pytest.raises(ValueError, match="unknown layer 'private_temp'"):
        required_layers(["private_temp"])


def test_missing_layer_is_named_with_its_reason() -> None:
    layers = {**ALL_ON, "private_tmp": False, "user_namespace": False}
    status = (layers, {"private_tmp": "mounting a tmpfs on /tmp failed: Operation not permitted (errno 1)"})
    with pytest.raises(IsolationError, match=r"private_tmp \(mounting a tmpfs on /tmp failed: Operation not permitted"):
        check_isolation(status, ["private_tmp", "net_namespace"], accept_weaker=False)
    record = check_isolation(status, ["private_tmp", "net_namespace"], accept_weaker=True)  # recorded, not silent
    assert record["missing"] == ["private_tmp"] and record["accept_weaker"] is True
    assert "private_tmp" not in record["active"] and "net_namespace" in record["active"]
    assert record["inactive"]["private_tmp"].startswith("mounting a tmpfs")
    assert check_isolation(status, ["net_namespace"], accept_weaker=False)["missing"] == []  # not required: no error


def test_the_config_models_know_exactly_the_sandbox_layers_and_labels() -> None:
    """The sandbox keeps its layer names and outcome labels without the config stack (its child must stay lean);
    the config models' allowed values (and so config/schema.yaml's) are the same, in the same order."""
    from predict.config import allowed_values
    from predict.config.models import IsolationLayer, VerifierSettings
    from predict.sandbox.child import OUTCOME_LABELS

    assert typing.get_args(IsolationLayer) == LAYERS
    assert allowed_values(VerifierSettings, "outcome_labels") == OUTCOME_LABELS


def test_this_machine_gives_every_auto_layer() -> None:
    """Wherever the checkout and its venv live (CI also runs this from a clone under mktemp -d, and as an
    unprivileged user): the default requirement holds, so the privilege drop or user namespace and the private tmp
    are active."""
    record = check_isolation(isolation_status(), "auto", accept_weaker=False)
    assert record["missing"] == []
    assert "private_tmp" in record["active"]
    assert ("dropped_privileges" if os.geteuid() == 0 else "user_namespace") in record["active"]


def _without(*layers: str) -> dict[str, str]:
    return {**os.environ, "PREDICT_SANDBOX_WITHOUT": ",".join(layers)}


def _verify_gold(tmp_path: Path, mbpp_rows: list[dict], isolation: dict | None = None,
                 env: dict[str, str] | None = None):
    data = tmp_path / "data"
    write_rows(mbpp_rows[:2], MBPP_SCHEMA, data / "val.parquet")
    out = tmp_path / "gold.parquet"
    verifier = {"timeout_s": 3.0, "memory_mb": 1024, "workers": 1, "outcome_labels": "structured",
                "gold_splits": ["val"], **({"isolation": isolation} if isolation else {})}
    (tmp_path / "verify-gold.json").write_text(json.dumps({"verifier": verifier}))  # the stage's config slice
    proc = subprocess.run(
        [sys.executable, "-m", "predict.cli", "verify-gold", "--config-slice", str(tmp_path / "verify-gold.json"),
         "--data-dir", str(data), "--out", str(out), "--summary-out", str(tmp_path / "summary.parquet")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    return proc, out


@pytest.mark.parametrize("layer", ["private_tmp", "net_namespace"])
def test_verify_gold_stops_when_a_required_layer_is_missing(layer: str, tmp_path: Path, mbpp_rows: list[dict]) -> None:
    proc, out = _verify_gold(tmp_path, mbpp_rows, env=_without(layer))
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())  # rich wraps long lines
    assert f"{layer} (switched off by PREDICT_SANDBOX_WITHOUT" in message and "accept_weaker" in message
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_verify_gold_accepts_weaker_isolation_only_when_told_and_records_it(tmp_path: Path,
                                                                           mbpp_rows: list[dict]) -> None:
    proc, out = _verify_gold(tmp_path, mbpp_rows, {"accept_weaker": True}, env=_without("net_namespace"))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(pq.read_schema(out).metadata[ISOLATION_METADATA_KEY.encode()])
    assert record["missing"] == ["net_namespace"] and record["accept_weaker"] is True
    assert "net_namespace" in record["inactive"] and "net_namespace" not in record["active"]
    # a layer that is not required may be missing without accept_weaker
    proc, out = _verify_gold(tmp_path, mbpp_rows, {"require": ["setsid", "rlimits"]}, env=_without("net_namespace"))
    assert proc.returncode == 0, proc.stderr


def test_verify_gold_writes_the_active_layers(tmp_path: Path, mbpp_rows: list[dict]) -> None:
    proc, out = _verify_gold(tmp_path, mbpp_rows)
    assert proc.returncode == 0, proc.stderr
    for path in (out, tmp_path / "summary.parquet"):
        record = json.loads(pq.read_schema(path).metadata[ISOLATION_METADATA_KEY.encode()])
        assert record["missing"] == [] and record["required"] == list(required_layers("auto"))
        assert set(record["required"]) <= set(record["active"])


def test_rollout_stage_stops_before_serving_when_a_required_layer_is_missing(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "predict.cli", "rollout", "--config-json", json.dumps(config),
         "--tasks-file", str(tmp_path / "val.parquet"), "--split", "val", "--model", "none", "--checkpoint", "base",
         "--arm", "A", "--seed", "42", "--out", str(tmp_path / "out.parquet")],
        capture_output=True, text=True, env=_without("private_tmp"), timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "private_tmp (switched off" in " ".join(proc.stderr.split())
    assert not (tmp_path / "out.parquet").exists()

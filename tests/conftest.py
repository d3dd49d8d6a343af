"""Shared test fixtures: where the repository and its MBPP copy (resources/mbpp, PREDICT_MBPP_PATH overrides) live."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The campaign registry of the whole session (each test gets its own below): session fixtures that run a campaign
# run before any function fixture, and must never write into the checkout's .test-campaigns/.
os.environ["PREDICT_TEST_CAMPAIGNS"] = str(Path(tempfile.mkdtemp(prefix="predict-campaigns-")) / "ledger.jsonl")
MBPP_PATH = Path(os.environ.get("PREDICT_MBPP_PATH", REPO / "resources" / "mbpp" / "mbpp.jsonl"))


@pytest.fixture(scope="session")
def mbpp_path() -> Path:
    if not MBPP_PATH.exists():
        pytest.fail(f"MBPP not found at {MBPP_PATH}; set PREDICT_MBPP_PATH")
    return MBPP_PATH


@pytest.fixture(scope="session")
def mbpp_rows(mbpp_path: Path) -> list[dict]:
    from predict.data import load_mbpp

    return load_mbpp(mbpp_path, hf_fallback=False)


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The random tiny Qwen3 (seed 0), built once into the repository's cache."""
    from predict.serving.server import default_cache_dir
    from predict.tiny_model import cached_tiny_qwen3

    return Path(cached_tiny_qwen3(default_cache_dir() / "models", seed=0))


@pytest.fixture(autouse=True)
def campaign_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test its own campaign ledger (predict.campaign.registry_ledger), never the checkout's: the checkout's
    registry refuses a second campaign on the same test split, and tests run many."""
    ledger = tmp_path_factory.mktemp("campaigns") / "ledger.jsonl"
    monkeypatch.setenv("PREDICT_TEST_CAMPAIGNS", str(ledger))
    return ledger

"""Shared test fixtures: where the repository and its MBPP copy (resources/mbpp, PREDICT_MBPP_PATH overrides) live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MBPP_PATH = Path(os.environ.get("PREDICT_MBPP_PATH", REPO / "resources" / "mbpp" / "mbpp.jsonl"))


@pytest.fixture(scope="session")
def mbpp_path() -> Path:
    if not MBPP_PATH.exists():
        pytest.fail(f"MBPP not found at {MBPP_PATH}; set PREDICT_MBPP_PATH")
    return MBPP_PATH


@pytest.fixture(scope="session")
def mbpp_rows(mbpp_path: Path) -> list[dict]:
    from predict.data import load_mbpp

    return load_mbpp(mbpp_path)


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The random tiny Qwen3 (seed 0), built once into the repository's cache."""
    from predict.serve import default_cache_dir
    from predict.tiny_model import cached_tiny_qwen3

    return Path(cached_tiny_qwen3(default_cache_dir() / "models", seed=0))

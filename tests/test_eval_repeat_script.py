"""benchmarks/eval_repeat.py's comparison of rows (issue 59): where two runs' rows first differ, the trajectory before
the counts that follow from it, how many outcomes differ, and the rows of separate processes compared from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def eval_repeat():
    return benchmark_script("eval_repeat")


def _row(task: int, replies: list[str], outcome: str = "ASSERTION_FAILURE") -> dict:
    return {"task_id": task, "n_input_tokens": 100 * len("".join(replies)), "final_outcome": outcome,
            "final_pass": outcome == "PASS", "steps": [{"index": i, "reply": r} for i, r in enumerate(replies)]}


def test_a_differing_reply_is_named_before_the_counts_it_changes(eval_repeat) -> None:
    a, b = _row(1, ["read", "patch x"]), _row(1, ["read", "patch y!"])
    assert eval_repeat.first_difference(a, b) == "steps[1].reply@6"  # not n_input_tokens, which sorts first
    assert eval_repeat.first_difference(a, dict(a)) is None
    assert eval_repeat.first_difference(a, _row(1, ["read"])) == "steps.len"
    found = eval_repeat.differences([a, _row(2, ["x"])], [b, _row(2, ["x"], outcome="PASS")])
    assert found == {"first": {"1": "steps[1].reply@6", "2": "final_outcome@0"}, "outcome_differs": 1}


def test_rows_of_separate_processes_compare_from_their_files(eval_repeat, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for name, second in (("a", "patch x"), ("b", "patch x"), ("c", "patch z")):
        f = tmp_path / f"{name}.jsonl"
        f.write_text(json.dumps({"mode": "invariant", "rows": [_row(1, ["read", second]), _row(2, ["x"])]}) + "\n")
        files.append(f)
    assert eval_repeat.compare_files(files) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["tasks_whose_rows_differ"], r["first_differences"]) for r in report["against"]] == [
        (0, {}), (1, {"1": "steps[1].reply@6"})]


# vLLM 0.26.0's own lines (backends.py), as the H100 servers of 2026-12-06 logged them
COMPILED_LOG = ("INFO 12-06 21:44:53 [backends.py:378] Cache the graph of compile range (1, 8192) for later use\n"
                "INFO 12-06 21:44:59 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 13.11 s\n")
LOADED_LOG = ("INFO 12-06 21:46:13 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) "
              "from the cache, took 0.890 s\n")


def test_each_server_says_whether_it_compiled_its_graphs_or_loaded_them() -> None:
    """Issue 59: a tiny-Qwen3 server that compiled on an empty cache gave other rows than two that loaded its graphs;
    the JSON (and a GPU rerun's difference) must say which a server did."""
    from predict.serving.identity import compile_cache_use

    assert compile_cache_use(COMPILED_LOG) == "compiled"
    assert compile_cache_use(LOADED_LOG) == "loaded"
    assert compile_cache_use(COMPILED_LOG + LOADED_LOG) == "both"
    assert compile_cache_use("INFO Using eager mode\n") == "none"


def _model_folder(tmp_path: Path) -> Path:
    """A checkpoint folder with only the config.json the script reads (the servers are stand-ins)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                                   "intermediate_size": 256, "vocab_size": 1000}))
    return model


class _Started(Exception):
    """Raised by the stand-in server: the test needs only how each server would have been started."""


def test_fresh_compile_caches_and_the_attention_key_reach_every_batch_invariant_server(
        eval_repeat, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--compile-cache fresh gives each server an empty cache of its own; --evaluation-attention-backend starts the
    batch-invariant servers on those kernels as the config key would (issue 59's next checks)."""
    import sys

    import predict.serving.server as server

    from .conftest import REPO

    started: list[dict] = []

    def from_serving(model, serving, **kw):
        started.append(kw)
        return _NoServer()

    class _NoServer:
        extra_args: list[str] = []

        def __enter__(self):
            raise _Started

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(server.VLLMServer, "from_serving", staticmethod(from_serving))
    model = _model_folder(tmp_path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"an earlier run": 1}\n')
    for args in (["--compile-cache", "fresh"], ["--rows-out", str(rows)], ["--timed-compile"]):
        monkeypatch.setattr(sys, "argv", ["eval_repeat.py", "--config", str(REPO / "config/gpu-slice.yaml"),
                                          "--model", str(model), "--tasks", "2", "--modes", "invariant",
                                          "--evaluation-attention-backend", "FLASH_ATTN", *args])
        with pytest.raises(_Started):
            eval_repeat.main()
    fresh, shared, timed = started
    assert rows.read_text() == ""  # an earlier run's lines would be what --compare reads first
    assert fresh["cache_dir"].is_dir() and not any(fresh["cache_dir"].iterdir())  # empty, its own
    # Inductor's and Triton's caches too: with the defaults (/tmp, ~/.triton) a "fresh" server reused the last one's
    # kernels (compiled in 1.1 s, not 11.4), so its compile was not one of its own
    assert fresh["env"]["TORCHINDUCTOR_CACHE_DIR"].startswith(str(fresh["cache_dir"]))
    assert fresh["env"]["TRITON_CACHE_DIR"].startswith(str(fresh["cache_dir"]))
    assert "cache_dir" not in shared and "TORCHINDUCTOR_CACHE_DIR" not in shared["env"]  # shared, as a node's jobs
    # evaluation's deterministic compile, unless --timed-compile leaves it out (as before issue 59's fix)
    for kw in (fresh, shared):
        assert kw["env"]["TORCHINDUCTOR_DETERMINISTIC"] == "1"
        flags = kw["extra_args"]
        assert json.loads(flags[flags.index("--compilation-config") + 1]) == {
            "inductor_compile_config": {"benchmark_combo_kernel": False}}
    assert "TORCHINDUCTOR_DETERMINISTIC" not in timed["env"] and "--compilation-config" not in timed["extra_args"]
    for kw in started:
        flags = kw["extra_args"]
        assert flags[flags.index("--attention-backend") + 1] == "FLASH_ATTN"  # the key's, not gpu-slice's TRITON_ATTN
        assert kw["env"]["VLLM_BATCH_INVARIANT"] == "1"


class _SlotEnded(Exception):
    """Stands for the end of a GPU slot: the process is killed while its next server starts."""


def test_a_run_cut_short_leaves_the_numbers_of_every_run_it_finished(
        eval_repeat, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2026-12-07: a slot's device time ended while four tiny servers' check ran; their rows were in --rows-out, but
    the JSON (wall times, differing tasks, each server's compile) is written only at the end, so none came back.
    After every run the --out JSON holds what has run so far, marked incomplete until the run ends."""
    import sys

    import predict.env.runner as runner
    import predict.serving.server as server

    from .conftest import REPO

    entered: list[int] = []

    class _Server:
        extra_args: list[str] = []
        base_url, log_path = "http://127.0.0.1:1/v1", None

        def __enter__(self):
            entered.append(1)
            if len(entered) == 2:
                raise _SlotEnded
            return self

        def __exit__(self, *exc):
            return False

    def rollouts(tasks, settings):
        reply = "same" if settings.concurrency == 16 else f"other {settings.checkpoint}"
        return [{**_row(t["task_id"], [reply]), "ok": True, "n_model_calls": 1} for t in tasks]

    monkeypatch.setattr(server.VLLMServer, "from_serving", staticmethod(lambda model, serving, **kw: _Server()))
    monkeypatch.setattr(runner, "run_rollouts_sync", rollouts)
    model = _model_folder(tmp_path)
    out = tmp_path / "eval_repeat.json"

    def run(*args: str) -> int:
        monkeypatch.setattr(sys, "argv", ["eval_repeat.py", "--config", str(REPO / "config/gpu-slice.yaml"), "--model",
                                          str(model), "--tasks", "2", "--modes", "invariant", "--repeats", "1",
                                          "--out", str(out), *args])
        return eval_repeat.main()

    with pytest.raises(_SlotEnded):
        run("--servers", "2", "--concurrency", "16", "64")
    got = json.loads(out.read_text())
    assert got["complete"] is False
    invariant = got["modes"]["invariant"]
    assert [(r["server"], r["concurrency"]) for r in invariant["runs"]] == [(0, 16), (0, 64)]
    assert invariant["tasks_whose_rows_differ_from_the_first_run"] == [2]  # both tasks' replies differ at 64
    assert list(invariant["settings"]) == ["16", "64"] and invariant["repeats"] is False

    entered[:] = [0, 0]  # the next server is the third to start: it starts, and this run ends
    assert run("--servers", "1", "--concurrency", "16") == 0
    assert json.loads(out.read_text())["complete"] is True

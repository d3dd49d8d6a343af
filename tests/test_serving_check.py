"""serving.python: how it resolves to an interpreter, and the check that it imports vLLM (on CPU, no vLLM needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from predict.cli import main
from predict.config import load_config
from predict.serving.interpreter import ServingPythonError, check_serving_python, resolve_serving_python
from predict.serving.server import default_python

REPO = Path(__file__).resolve().parents[1]


def fake_python(path: Path, body: str) -> Path:
    """An executable standing in for an interpreter: a shell script that ignores its arguments."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def vllm_ok(version: str = "0.33.0") -> str:
    # What the real probe prints after importing vllm; the PYTHONPATH check shows the server's env is used.
    return f'[ -z "$PYTHONPATH" ] || exit 7\necho "INFO some vllm log line"\nprintf "predict-probe\\t{version}\\t$0\\n"'


def test_null_means_the_servers_default_interpreter():
    assert resolve_serving_python(None, "gpu") == str(Path(sys.executable).absolute())
    assert resolve_serving_python(None, "cpu") == str(Path(default_python("cpu")).absolute())


def test_relative_path_resolves_against_the_working_directory(tmp_path, monkeypatch):
    py = fake_python(tmp_path / ".venv-vllm" / "bin" / "python", vllm_ok())
    monkeypatch.chdir(tmp_path)
    assert resolve_serving_python(".venv-vllm/bin/python") == str(py)


def test_a_bare_name_is_looked_up_on_path(tmp_path, monkeypatch):
    py = fake_python(tmp_path / "bin" / "python-vllm", vllm_ok())
    monkeypatch.setenv("PATH", f"{py.parent}{os.pathsep}{os.environ['PATH']}")
    assert resolve_serving_python("python-vllm") == str(py)
    with pytest.raises(ServingPythonError, match=r"serving.python: 'no-such-python-here': no command"):
        resolve_serving_python("no-such-python-here")


def test_missing_interpreter_names_the_key_the_path_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ServingPythonError) as e:
        check_serving_python(".venv-vllm/bin/python", "gpu")
    msg = str(e.value)
    assert "serving.python: '.venv-vllm/bin/python'" in msg
    assert str(tmp_path / ".venv-vllm" / "bin" / "python") in msg
    assert "PREDICT_VLLM=gpu bash envs/install.sh" in msg


def test_an_interpreter_without_vllm_fails_before_any_job(monkeypatch):
    # The pipeline's own interpreter is what `serving.python: null` used to mean on a GPU node.
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vLLM")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")  # must not leak into the probe (it would not help anyway)
    with pytest.raises(ServingPythonError) as e:
        check_serving_python(None, "gpu")
    msg = str(e.value)
    assert "serving.python: null" in msg
    assert str(Path(sys.executable).absolute()) in msg
    assert "No module named 'vllm'" in msg


def test_an_interpreter_that_imports_vllm_passes_and_is_recorded(tmp_path, monkeypatch):
    py = fake_python(tmp_path / "venv" / "bin" / "python", vllm_ok("0.33.0"))
    monkeypatch.setenv("PYTHONPATH", "/must/not/leak")
    result = check_serving_python(str(py), "gpu")
    assert result["interpreter"] == str(py)
    assert result["vllm_version"] == "0.33.0"
    assert result["serving.python"] == str(py)


def test_a_failing_import_reports_its_last_line(tmp_path):
    py = fake_python(tmp_path / "python", 'echo "Traceback ..." >&2\necho "ImportError: libcuda.so.1: cannot open" >&2\nexit 1')
    with pytest.raises(ServingPythonError, match=r"cannot import vllm \(ImportError: libcuda.so.1: cannot open\)"):
        check_serving_python(str(py))


def test_cli_check_serving_on_the_paper_config(tmp_path, monkeypatch, capsys):
    """config/config.yaml as shipped: fails in one line without .venv-vllm, passes (and records) with one."""
    paper = REPO / "config" / "config.yaml"
    assert load_config(paper)["serving"]["python"] == ".venv-vllm/bin/python"
    monkeypatch.chdir(tmp_path)
    assert main(["check-serving", "--config", str(paper)]) == 2
    err = capsys.readouterr().err
    assert "serving.python: '.venv-vllm/bin/python'" in " ".join(err.split())

    fake_python(tmp_path / ".venv-vllm" / "bin" / "python", vllm_ok("0.33.0"))
    out = tmp_path / "serving" / "check.json"
    assert main(["check-serving", "--config", str(paper), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["interpreter"] == str(tmp_path / ".venv-vllm" / "bin" / "python")
    assert record["vllm_version"] == "0.33.0" and record["device"] == "gpu"


def test_paper_and_local_configs_resolve_to_the_repos_vllm_env(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("config.yaml", "local.yaml"):
        value = load_config(REPO / "config" / name)["serving"]["python"]
        assert Path(value) == Path(".venv-vllm/bin/python")
        if (REPO / value).exists():
            assert resolve_serving_python(value) == str(REPO / value)

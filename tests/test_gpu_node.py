"""The one-node GPU path, checked on the CPU where its code can be reached: the memory arithmetic that sizes a
colocated vLLM server, the flags every GPU server starts with, the order of sleep / update / wake-up / weight sync
in an RL step (against a recording stand-in server), the GPU configs and their profile, and the tiny builder's
released shapes. What ran on the GPU itself: benchmarks/log/gpu.md."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from predict.serving import gpu_memory
from predict.serving.gpu_memory import GIB, ModelShape, colocation_report, server_gpu_args, serving_share
from predict.tiny_model import SHAPES, build_tiny_qwen3

SIZES = {"max_model_len": 4096, "startup_timeout_s": 300}  # VLLMServer takes both from config serving

REPO = Path(__file__).resolve().parents[1]
H100 = 81559 * 2**20  # what NVML reports for an 80 GB H100
H200 = 143771 * 2**20


def _shape(name: str, tied: bool) -> ModelShape:
    return ModelShape.from_config({**SHAPES[name], "vocab_size": 151936, "tie_word_embeddings": tied})


def test_model_shape_counts_the_released_qwen3_4b() -> None:
    shape = _shape("qwen3-4b", tied=True)
    assert shape.parameters == 4_022_468_096  # Qwen3-4B's model card: 4.0B
    assert shape.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2  # K and V, 36 layers, 8 KV heads of 128, bf16
    assert shape.weight_bytes == 2 * shape.parameters
    untied = _shape("qwen3-0.6b", tied=False)
    assert untied.parameters - _shape("qwen3-0.6b", tied=True).parameters == 151936 * 1024  # the lm_head


def test_serving_share_is_weights_plus_kv_for_every_episode_plus_overhead_rounded_up() -> None:
    shape = _shape("qwen3-4b", tied=True)
    need = shape.weight_bytes + shape.kv_bytes_per_token * 6144 * 8 + gpu_memory.SERVER_OVERHEAD_BYTES
    share = serving_share(shape, max_model_len=6144, sequences=8, total_bytes=H100)
    assert share == 0.23 and share * H100 >= need > (share - 0.01) * H100  # config/gpu.yaml's comment says 0.23
    # more episodes in flight, more KV cache; the share never shrinks
    assert serving_share(shape, max_model_len=6144, sequences=16, total_bytes=H100) > share
    assert "fits" in colocation_report(shape, share, H100)  # 37.5 GiB of trainer state beside it on an H100
    assert "does NOT fit" in colocation_report(shape, 0.55, H100)


def test_a_server_that_cannot_fit_the_gpu_is_refused_naming_the_knobs() -> None:
    with pytest.raises(ValueError, match="env.concurrency or serving.max_model_len"):
        serving_share(_shape("qwen3-4b", tied=True), max_model_len=8192, sequences=64, total_bytes=H100)


def _folder(tmp_path: Path, name: str = "qwen3-4b") -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**SHAPES[name], "vocab_size": 151936, "tie_word_embeddings": True}))
    return d


def test_gpu_servers_start_with_the_derived_share_and_sleep_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _folder(tmp_path)
    from predict.config.models import ServingSettings

    serving = ServingSettings(device="gpu", max_model_len=6144)
    monkeypatch.setattr(gpu_memory, "gpu_total_bytes", lambda: H100)
    assert server_gpu_args(serving, model, sequences=8) == ["--gpu-memory-utilization", "0.23", "--enable-sleep-mode"]
    # the config's share wins; the CPU gets none of it
    assert server_gpu_args(serving.model_copy(update={"gpu_memory_utilization": 0.3}), model, sequences=8)[1] == "0.30"
    assert server_gpu_args(ServingSettings(device="cpu", max_model_len=4096), model, sequences=8) == []
    monkeypatch.setattr(gpu_memory, "gpu_total_bytes", lambda: None)
    with pytest.raises(ValueError, match="set serving.gpu_memory_utilization"):
        server_gpu_args(serving, model, sequences=8)
    # a Hub id has no config.json to derive from
    monkeypatch.setattr(gpu_memory, "gpu_total_bytes", lambda: H100)
    with pytest.raises(ValueError, match="set serving.gpu_memory_utilization"):
        server_gpu_args(serving, "Qwen/Qwen3-4B-Base", sequences=8)


def test_every_job_of_a_run_asks_for_the_same_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags depend on the serving section, the model's shape and env.concurrency only, so a shared server's key
    (predict.serving.server.SharedServer.key) is equal for rollouts, evaluation and RL."""
    from predict.serving.server import VLLMServer

    monkeypatch.setattr(gpu_memory, "gpu_total_bytes", lambda: H200)
    serving = {"device": "gpu", "python": sys.executable, "max_model_len": 4096, "startup_timeout_s": 60,
               "shared": {"idle_s": 60}}
    leases = [VLLMServer.from_serving(_folder(tmp_path / str(i)) if i else _folder(tmp_path), serving, sequences=8,
                                      cache_dir=tmp_path / "c", **kw)
              for i, kw in enumerate([{}, {"log_path": tmp_path / "x.log"}])]
    assert leases[0].server.extra_args == leases[1].server.extra_args
    assert leases[0].sleep_mode


class RecordingServer:
    """A server in sleep mode that records what it is asked (VLLMServer's sleep/wake_up interface)."""

    sleep_mode = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self, level: int = 2) -> bool:
        self.calls.append(f"sleep {level}")
        return True

    def wake_up(self, tags: tuple[str, ...] | None = None) -> bool:
        self.calls.append(" ".join(["wake_up", *(tags or ())]))
        return True


def test_the_update_runs_while_the_server_sleeps_and_the_sync_loads_its_weights_before_its_kv_cache_wakes() -> None:
    from predict.train.driver import TrainingRun

    server = RecordingServer()
    with TrainingRun.update_window(server) as window:
        server.calls.append("update")
        window.sync(lambda drain: server.calls.append(f"push drain={drain}"))
    # no pause, prefix-cache reset or resume: the engine schedules nothing while its KV cache sleeps
    assert window.slept and server.calls == ["sleep 2", "update", "wake_up weights", "push drain=False",
                                             "wake_up kv_cache"]
    # a failed update still wakes the server, whole (the next lease or step needs it)
    server.calls.clear()
    with pytest.raises(RuntimeError), TrainingRun.update_window(server):
        raise RuntimeError("out of memory")
    assert server.calls == ["sleep 2", "wake_up"]
    # a refused handoff after the weights woke: the KV cache still wakes, the weights are not woken twice
    server.calls.clear()
    with pytest.raises(RuntimeError), TrainingRun.update_window(server) as window:
        window.sync(lambda drain: (_ for _ in ()).throw(RuntimeError("weight handoff refused")))
    assert server.calls == ["sleep 2", "wake_up weights", "wake_up kv_cache"]
    # the CPU, a server without sleep mode, or none: nothing sleeps and the sync drains
    for quiet in (None, type("Awake", (), {"sleep_mode": False})()):
        pushed: list[bool] = []
        with TrainingRun.update_window(quiet) as window:
            window.sync(pushed.append)
        assert not window.slept and pushed == [True]


def test_the_gpu_configs_validate_and_the_profile_plans_the_slice() -> None:
    predict = [sys.executable, "-c", "import sys; from predict.cli import main; sys.exit(main())"]
    out = subprocess.run([*predict, "check-config", "config/gpu-slice.yaml", "config/config.yaml+config/gpu.yaml"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # an overlay is checked as the profile merges it: a bad key in it is named with the files
    bad = subprocess.run([*predict, "check-config", "config/config.yaml+tests/data/bad_gpu_overlay.yaml"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "config/config.yaml+tests/data/bad_gpu_overlay.yaml: serving.gpu_memory_utilization" in bad.stdout + bad.stderr
    snakemake = Path(sys.executable).with_name("snakemake")
    plan = subprocess.run([str(snakemake), "--profile", "workflow/profiles/gpu", "--configfile", "config/gpu-slice.yaml",
                           "-n", "all"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    counts = {line.split()[0]: int(line.split()[1]) for line in plan.stdout.splitlines()
              if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert counts["train_sft"] == 2 and counts["rl"] == 2 and counts["evaluate_test_A"] == 1  # both arms, no extras


def test_the_tiny_builder_writes_a_released_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import predict.tiny_model as tiny

    # the weights of 0.75B parameters take a minute: the config and the tensor list are what is checked here
    written: dict[str, tuple[int, ...]] = {}
    monkeypatch.setattr(tiny, "_init_tensor", lambda name, shape, kind, seed, std: np.zeros((1,), np.float32))
    monkeypatch.setattr(tiny, "_save_safetensors", lambda tensors, path, dtype: path.write_bytes(b""))
    real_shapes = tiny.tensor_shapes
    monkeypatch.setattr(tiny, "tensor_shapes", lambda cfg: written.update({k: v[0] for k, v in real_shapes(cfg).items()}) or real_shapes(cfg))
    build_tiny_qwen3(tmp_path / "m", shape="qwen3-0.6b")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert {k: cfg[k] for k in SHAPES["qwen3-0.6b"]} == SHAPES["qwen3-0.6b"]
    assert ModelShape.from_folder(tmp_path / "m").parameters == sum(int(np.prod(s)) for s in written.values())
    assert written["model.layers.27.self_attn.k_proj.weight"] == (8 * 128, 1024)
    with pytest.raises(ValueError, match="model.tiny.shape must be one of"):
        build_tiny_qwen3(tmp_path / "x", shape="qwen3-70b")


def test_the_memory_watch_is_silent_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_memory, "_sampler", lambda: None)
    with gpu_memory.watch_gpu_memory() as watch:
        pass
    assert watch.report() is None
    samples = iter([(10 * GIB, 80 * GIB), (30 * GIB, 80 * GIB), (20 * GIB, 80 * GIB)])
    monkeypatch.setattr(gpu_memory, "_sampler", lambda: lambda: next(samples, (20 * GIB, 80 * GIB)))
    watch = gpu_memory.GpuMemoryWatch(interval_s=0.01).start()
    import time

    time.sleep(0.2)
    watch.stop()
    assert watch.peak_bytes == 30 * GIB and "peak GPU memory: 30.0 of 80 GiB" in (watch.report() or "")


def _vllm_package(root: Path, cli_args: str) -> str:
    """An interpreter whose `vllm` is a stand-in package with this cli_args.py (as vLLM's command-line module)."""
    pkg = root / "site" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    (root / "site" / "vllm" / "__init__.py").write_text("")
    (pkg / "cli_args.py").write_text(cli_args)
    python = root / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={root / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_the_scale_out_flag_goes_only_to_a_vllm_that_knows_it(tmp_path: Path) -> None:
    """vLLM 0.26 (the GPU pin) serves /inference/v1/generate without --enable-scale-out and refuses the unknown flag;
    the CPU build (0.32) registers the endpoint only with it."""
    from predict.serving.server import VLLMServer

    old = _vllm_package(tmp_path / "v026", "tokens_only: bool = False\n")
    new = _vllm_package(tmp_path / "v032", "tokens_only: bool = False\nenable_scale_out: bool = False\n")
    model = _folder(tmp_path)
    assert "--enable-scale-out" not in VLLMServer(model, **SIZES, python=old, device="gpu").command()
    assert "--enable-scale-out" in VLLMServer(model, **SIZES, python=new, device="gpu").command()
    # either way the generate endpoint's logprobs get their token field (the train client needs it)
    assert "--middleware" in VLLMServer(model, **SIZES, python=old, device="gpu").command()


@contextlib.contextmanager
def fake_vllm_http(seen: list[str]) -> Iterator[int]:
    """A local HTTP server that records each POST's path (query included) and answers {} (404 for vLLM 0.26's
    missing /update_weight_version); yields its port."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            code, body = (404, b'{"detail": "Not Found"}') if self.path == "/update_weight_version" else (200, b"{}")
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()


def test_a_vllm_without_version_tags_still_takes_the_weights(tmp_path: Path) -> None:
    """vLLM 0.26 has no /update_weight_version: the reload is done all the same and the tag is not asked again."""
    from predict.serving.server import VLLMServer

    seen: list[str] = []
    with fake_vllm_http(seen) as port:
        server = VLLMServer(_folder(tmp_path), **SIZES, device="gpu", port=port, worker_extension=True)
        server.reload_weights(tmp_path, version="1")
        server.reload_weights(tmp_path, version="2")
    assert [path.split("?")[0] for path in seen] == [
        "/pause", "/collective_rpc", "/reset_prefix_cache", "/resume", "/update_weight_version",
        "/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]


def test_a_sync_into_a_sleeping_server_wakes_its_parts_by_tag_and_neither_pauses_nor_resets(tmp_path: Path) -> None:
    """vLLM's sleep paused the scheduler and cleared the prefix cache: the weights wake alone, load with no pause,
    reset or resume, then the KV cache wakes (which resumes scheduling)."""
    from predict.serving.server import VLLMServer

    seen: list[str] = []
    with fake_vllm_http(seen) as port:
        server = VLLMServer(_folder(tmp_path), **SIZES, device="gpu", port=port, worker_extension=True,
                            extra_args=["--enable-sleep-mode"])
        server.wake_up(("weights",))
        server.push_weights({"tensors": [], "buffers": []}, drain=False)
        server.reload_weights(tmp_path, drain=False)
        server.wake_up(("kv_cache",))
    assert seen == ["/wake_up?tags=weights", "/collective_rpc", "/collective_rpc", "/wake_up?tags=kv_cache"]

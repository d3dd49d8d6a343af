"""The serving package's commands: `predict check-serving` (does ``serving.python`` import vLLM?
`predict.serving.interpreter`) and `predict serve` (serve a checkpoint in the foreground, or stop the shared server:
``--stop-shared``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from predict.config import config_default
from predict.config.models import ServingSettings
from predict.serving.interpreter import check_serving_python
from predict.serving.server import VLLMServer, stop_shared_server

if TYPE_CHECKING:
    from predict.stages import StageSettings


# `predict check-serving`
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long the import may take")
    p.add_argument("--out", default=None, help="write what was checked here (json)")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console, write_json

    result = check_serving_python(config.serving.python, config.serving.device, timeout_s=args.timeout_s)
    if args.out:
        write_json(result, args.out)
    console.print(
        f"[green]ok[/green] serving.python ({result['serving.python']}) = {result['interpreter']}: "
        f"vllm {result['vllm_version']} imports ({result['import_s']:.1f} s)"
    )
    return 0


# `predict serve` (no stage of the workflow: the CLI hands it everything after the word)
def serve_main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until Ctrl-C/SIGTERM (for the ``predict`` CLI to wire)."""
    ap = argparse.ArgumentParser(prog="predict serve", description="Serve a checkpoint with vLLM on 127.0.0.1.")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--stop-shared", action="store_true",
                    help="stop the server the jobs of a local run share (config serving.shared) and exit")
    ap.add_argument("--python", default=None, help="interpreter with vLLM (config serving.python)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--max-model-len", type=int, default=config_default(ServingSettings, "max_model_len"),
                    help="vLLM context length (default: config serving.max_model_len's)")
    ap.add_argument("--startup-timeout-s", type=float, default=config_default(ServingSettings, "startup_timeout_s"),
                    help="seconds the server may take to start (default: config serving.startup_timeout_s's)")
    ap.add_argument("--log-path", type=Path, default=None)
    ap.add_argument("--worker-extension", action="store_true")
    ap.add_argument("extra_args", nargs="*", metavar="extra", help="extra vLLM arguments (after --)")
    kw = vars(ap.parse_args(argv))  # every option but --stop-shared is a VLLMServer argument of the same name
    if kw.pop("stop_shared"):
        print(stop_shared_server(), flush=True)
        return 0
    if kw["model"] is None:
        ap.error("a model folder (or --stop-shared) is required")
    with VLLMServer(**kw) as srv:
        print(
            f"serving {srv.model_name} at {srv.base_url} (pid {srv.pid}, log {srv.log_path}, "
            f"healthy in {srv.startup_s:.1f} s)",
            flush=True,
        )
        try:
            while srv.running:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(serve_main())

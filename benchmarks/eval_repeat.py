"""What repeatable evaluation costs, and whether it repeats: one checkpoint's greedy evaluation at two concurrencies,
on fresh servers, side by side.

CPU (the local config, vLLM's CPU build): the CPU build has no batch-invariant kernels, so
`predict.serving.identity.evaluation_concurrency` sends one request at a time; this measures that price:

    .venv/bin/python benchmarks/eval_repeat.py --concurrency 4 1 --repeats 2 --out benchmarks/eval_repeat_cpu.json

GPU (vLLM's GPU build): evaluation serves batch-invariant (``VLLM_BATCH_INVARIANT=1``, config
``serving.batch_invariant``) and keeps ``env.concurrency`` in flight. ``--modes invariant default`` runs the
evaluation on ``--servers`` fresh batch-invariant servers, then on a server without batch invariance, each at every
``--concurrency`` on the first server and the first concurrency on the next; rows must be identical across servers and
concurrencies in the invariant mode, and the wall times give the price of batch invariance. ``--every-concurrency``
runs every concurrency on every fresh server, so fresh servers are compared at each (the issue 59 check: 3 servers,
16 and 64 in flight):

    python benchmarks/eval_repeat.py --config config/gpu-slice.yaml --model results/checkpoints/A/sft \
        --tasks 16 --concurrency 16 1 --servers 2 --modes invariant default --out benchmarks/eval_repeat_h200.json
    python benchmarks/eval_repeat.py --config config/gpu-slice.yaml --model results/models/tiny \
        --tasks 16 --concurrency 16 64 --servers 3 --every-concurrency --modes invariant --out benchmarks/eval_repeat_<card>_tiny.json

The JSON names what ran: the model's path, shape and parameter count (its config.json), the card, the command.

Per run: wall time, and how many tasks' rows differ from the first run of the mode (times and ids left out). Every
run is preceded on its server by one warm-up batch (first requests compile and warm caches).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODE_ENV = {"invariant": {"VLLM_BATCH_INVARIANT": "1"}, "default": {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "config" / "local.yaml"))
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the tiny Qwen3)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 1], help="first: today's env.concurrency")
    ap.add_argument("--repeats", type=int, default=2, help="runs per concurrency on each server")
    ap.add_argument("--servers", type=int, default=1, help="fresh servers per mode (GPU: the rows must not differ)")
    ap.add_argument("--modes", nargs="+", choices=sorted(MODE_ENV), default=None,
                    help="GPU: batch-invariant and/or default serving (default: what the config serves)")
    ap.add_argument("--tasks", type=int, default=None, help="val tasks (default: the config's evaluation.tasks)")
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="serve without CUDA graphs and torch.compile (is a fresh server's difference theirs?)")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="vLLM's --max-num-seqs: at most this many sequences in one engine step "
                         "(benchmarks/log/gpu.md: do the co-resident sequences decide whether fresh servers give "
                         "the same rows?)")
    ap.add_argument("--every-concurrency", action="store_true",
                    help="every fresh server runs every --concurrency (default: servers after the first run the first)")
    args = ap.parse_args()

    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.config import load_config
    from predict.data import load_mbpp, split_tasks
    from predict.env.records import PER_RUN_COLUMNS as PER_RUN  # times and a random id
    from predict.env.runner import RolloutSettings, run_rollouts_sync
    from predict.serving.identity import evaluation_environment, serving_identity
    from predict.serving.server import SERVED_NAME, VLLMServer, default_cache_dir
    from predict.stages import EPISODE_VIEW, stage_settings
    from predict.tiny_model import cached_tiny_qwen3

    vf_subprocess.CACHE_DIR = Path(tempfile.mkdtemp(prefix="bench-verifiers-"))
    config = load_config(args.config)
    data, ev, serving = config["data"], config["evaluation"], {**config["serving"], "shared": None}
    val = sorted(split_tasks(load_mbpp(data["mbpp_path"], hf_fallback=data["hf_fallback"]), int(data["split_seed"]), data["sizes"])["val"],
                 key=lambda r: r["task_id"])
    tasks = [{**r, "split": "val"} for r in val[: args.tasks or ev["tasks"] or len(val)]]
    model = args.model or cached_tiny_qwen3(default_cache_dir() / "models", seed=0)
    modes = args.modes or ["config"]
    if args.modes and serving["device"] != "gpu":
        raise SystemExit("--modes needs a GPU config (the CPU build has no batch-invariant kernels)")
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "what": f"greedy val evaluation of {model}, Arm A, {len(tasks)} tasks, side by side",
        "command": " ".join(["python", "benchmarks/eval_repeat.py", *sys.argv[1:]]),
        "model": model_identity(Path(model)),
        "serving": serving_identity(serving, concurrency=max(args.concurrency)),
        "tasks": len(tasks),
        "max_tokens": ev["max_tokens"],
        "enforce_eager": args.enforce_eager,
        "max_num_seqs": args.max_num_seqs,
        "modes": {},
    }
    result["card"] = result["serving"]["device_name"]  # serving_identity's (nvidia-smi), named at the top for readers

    def settings(base_url: str, concurrency: int, checkpoint: str) -> RolloutSettings:
        return RolloutSettings.from_study_config(
            stage_settings(EPISODE_VIEW, config),
            arm="A", seed=1, checkpoint=checkpoint, base_url=base_url, model=SERVED_NAME,
            temperature=ev["temperature"], max_tokens=ev["max_tokens"], concurrency=concurrency, split="val",
        )

    for mode in modes:
        env = evaluation_environment(serving) if mode == "config" else MODE_ENV[mode]
        runs: list[dict] = []
        starts = []
        for server in range(args.servers):
            t0 = time.perf_counter()
            with VLLMServer.from_serving(model, serving, sequences=max(args.concurrency), served_model_name=SERVED_NAME,
                                         env=env, **({"enforce_eager": True} if args.enforce_eager else {}),
                                         extra_args=[] if args.max_num_seqs is None else
                                         ["--max-num-seqs", str(args.max_num_seqs)]) as srv:
                starts.append(time.perf_counter() - t0)
                run_rollouts_sync(tasks, settings(srv.base_url, max(args.concurrency), "warm-up"))
                for repeat in range(args.repeats):
                    on_this_server = args.concurrency if server == 0 or args.every_concurrency else args.concurrency[:1]
                    for c in on_this_server:
                        t = time.perf_counter()
                        rows = run_rollouts_sync(tasks, settings(srv.base_url, c, "base"))
                        wall = time.perf_counter() - t
                        rows = [{k: v for k, v in r.items() if k not in PER_RUN} for r in rows]
                        runs.append({"server": server, "repeat": repeat, "concurrency": c, "wall_s": wall, "rows": rows})
                        print(f"{mode}: server {server}, repeat {repeat}, concurrency {c}: {wall:.1f} s, "
                              f"{sum(r['n_model_calls'] for r in rows)} calls", flush=True)
        first = runs[0]["rows"]
        by_concurrency = {}
        for c in args.concurrency:
            mine = [r for r in runs if r["concurrency"] == c]
            by_concurrency[str(c)] = {
                "concurrency": c,
                "wall_s": [round(r["wall_s"], 2) for r in mine],
                "mean_wall_s": round(sum(r["wall_s"] for r in mine) / len(mine), 2),
            }
        differ = [sum(a != b for a, b in zip(first, r["rows"], strict=True)) for r in runs[1:]]
        result["modes"][mode] = {
            "env": env,
            "server_start_s": [round(s, 1) for s in starts],
            "settings": by_concurrency,
            "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs],
            "tasks_whose_rows_differ_from_the_first_run": differ,
            "repeats": all(n == 0 for n in differ),
        }
    if "invariant" in result["modes"] and "default" in result["modes"]:
        inv, dflt = result["modes"]["invariant"]["settings"], result["modes"]["default"]["settings"]
        result["price_of_batch_invariance"] = {c: round(inv[c]["mean_wall_s"] / dflt[c]["mean_wall_s"], 2) for c in inv}
    print(json.dumps({k: v for k, v in result.items() if k != "modes"}, indent=1))
    for mode, r in result["modes"].items():
        print(f"{mode}: repeats {r['repeats']} (rows differing from the first run: {r['tasks_whose_rows_differ_from_the_first_run']}); "
              + ", ".join(f"concurrency {c}: {s['mean_wall_s']} s" for c, s in r["settings"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def model_identity(folder: Path) -> dict:
    """What a JSON reader needs to know which model ran: its folder, its shape from config.json and its parameters."""
    import json as _json

    from predict.serving.gpu_memory import ModelShape

    hf = _json.loads((folder / "config.json").read_text())
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "torch_dtype")
    return {"path": str(folder), "shape": {k: hf.get(k) for k in keys},
            "parameters": ModelShape.from_config(hf).parameters}


if __name__ == "__main__":
    sys.exit(main())

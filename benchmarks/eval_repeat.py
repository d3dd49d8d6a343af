"""What repeatable evaluation costs, and whether it repeats: one checkpoint's greedy evaluation at two concurrencies,
on fresh servers, side by side.

CPU (the local config, vLLM's CPU build): the CPU build has no batch-invariant kernels, so
`predict.serving.identity.evaluation_concurrency` sends one request at a time; this measures that price:

    .venv/bin/python benchmarks/eval_repeat.py --concurrency 4 1 --repeats 2 --out benchmarks/eval_repeat_cpu.json

GPU (vLLM's GPU build): evaluation serves batch-invariant (``VLLM_BATCH_INVARIANT=1``, config
``serving.batch_invariant``) on the config's attention kernels (``serving.evaluation_attention_backend``) and keeps
``env.concurrency`` in flight. ``--modes invariant default`` runs the evaluation on ``--servers`` fresh batch-invariant
servers (the config's attention kernels), then on ``--default-servers`` servers as vLLM serves by default (no batch
invariance, vLLM's kernels), each at every ``--concurrency`` on the first server and the first concurrency on the
next; rows must be identical across servers and concurrencies in the invariant mode, and the wall times give the
price. ``--every-concurrency`` runs every concurrency on every fresh server (the issue 59 check; docs/repeatability.md):

    python benchmarks/eval_repeat.py --config config/gpu-slice.yaml --tasks 50 --concurrency 16 64 --servers 3 \
        --every-concurrency --modes invariant default --default-servers 1 --server-logs logs/eval_repeat \
        --out benchmarks/eval_repeat_<card>_tiny.json

The JSON names what ran: the model's path, shape and parameter count (its config.json), the card, the command.

The ``--out`` JSON is written after every run, ``"complete": false`` until the last: a slot that ends mid-check
keeps the numbers of every run it finished.

Per run: wall time, and how many tasks' rows differ from the first run of the mode (times and ids left out), with
where each first differs (`first_differences`: a row's path such as ``steps[2].reply@17``, the trajectory first, a text's first
differing character after the @) and how many tasks' outcomes differ. Every run is preceded on
its server by one warm-up batch (first requests compile and warm caches).

Finding what makes fresh servers differ (issue 59): ``--server-arg`` and ``--server-env`` add vLLM flags and
environment to every server, ``--no-sleep-mode`` leaves out the sleep mode evaluation does not use, and ``--rows-out``
writes every run's rows (JSON lines) so that runs of separate processes, such as servers started side by side on one
card, can be compared: ``python benchmarks/eval_repeat.py --compare A.jsonl B.jsonl ...`` (each file's first run
against the first file's).

The compile cache (issue 59, 2026-12-06: on the tiny Qwen3 a server that compiled its graphs on an empty cache gave
other rows than two that loaded them): every server's ``compile`` says which it did, read from its log
(`predict.serving.identity.compile_cache_use`). ``--compile-cache shared`` (default) lets the servers share the
project's vLLM cache, as a node's jobs do, so the first server of a new shape compiles and the next load;
``--compile-cache fresh`` gives each server empty caches of its own (vLLM's, and Inductor's and Triton's, which
otherwise live in /tmp and ~/.triton and let a later server reuse an earlier one's kernels: 2026-12-07, a "fresh"
server compiled in 1.1 s after one that took 11.4 s), so every server compiles on its own, as on a new node.

Batch-invariant servers compile deterministically, as evaluation's do (`predict.serving.identity.
DETERMINISTIC_COMPILE_ENV` and ``_ARGS``: no kernel chosen by timing it on the card). ``--timed-compile`` leaves that
out, as evaluation served before issue 59's fix: Inductor and vLLM pick kernels by timing, and compiles can differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODE_INVARIANT = {"invariant": True, "default": False}  # serving.batch_invariant per --modes mode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "config" / "local.yaml"))
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the tiny Qwen3)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 1], help="first: today's env.concurrency")
    ap.add_argument("--repeats", type=int, default=2, help="runs per concurrency on each server")
    ap.add_argument("--servers", type=int, default=1, help="fresh servers per mode (GPU: the rows must not differ)")
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=sorted(MODE_INVARIANT),
        default=None,
        help="GPU: batch-invariant and/or default serving (default: what the config serves)",
    )
    ap.add_argument("--tasks", type=int, default=None, help="val tasks (default: the config's evaluation.tasks)")
    ap.add_argument(
        "--out",
        default=None,
        help="also write the numbers as JSON here, after every run (complete: false until the run ends)",
    )
    ap.add_argument(
        "--enforce-eager",
        action="store_true",
        help="serve without CUDA graphs and torch.compile (is a fresh server's difference theirs?)",
    )
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="vLLM's --max-num-seqs: at most this many sequences in one engine step "
        "(benchmarks/log/gpu.md: do the co-resident sequences decide whether fresh servers give "
        "the same rows?)",
    )
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a vLLM flag for every server, repeatable; flags that start with -- as --server-arg=--flag",
    )
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for every server, repeatable",
    )
    ap.add_argument(
        "--no-sleep-mode",
        action="store_true",
        help="start the servers without --enable-sleep-mode (its memory pool: a cause of differences?)",
    )
    ap.add_argument(
        "--default-servers",
        type=int,
        default=None,
        help="fresh servers in the default mode (default: --servers; one is enough for the price)",
    )
    ap.add_argument("--server-logs", default=None, help="keep every server's log in this folder")
    ap.add_argument("--rows-out", default=None, help="also write every run's rows here, JSON lines")
    ap.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="ROWS",
        help="compare --rows-out files (their first runs) and exit; nothing is served",
    )
    ap.add_argument(
        "--every-concurrency",
        action="store_true",
        help="every fresh server runs every --concurrency (default: servers after the first run the first)",
    )
    ap.add_argument(
        "--evaluation-attention-backend",
        default=None,
        metavar="NAME",
        help="serving.evaluation_attention_backend for this run (the batch-invariant servers' kernels, e.g. "
        "TRITON_ATTN), as if the config set it; default servers keep vLLM's choice, so the price compares the two",
    )
    ap.add_argument(
        "--timed-compile",
        action="store_true",
        help="batch-invariant servers compile without the deterministic compile evaluation's servers have (Inductor "
        "and vLLM pick kernels by timing them), as before issue 59's fix",
    )
    ap.add_argument(
        "--compile-cache",
        choices=("shared", "fresh"),
        default="shared",
        help="shared: the servers share the project's vLLM compile cache (the first of a new shape compiles, the "
        "next load); fresh: each server compiles on an empty cache of its own, as on a new node",
    )
    args = ap.parse_args()
    if args.compare:
        return compare_files([Path(f) for f in args.compare])
    server_env = dict(_key_value(kv) for kv in args.server_env)
    if args.rows_out:  # this run's rows alone: --compare reads a file's first line
        Path(args.rows_out).write_text("")

    import verifiers.v1.runtimes.subprocess as vf_subprocess

    from predict.config import load_config
    from predict.data import load_mbpp, split_tasks
    from predict.env.records import PER_RUN_COLUMNS as PER_RUN  # times and a random id
    from predict.env.runner import RolloutSettings, run_rollouts_sync
    from predict.serving.identity import (
        DETERMINISTIC_COMPILE_ARGS,
        DETERMINISTIC_COMPILE_ENV,
        compile_cache_use,
        evaluation_server,
        serving_identity,
    )
    from predict.serving.server import SERVED_NAME, VLLMServer, default_cache_dir
    from predict.stages import EPISODE_VIEW, stage_settings
    from predict.tiny_model import cached_tiny_qwen3

    vf_subprocess.CACHE_DIR = Path(tempfile.mkdtemp(prefix="bench-verifiers-"))
    config = load_config(args.config)
    data, ev, serving = config["data"], config["evaluation"], {**config["serving"], "shared": None}
    if args.evaluation_attention_backend:
        serving["evaluation_attention_backend"] = args.evaluation_attention_backend
    val = sorted(
        split_tasks(
            load_mbpp(data["mbpp_path"], hf_fallback=data["hf_fallback"]), int(data["split_seed"]), data["sizes"]
        )["val"],
        key=lambda r: r["task_id"],
    )
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
        "server_args": args.server_arg,
        "server_env": server_env,
        "sleep_mode": not args.no_sleep_mode,
        "compile_cache": args.compile_cache,
        "timed_compile": args.timed_compile,
        "modes": {},
    }
    result["card"] = result["serving"]["device_name"]  # serving_identity's (nvidia-smi), named at the top for readers

    def settings(base_url: str, concurrency: int, checkpoint: str) -> RolloutSettings:
        return RolloutSettings.from_study_config(
            stage_settings(EPISODE_VIEW, config),
            arm="A",
            seed=1,
            checkpoint=checkpoint,
            base_url=base_url,
            model=SERVED_NAME,
            temperature=ev["temperature"],
            max_tokens=ev["max_tokens"],
            concurrency=concurrency,
            split="val",
        )

    for mode in modes:
        # the project's evaluation server: as the config has it, or with batch invariance (and so the configured
        # attention kernels) on or off
        started = evaluation_server(
            serving if mode == "config" else {**serving, "batch_invariant": MODE_INVARIANT[mode]}
        )
        env, server_args = started["env"], started["extra_args"]
        if args.timed_compile:
            env = {k: v for k, v in env.items() if k not in DETERMINISTIC_COMPILE_ENV}
            server_args = [a for a in server_args if a not in DETERMINISTIC_COMPILE_ARGS]
        runs: list[dict] = []
        failed: list[str] = []  # rollouts that failed or made no model call: a broken server, not a result
        starts = []
        compiled: list[str] = []  # per server: its graphs compiled, or loaded from the compile cache
        n_servers = args.default_servers if mode == "default" and args.default_servers else args.servers
        for server in range(n_servers):
            t0 = time.perf_counter()
            extra = [
                *([] if args.max_num_seqs is None else ["--max-num-seqs", str(args.max_num_seqs)]),
                *server_args,
                *args.server_arg,
            ]
            own_cache = Path(tempfile.mkdtemp(prefix="eval-repeat-cache-")) if args.compile_cache == "fresh" else None
            srv = VLLMServer.from_serving(
                model,
                serving,
                sequences=max(args.concurrency),
                served_model_name=SERVED_NAME,
                env={**env, **fresh_caches(own_cache), **server_env},
                extra_args=extra,
                log_path=Path(args.server_logs) / f"{mode}-server{server}.log" if args.server_logs else None,
                **({"enforce_eager": True} if args.enforce_eager else {}),
                **({"cache_dir": own_cache} if own_cache else {}),
            )
            if args.no_sleep_mode and "--enable-sleep-mode" in srv.extra_args:
                srv.extra_args.remove("--enable-sleep-mode")
            with srv:
                starts.append(time.perf_counter() - t0)
                run_rollouts_sync(tasks, settings(srv.base_url, max(args.concurrency), "warm-up"))
                for repeat in range(args.repeats):
                    on_this_server = args.concurrency if server == 0 or args.every_concurrency else args.concurrency[:1]
                    for c in on_this_server:
                        t = time.perf_counter()
                        rows = run_rollouts_sync(tasks, settings(srv.base_url, c, "base"))
                        wall = time.perf_counter() - t
                        rows = [{k: v for k, v in r.items() if k not in PER_RUN} for r in rows]
                        failed.extend(
                            f"{mode} server {server} concurrency {c}: task {r['task_id']}: {r.get('error') or 'no model call'}"
                            for r in rows
                            if not r["ok"] or not r["n_model_calls"]
                        )
                        runs.append(
                            {"server": server, "repeat": repeat, "concurrency": c, "wall_s": wall, "rows": rows}
                        )
                        if args.rows_out:
                            with open(args.rows_out, "a") as out:
                                out.write(json.dumps({"mode": mode, **runs[-1]}) + "\n")
                        if args.out:  # what has run so far: a slot's end or a crash kills the process mid-mode
                            result["modes"][mode] = mode_summary(env, starts, compiled, runs, failed)
                            partial = {**result, "complete": False, **price_of_batch_invariance(result["modes"])}
                            Path(args.out).write_text(json.dumps(partial, indent=1) + "\n")
                        print(
                            f"{mode}: server {server}, repeat {repeat}, concurrency {c}: {wall:.1f} s, "
                            f"{sum(r['n_model_calls'] for r in rows)} calls",
                            flush=True,
                        )
            compiled.append(compile_cache_use(srv.log_path.read_text(errors="replace") if srv.log_path else ""))
        result["modes"][mode] = mode_summary(env, starts, compiled, runs, failed)
    result["complete"] = True
    result.update(price_of_batch_invariance(result["modes"]))
    print(json.dumps({k: v for k, v in result.items() if k != "modes"}, indent=1))
    for mode, r in result["modes"].items():
        print(
            f"{mode}: repeats {r['repeats']} (rows differing from the first run: {r['tasks_whose_rows_differ_from_the_first_run']}); "
            + ", ".join(f"concurrency {c}: {s['mean_wall_s']} s" for c, s in r["settings"].items())
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    failures = {m: r["first_failures"] for m, r in result["modes"].items() if r["failed_rollouts"]}
    if failures:  # rows of a broken server say nothing about repeatability (2026-12-06: a 4B run made no call)
        print(f"FAILED rollouts, so these rows measure nothing: {json.dumps(failures, indent=1)}", file=sys.stderr)
        return 1
    return 0


def mode_summary(env: dict, starts: list[float], compiled: list[str], runs: list[dict], failed: list[str]) -> dict:
    """One mode's servers and runs so far: wall times per concurrency, and how many tasks' rows differ from the
    first run's (at the end of the run, or after each run while it goes on)."""
    first = runs[0]["rows"]
    by_concurrency = {}
    for c in dict.fromkeys(r["concurrency"] for r in runs):
        mine = [r for r in runs if r["concurrency"] == c]
        by_concurrency[str(c)] = {
            "concurrency": c,
            "wall_s": [round(r["wall_s"], 2) for r in mine],
            "mean_wall_s": round(sum(r["wall_s"] for r in mine) / len(mine), 2),
        }
    differ = [sum(a != b for a, b in zip(first, r["rows"], strict=True)) for r in runs[1:]]
    where = [differences(first, r["rows"]) for r in runs[1:]]
    return {
        "env": env,
        "server_start_s": [round(s, 1) for s in starts],
        "compile": compiled,
        "settings": by_concurrency,
        "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs],
        "tasks_whose_rows_differ_from_the_first_run": differ,
        "tasks_whose_outcome_differs_from_the_first_run": [w["outcome_differs"] for w in where],
        "first_differences": [w["first"] for w in where],
        "failed_rollouts": len(failed),
        "first_failures": failed[:5],
        "repeats": all(n == 0 for n in differ),
    }


def price_of_batch_invariance(modes: dict) -> dict:
    """The invariant mode's mean wall time over the default's, at each concurrency both have run."""
    if "invariant" not in modes or "default" not in modes:
        return {}
    inv, dflt = modes["invariant"]["settings"], modes["default"]["settings"]
    return {
        "price_of_batch_invariance": {
            c: round(inv[c]["mean_wall_s"] / dflt[c]["mean_wall_s"], 2) for c in inv if c in dflt
        }
    }


TRAJECTORY = ("steps", "tokens")
OUTCOME_COLUMNS = ("final_outcome", "final_pass", "reward", "final_solution", "stop_reason")


def first_difference(a: object, b: object, path: str = "") -> str | None:
    """Where two rows first differ, as a path (``tokens[1].logprobs[7]``), or None where they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        # the trajectory first: a reply that differs changes the counts after it (n_input_tokens, ...)
        for key in sorted(set(a) | set(b), key=lambda k: (k not in a or k not in b, k not in TRAJECTORY, k)):
            found = first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):  # a longer list: .len below
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return f"{path}.len" if len(a) != len(b) else None
    if isinstance(a, str) and isinstance(b, str) and a != b:  # where in the text: the first character that differs
        return f"{path}@{next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))}"
    return None if a == b else path


def differences(first: list[dict], rows: list[dict]) -> dict:
    """Per differing task (by task id): where its row first differs; and how many tasks' outcomes differ."""
    where = {str(a.get("task_id")): first_difference(a, b) for a, b in zip(first, rows, strict=True) if a != b}
    outcome = sum(any(a.get(k) != b.get(k) for k in OUTCOME_COLUMNS) for a, b in zip(first, rows, strict=True))
    return {"first": where, "outcome_differs": outcome}


def compare_files(files: list[Path]) -> int:
    """Each --rows-out file's first run against the first file's: tasks whose rows and outcomes differ, and where."""

    def first_run(f: Path) -> dict:
        with f.open() as fh:
            return json.loads(fh.readline())

    base = first_run(files[0])
    report = {"base": str(files[0]), "against": []}
    for f in files[1:]:
        run = first_run(f)
        d = differences(base["rows"], run["rows"])
        report["against"].append(
            {
                "file": str(f),
                "tasks_whose_rows_differ": len(d["first"]),
                "tasks_whose_outcome_differs": d["outcome_differs"],
                "first_differences": d["first"],
            }
        )
    print(json.dumps(report, indent=1))
    return 0


def fresh_caches(cache_dir: Path | None) -> dict[str, str]:
    """A fresh server's Inductor and Triton caches, in its own folder (None: the defaults a node's jobs share)."""
    if cache_dir is None:
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"), "TRITON_CACHE_DIR": str(cache_dir / "triton")}


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--server-env takes KEY=VALUE, not {text!r}")
    return key, value


def model_identity(folder: Path) -> dict:
    """What a JSON reader needs to know which model ran: its folder, its shape from config.json and its parameters."""
    import json as _json

    from predict.serving.gpu_memory import ModelShape

    hf = _json.loads((folder / "config.json").read_text())
    keys = (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "tie_word_embeddings",
        "torch_dtype",
    )
    return {
        "path": str(folder),
        "shape": {k: hf.get(k) for k in keys},
        "parameters": ModelShape.from_config(hf).parameters,
    }


if __name__ == "__main__":
    sys.exit(main())

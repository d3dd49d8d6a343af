"""The one-node study at the 4B shape (issue 58), rehearsed through Snakemake's gpu profile in commands of at most 10
minutes each, and its numbers collected into ``benchmarks/rehearsal_<card>.json``.

    python benchmarks/rehearsal.py start          # detached (setsid): Snakemake runs on after the command returns
    python benchmarks/rehearsal.py wait --timeout 540   # progress; exit 0 done, 3 still running, 1 failed
    python benchmarks/rehearsal.py collect        # -> benchmarks/rehearsal_<card>.json (whatever has run so far)

``start`` runs, one after another: the RL steps first (``results/rl/{A,B}/seed42``: the model, SFT and RL, the
numbers a slot must not lose), then vLLM alone on the RL step's rollouts (`vllm_alone`: the same tasks, prompts and
reply lengths at several concurrencies with the whole card and no trainer resident; ``--no-vllm-alone`` skips it),
then ``all`` (evaluations, the test campaign, statistics, report). Called again after a kill or a lost machine it
starts again, and Snakemake reruns only what is missing (the profile's rerun-incomplete; a killed RL job resumes from
its last state). Beside the run it samples the results disk's used bytes and the GPU's used memory every 2 s
(``results/rehearsal/samples.tsv``), from which ``collect`` gives each job's disk peak.

``collect`` reads each job's Snakemake benchmark (wall s), its log's last "peak GPU memory" line (the device peak,
every process), the samples, the SFT and RL metrics tables and the evaluation tables: per job the wall time,
tokens/s, device peak GiB and disk peak GB; the RL step split (rollout episodes/s and generated tokens/s, samples,
update and its MFU, sleep + wake, sync, the saves: what the step waited for and what their folders took to write in
the background, per save and spread over the design's save intervals); a serving job's server start or reload (its
log's line); each SFT job's steps (tokens and seconds); vLLM alone beside the RL rollout. ``--results-dir`` and
``--logs-dir`` read a run's folders copied off its node.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config" / "gpu-rehearsal.yaml"
PEAK_FLOPS = 989e12  # bf16 dense, H100 SXM and H200 alike (MFU as docs/training.md counts it)
PEAK_LINE = re.compile(r"peak GPU memory: ([0-9.]+) of ([0-9.]+) GiB on the device")
# A serving job's log says how its lease began (predict.serving.shared): the shared server started for it, or the
# running one reloaded with its checkpoint (the same lines benchmarks/plan_check.py reads on the CPU).
SERVER_LINES = (("start", re.compile(r"started on .*? in ([0-9.]+) s")),
                ("reload", re.compile(r"loaded in place in ([0-9.]+) s")))
GB, GIB = 1e9, 2**30


# the phases `drive` runs, in order; vLLM alone runs no Snakemake
PHASE_ORDER = ("rl", "vllm_alone", "all")


def _state_dir(results: Path) -> Path:
    return results / "rehearsal"


def _load(config: Path) -> dict[str, Any]:
    from predict.config import load_config

    return load_config(config)


# --- start / wait ------------------------------------------------------------------------------------------------
def start(args: argparse.Namespace) -> int:
    results = REPO / _load(args.config)["results_dir"]
    state = _state_dir(results)
    state.mkdir(parents=True, exist_ok=True)
    status = _read(state / "status.json")
    if status.get("pid") and _alive(status["pid"]) and status.get("state") == "running":
        print(f"already running: pid {status['pid']} (python benchmarks/rehearsal.py wait)")
        return 0
    config = args.config
    if args.vllm_python:  # the node's vLLM interpreter: the same config with serving.python pointing at it
        import yaml

        raw = yaml.safe_load(args.config.read_text())
        raw["serving"]["python"] = args.vllm_python
        config = state / "config.yaml"
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cmd = [sys.executable, str(Path(__file__).resolve()), "drive", "--config", str(config)]
    cmd += ["--no-vllm-alone"] if args.no_vllm_alone else []
    log = open(state / "drive.log", "a")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"started pid {proc.pid}: {' '.join(cmd)}; log {state / 'drive.log'}")
    return 0


def drive(args: argparse.Namespace) -> int:
    """The detached driver: the phases one after another, the samples beside them, the status as it goes."""
    config = _load(args.config)
    results = REPO / config["results_dir"]
    state = _state_dir(results)
    stop = threading.Event()
    threading.Thread(target=_sample, args=(results, state / "samples.tsv", stop), daemon=True).start()
    seeds, arms = config["seeds"], sorted(config["arms"])
    rl_targets = [str(results.relative_to(REPO) / "rl" / a / f"seed{s}" / "metrics.parquet") for a in arms for s in seeds]
    # RL first (the numbers a short slot must keep), then vLLM alone on the card the RL phase's shared server left
    # (it stops when Snakemake ends), then the rest of `all`. A phase done before is not run again.
    targets_of = {"rl": rl_targets, "vllm_alone": None, "all": ["all"]}
    phases = [(name, targets_of[name]) for name in PHASE_ORDER]
    rc = 0
    for name, targets in phases:
        if name == "vllm_alone" and (args.no_vllm_alone or (state / "vllm_alone.json").is_file()):
            continue
        _write(state / "status.json", {"pid": os.getpid(), "state": "running", "phase": name, "since": time.time()})
        if targets is None:  # a measurement beside the run: its failure is recorded and the run goes on
            try:
                vllm_alone(config, state / "vllm_alone.json")
                _write(state / f"phase-{name}.json", {"rc": 0, "ended": time.time()})
            except Exception as e:
                _write(state / f"phase-{name}.json", {"rc": 1, "error": repr(e)[-2000:], "ended": time.time()})
            continue
        else:
            cmd = [sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/gpu", "--configfile",
                   str(args.config), "--scheduler", "greedy", *targets]
            with open(state / f"snakemake-{name}.log", "a") as log:
                rc = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        _write(state / f"phase-{name}.json", {"rc": rc, "ended": time.time()})
        if rc:
            break
    stop.set()
    _write(state / "status.json", {"pid": os.getpid(), "state": "failed" if rc else "done", "rc": rc})
    return rc


def wait(args: argparse.Namespace) -> int:
    state = _state_dir(REPO / _load(args.config)["results_dir"])
    deadline = time.monotonic() + args.timeout
    while True:
        status = _read(state / "status.json")
        running = status.get("state") == "running" and _alive(status.get("pid", 0))
        if not running or time.monotonic() > deadline:
            break
        time.sleep(5)
    logs = sorted(state.glob("snakemake-*.log"), key=lambda p: p.stat().st_mtime)
    if logs:
        done = re.findall(r"(\d+) of (\d+) steps \((\d+%)\) done", logs[-1].read_text(errors="replace"))
        print(f"{logs[-1].name}: {'/'.join(done[-1][:2]) + ' jobs' if done else 'no job done yet'}")
    print(json.dumps(status))
    if running:
        return 3
    return 0 if status.get("state") == "done" else 1


def _sample(results: Path, out: Path, stop: threading.Event) -> None:
    from predict.serving.gpu_memory import _sampler

    gpu = _sampler()
    probe = results if results.exists() else REPO
    with open(out, "a") as f:
        while not stop.is_set():
            used_gpu = gpu()[0] if gpu is not None else 0
            f.write(f"{time.time():.1f}\t{shutil.disk_usage(probe).used}\t{used_gpu}\n")
            f.flush()
            stop.wait(2.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    return True


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


# --- vLLM alone ------------------------------------------------------------------------------------------------
def vllm_alone(config: dict[str, Any], out: Path, concurrencies: tuple[int, ...] = (32, 64, 128)) -> int:
    """The RL step's rollouts (Arm A's first step: its 16 tasks x 8, the env's prompts and max_tokens) against vLLM
    alone: one server on Arm A's step-1 checkpoint with the card's default share (0.9), no trainer resident, at each
    concurrency 2 x c episodes of that step's list (at most all 128). Generated tokens/s per concurrency."""
    from predict.data import load_split
    from predict.env.runner import run_rollouts_sync
    from predict.serving.server import SERVED_NAME, VLLMServer
    from predict.train.driver import RLJob, TrainingRun
    from predict.train.rl import step_tasks

    results = REPO / config["results_dir"]
    seed, rl = config["seeds"][0], config["rl"]
    model = results / "rl" / "A" / f"seed{seed}" / f"step{rl['steps']}"
    rows = load_split(results / "data" / "rl.parquet")
    tasks = step_tasks(rows, seed, 1, rl["tasks_per_step"], rl["group_size"])
    serving = {**config["serving"], "shared": None, "gpu_memory_utilization": 0.9}
    numbers: list[dict[str, Any]] = []
    with VLLMServer.from_serving(model, serving, sequences=max(concurrencies), served_model_name=SERVED_NAME,
                                 log_path=out.with_suffix(".vllm.log")) as server:
        for c in concurrencies:
            run = TrainingRun(RLJob(run="A", seed=seed, init=model, tasks=results / "data" / "rl.parquet",
                                    out_dir=out.parent / "vllm_alone"),
                              {**config, "env": {**config["env"], "concurrency": c}}, "rl")
            batch = tasks[: min(len(tasks), 2 * c)]
            t = time.perf_counter()
            records = run_rollouts_sync(batch, run.rollout_settings(server, f"vllm-alone-c{c}"))
            wall = time.perf_counter() - t
            tokens = sum(r.get("n_output_tokens") or 0 for r in records)
            numbers.append({"concurrency": c, "episodes": len(records), "wall_s": wall, "generated_tokens": tokens,
                            "generated_tokens_per_s": tokens / wall, "episodes_per_s": len(records) / wall})
            _write(out, {"model": str(model), "rows": numbers})
    return 0


# --- collect -------------------------------------------------------------------------------------------------------
def _tsv(path: Path) -> dict[str, str]:
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return rows[-1] if rows else {}


def _parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist() if path.is_file() else []


def _samples(path: Path) -> list[tuple[float, int, int]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return out


def _job_work(rel: Path, results: Path, reference: str | None) -> tuple[int | None, str, dict[str, int]]:
    """A job's work, in the units benchmarks/calibrate.py prices it by: the tokens it processed and what they are
    (SFT's trained tokens, RL's generated ones, an evaluation's), and for an evaluation its episodes (its rows) and
    the bytes of its tables."""
    stage = rel.parts[0]
    if stage == "train_sft":
        return sum(r["n_tokens"] for r in _parquet(results / "sft" / rel.stem / "metrics.parquet")), "trained", {}
    if stage == "rl":
        rows = _parquet(results / "rl" / rel.parts[1] / f"{rel.stem}" / "metrics.parquet")
        return sum(r.get("n_output_tokens") or 0 for r in rows), "generated", {}
    if stage == "evaluate":  # evaluate/{run}/val/seed{seed}: every checkpoint of the run
        files = list((results / "eval" / rel.parts[1]).glob(f"*/val/{rel.stem}.parquet"))
    elif stage == "evaluate_test" and rel.stem.startswith("seed"):  # the selected checkpoint(s), the reference apart
        files = [f for f in (results / "eval" / rel.parts[1]).glob(f"*/test/{rel.stem}.parquet") if f.parts[-3] != reference]
    elif stage == "evaluate_test":  # evaluate_test/{run}/{reference}: once, under the first seed
        files = list((results / "eval" / rel.parts[1] / rel.stem / "test").glob("seed*.parquet"))
    else:
        return None, "", {}
    rows = [r for f in files for r in _parquet(f)]
    return (sum(r.get("n_output_tokens") or 0 for r in rows), "generated",
            {"episodes": len(rows), "output_bytes": sum(f.stat().st_size for f in files)})


def jobs(results: Path, logs: Path, reference: str | None = None) -> list[dict[str, Any]]:
    """One row per finished job: its benchmark's wall time, its log's device peak, its disk peak from the samples."""
    samples = _samples(_state_dir(results) / "samples.tsv")
    out = []
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(results / "benchmarks")
        bench = _tsv(tsv)
        if "s" not in bench:
            continue
        wall, end = float(bench["s"]), tsv.stat().st_mtime
        log = logs / rel.with_suffix(".log")
        text = " ".join(log.read_text(errors="replace").split()) if log.is_file() else ""  # rich wraps long lines
        peaks = PEAK_LINE.findall(text)
        server = next(((kind, float(m.group(1))) for kind, line in SERVER_LINES if (m := line.search(text))), None)
        window = [s for s in samples if end - wall - 2 <= s[0] <= end + 2]
        tokens, kind, evaluation = _job_work(rel, results, reference)
        out.append({
            "job": str(rel.with_suffix("")),
            "wall_s": round(wall, 1),
            "tokens": tokens, "tokens_are": kind or None,
            "tokens_per_s": round(tokens / wall, 1) if tokens else None,
            **evaluation,
            "device_peak_gib": float(peaks[-1][0]) if peaks else None,
            "device_gib": float(peaks[-1][1]) if peaks else None,
            "disk_peak_gb": round(max(s[1] for s in window) / GB, 2) if window else None,
            "disk_growth_peak_gb": round((max(s[1] for s in window) - window[0][1]) / GB, 2) if window else None,
            **({"server": server[0], "load_s": server[1]} if server else {}),
        })
    return out


def sft_steps(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Each SFT job's steps as its metrics table has them: tokens, seconds and epoch a step (the warm-up steps apart
    from the steady ones, and an epoch's tokens, are the reader's to take)."""
    return {m.parent.name: [{k: r[k] for k in ("step", "epoch", "n_tokens", "time_s")} for r in _parquet(m)]
            for m in sorted((results / "sft").glob("*/metrics.parquet"))}


def rl_split(results: Path, config: dict[str, Any], design: dict[str, Any], parameters: int) -> list[dict[str, Any]]:
    """The RL step of each run: its parts, MFU and the saves, per save and spread over the design's intervals."""
    out = []
    for metrics in sorted((results / "rl").glob("*/seed*/metrics.parquet")):
        for r in _parquet(metrics):
            step = r.get("step_s") or 0.0
            row = {"run": r["run"], "seed": r["seed"], "step": r["step"], "step_s": step,
                   "rollout_s": r.get("rollout_s"), "episodes": r.get("n_rollouts"),
                   "episodes_per_s": _div(r.get("n_rollouts"), r.get("rollout_s")),
                   "generated_tokens": r.get("n_output_tokens"),
                   "generated_tokens_per_s": _div(r.get("n_output_tokens"), r.get("rollout_s")),
                   "samples_s": r.get("samples_s"), "update_s": r.get("update_s"), "update_tokens": r.get("n_tokens"),
                   "update_mfu": _div(6 * parameters * (r.get("n_tokens") or 0), (r.get("update_s") or 0) * PEAK_FLOPS),
                   "sleep_wake_s": r.get("sleep_s"), "sync_s": r.get("sync_s"), "offload_s": r.get("offload_s"),
                   "save_waited_s": r.get("save_s"), "hf_save_write_s": r.get("checkpoint_write_s"),
                   "state_save_write_s": r.get("state_write_s")}
            every_state, every_ckpt = design["rl"]["state_every"], design["rl"]["checkpoint_every"]
            if step:
                row["shares"] = {k: _div(row[k], step) for k in ("rollout_s", "samples_s", "update_s", "sleep_wake_s",
                                                                  "sync_s", "offload_s")}
                # Spread over the design's intervals: the state every state_every steps, the HF checkpoint every
                # checkpoint_every. In the background the step waits for the copies only (save_waited_s); written in
                # the foreground it would wait for the folders too.
                row["saves_spread_share"] = {
                    "background": _div((row["save_waited_s"] or 0) / every_state, step),
                    "foreground": _div((row["state_save_write_s"] or 0) / every_state
                                       + (row["hf_save_write_s"] or 0) / every_ckpt, step),
                    "state_every": every_state, "checkpoint_every": every_ckpt}
            out.append(row)
    return out


def _div(a: Any, b: Any) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def collect(args: argparse.Namespace) -> int:
    import yaml

    config = _load(args.config)
    design = _load(REPO / "config" / "config.yaml")
    results = args.results_dir or REPO / config["results_dir"]
    logs = (args.logs_dir or REPO / "logs") / config["run_name"]
    card = args.card or _card()
    base = results / "models" / "tiny"
    from predict.config.models import TinyModelSettings
    from predict.train.disk import model_parameters

    parameters = model_parameters(base) if (base / "config.json").is_file() else None
    tiny = TinyModelSettings.model_validate(config["model"].get("tiny") or {})
    parameters = parameters or model_parameters("tiny", tiny)
    rl = rl_split(results, config, design, parameters)
    alone = _read(_state_dir(results) / "vllm_alone.json")
    best = max((r["generated_tokens_per_s"] for r in alone.get("rows", [])), default=None)
    report = {
        "card": card,
        "commit": _git("rev-parse", "HEAD"),
        "config": str(args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config),
        # the file as it ran: the figures' conditions (env.concurrency, micro-batch, checkpointing) are read from
        # here, not from the file as it is when benchmarks/calibrate.py runs (a later edit would relabel them)
        "config_as_run": yaml.safe_load(args.config.read_text()),
        "shape": f"Qwen3-4B-Base, random weights, tied: {parameters:,} parameters",
        "cuts": "config/gpu-rehearsal.yaml (each cut with its reason)",
        "jobs": jobs(results, logs, config["evaluation"].get("reference")),
        "rl_steps": rl,
        "sft_steps": sft_steps(results),
        "vllm_alone": alone or None,
        "rl_rollout_vs_vllm_alone": {r["run"]: _div(r["generated_tokens_per_s"], best) for r in rl} if best else None,
        "phases": {p.stem: _read(p) for p in sorted(_state_dir(results).glob("phase-*.json"))},
        "snakemake_logs": snakemake_logs(_state_dir(results)),
    }
    out = args.out or REPO / "benchmarks" / f"rehearsal_{card}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}: {len(report['jobs'])} jobs, {len(rl)} RL steps")
    if report["snakemake_logs"]:  # the plan against this run (docs/plan.md): its phases' logs, in order
        print("the plan against it: .venv/bin/python benchmarks/plan_check.py measure --name <card>_rehearsal<suffix> "
              f"--config {report['config']} --profile gpu --device <card> "
              f"--snakemake-log {'+'.join(report['snakemake_logs'])}")
    return 0


_COMPLETE_LOG = re.compile(r"Complete log\(s\): (\S+)")


def snakemake_logs(state: Path) -> list[str]:
    """Each Snakemake phase's own log (its "Complete log(s):" line), in the order the phases ran: what
    benchmarks/plan_check.py measure reads as one run (--snakemake-log A+B). A phase run twice (a slot that ended
    in it, then a second slot) names its last log."""
    logs = []
    for phase in PHASE_ORDER:
        path = state / f"snakemake-{phase}.log"
        found = _COMPLETE_LOG.findall(path.read_text()) if path.is_file() else []
        if found:
            logs.append(os.path.relpath(found[-1], REPO) if Path(found[-1]).is_relative_to(REPO) else found[-1])
    return logs


def _card() -> str:
    """The GPU's kind as the calibration files name it (NVIDIA H100 80GB HBM3 -> h100); cpu without a GPU."""
    from predict.serving.identity import device_name

    name = device_name("gpu")
    if name == "unknown":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", re.sub(r"^nvidia\s+", "", name.lower())).strip("_").split("_")[0]


def _git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("start", "drive", "wait", "collect"):
        p = sub.add_parser(name)
        p.add_argument("--config", type=Path, default=CONFIG)
        if name in ("start", "drive"):
            p.add_argument("--no-vllm-alone", action="store_true", help="skip vLLM alone after the run")
            p.add_argument("--vllm-python", default=None, help="the node's vLLM interpreter (serving.python)")
        if name == "wait":
            p.add_argument("--timeout", type=float, default=540, help="return after this many seconds (exit 3)")
        if name == "collect":
            p.add_argument("--card", default=None, help="the card's name in the file name (default: nvidia-smi's)")
            p.add_argument("--out", type=Path, default=None)
            p.add_argument("--logs-dir", type=Path, default=None, help="where the jobs' logs are (default: logs/)")
            p.add_argument("--results-dir", type=Path, default=None,
                           help="a run's results copied off its node (default: the config's results_dir)")
    args = ap.parse_args(argv)
    args.config = args.config.resolve()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return {"start": start, "drive": drive, "wait": wait, "collect": collect}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

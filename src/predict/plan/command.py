"""`predict plan`: what the study costs before it runs, per job and in total, on one device kind.

Bad input stops before anything runs or is written, in one line, exit 2: a profile the workflow does not have, a
config that does not validate, a device kind without a calibration file.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from predict.config import ConfigError, merge_config_files, with_defaults
from predict.config.models import StudyConfig
from predict.plan.calibration import CalibrationError, load_calibration
from predict.plan.costs import TARGET_RULES, JobCost, Pricer
from predict.plan.dag import Job, dry_run, parse_dry_run
from predict.plan.limits import device_kind
from predict.plan.schedule import Capacity, Layout, lay_out

REPO = Path(__file__).resolve().parents[3]
PROFILES = ("local", "gpu", "slurm")
GIB = 1024**3


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, metavar="FILE[+FILE...]",
                   help="the study config: a file, or files joined by + read in turn (default: the profile's)")
    p.add_argument("--profile", default="local", help=f"how the run goes: {', '.join(PROFILES)} (default local)")
    p.add_argument("--nodes", type=int, default=1, help="slurm: GPU nodes the jobs spread over (default 1)")
    p.add_argument("--device", default=None,
                   help="the device kind whose calibration prices the jobs (benchmarks/calibration/<kind>.json); "
                        "default: the config's cluster.device_kind, else cpu where it serves on the CPU")
    p.add_argument("--targets", nargs="+", default=["all"], help="Snakemake targets (default all)")
    p.add_argument("--out", default=None,
                   help="write the plan here as JSON, and its jobs as parquet beside it (same name, .parquet)")


def _profile_dir(name: str) -> Path:
    if name not in PROFILES or not (REPO / "workflow" / "profiles" / name / "config.yaml").is_file():
        raise ConfigError(f"unknown profile {name!r}: predict plan knows {', '.join(PROFILES)} (workflow/profiles/)")
    return REPO / "workflow" / "profiles" / name


def _config_files(spec: str | None, profile: Path) -> list[Path]:
    if spec:
        return [Path(p).resolve() for p in spec.split("+")]
    files = yaml.safe_load((profile / "config.yaml").read_text()).get("configfile") or ["config/local.yaml"]
    return [REPO / f for f in ([files] if isinstance(files, str) else files)]


def load_study(files: Sequence[Path]) -> dict[str, Any]:
    """The files merged in turn, as Snakemake merges a --configfile list, validated with defaults filled in."""
    for f in files:
        if not f.is_file():
            raise ConfigError(f"config file {f} does not exist")
    try:
        merged = merge_config_files(*files)
    except yaml.YAMLError as e:
        raise ConfigError(f"{'+'.join(map(str, files))}: not YAML ({str(e).splitlines()[0]})") from None
    return with_defaults(merged, source="+".join(str(f) for f in files))


def capacity(profile_name: str, profile: Path, study: StudyConfig, cores: int, nodes: int,
             jobs: Sequence[Job] = ()) -> Capacity:
    """The profile's parallelism: its cores and resources on one machine, or `nodes` GPU nodes on SLURM, each with
    the GPUs of the largest request among `jobs` (at least `cluster.gpus_per_job`: a prime-rl RL job asks its
    trainer's and its inference server's GPUs)."""
    settings = yaml.safe_load((profile / "config.yaml").read_text()) or {}
    shared = study.serving.shared is not None
    if settings.get("executor") == "slurm":
        # nodes sized for the largest GPU request; a serving job starts its own server on its node
        per_node = max(1, study.cluster.gpus_per_job, *(math.ceil(j.resource("gpu")) for j in jobs))
        return Capacity(cores=float("inf"), jobs=float(settings.get("jobs", 64)),
                        resources={"gpu": float(nodes * per_node)}, shared_server=False, nodes=nodes,
                        gpus_per_node=per_node)
    c = settings.get("cores", cores)
    resources = {k: float(v) for k, v in (settings.get("resources") or {}).items()}
    return Capacity(cores=float(cores if c == "all" else c), resources=resources, shared_server=shared)


def plan(config_spec: str | None, profile_name: str, device: str | None, nodes: int = 1,
         targets: Sequence[str] = ("all",)) -> dict[str, Any]:
    """The plan as a JSON-able dict. Raises ConfigError / CalibrationError on bad input before anything runs."""
    profile = _profile_dir(profile_name)
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, not {nodes}")
    files = _config_files(config_spec, profile)
    config = load_study(files)
    study = StudyConfig.model_validate(config)
    kind = device or device_kind(study)  # cluster.device_kind, else cpu where the config serves on the CPU
    if kind is None:
        raise ConfigError("the config serves on the GPU and names no cluster.device_kind: name the device kind to "
                          "price it on (--device h100, h200)")
    cal = load_calibration(REPO, kind)
    jobs = parse_dry_run(dry_run(REPO, profile, files, targets))
    pricer = Pricer(config, cal, REPO)
    costs = [pricer.price(j) for j in jobs]
    cap = capacity(profile_name, profile, study, cal.cores, nodes, jobs)
    layout = lay_out(costs, cap)
    return plan_dict(costs, layout, files=files, profile=profile_name, nodes=nodes, cal=cal, model=pricer.model,
                     gpus_per_node=cap.gpus_per_node)


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def priced_from(cost: JobCost) -> str:
    """Where a job is priced from other stages' figures (`predict.plan.costs`: RFT no run measured, a rule of
    seconds no run on the device ran), which; else ""."""
    peak = cost.units.get("peak_from")
    parts = [cost.units.get("priced_from"), peak and f"device peak: the {peak} job's"]
    return "; ".join(p for p in parts if p)


def plan_dict(costs: Sequence[JobCost], layout: Layout, *, files: Sequence[Path], profile: str, nodes: int,
              cal: Any, model: Any, gpus_per_node: int = 0) -> dict[str, Any]:
    rows = []
    for c in costs:
        slot = layout.slots[c.job.jobid]
        complete = not c.missing
        rows.append({
            "jobid": c.job.jobid, "rule": c.job.rule, "job": c.job.label, "benchmark": c.job.benchmark,
            "wildcards": json.dumps(c.job.wildcards, sort_keys=True), "gpus": c.gpus,
            "planned_s": round(slot.wall_s, 2) if complete else None,
            "known_s": round(slot.wall_s, 2),
            "start_s": round(slot.start, 2), "end_s": round(slot.end, 2),
            "gpu_hours": round(slot.wall_s * c.gpus / 3600, 4) if complete else None,
            "device_peak_gib": c.device_peak_gib, "host_peak_mib": c.host_peak_mib,
            "disk_gb": None if c.disk_bytes is None else round(c.disk_bytes / 1e9, 6),
            "transient_disk_gb": None if c.transient_bytes is None else round(c.transient_bytes / 1e9, 3),
            "server": slot.load or None,
            "not_calibrated": "; ".join(str(m) for m in dict.fromkeys(c.missing)),
            "priced_from": priced_from(c),
        })
    real = [r for r, c in zip(rows, costs, strict=True) if c.job.rule not in TARGET_RULES]
    missing_jobs = [r for r in real if r["not_calibrated"]]
    gpu_known = sum(r["known_s"] * r["gpus"] for r in real) / 3600
    peaks = [r["device_peak_gib"] for r in real if r["device_peak_gib"] is not None]
    totals = {
        "jobs": len(real),
        "jobs_not_calibrated": len(missing_jobs),
        "calibrated": not layout.lower_bound,
        "wall_s": round(layout.wall_s, 1),
        "gpu_hours": round(gpu_known, 3),
        "device_peak_gib": max(peaks) if peaks else None,
        "host_peak_mib": max((r["host_peak_mib"] for r in real if r["host_peak_mib"] is not None), default=None),
        "disk_peak_gb": round(layout.disk_peak_bytes / 1e9, 3),
        "disk_added_gb": round(sum(r["disk_gb"] or 0 for r in real), 3),
        "not_calibrated": sorted({m.strip() for r in missing_jobs for m in r["not_calibrated"].split(";")}),
    }
    return {
        "config": [_rel(f) for f in files], "profile": profile, "nodes": nodes, "gpus_per_node": gpus_per_node,
        "device": {"kind": cal.kind, "what": cal.device, "calibration": _rel(cal.path), "sources": cal.sources},
        "model": {"shape": model.shape, "weights": model.weights, "params": model.params},
        "totals": totals, "jobs": rows,
        "note": ("totals count only the calibrated parts: a lower bound" if layout.lower_bound else
                 "every job calibrated"),
    }


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "n/c"
    return f"{s / 3600:.1f} h" if s >= 36000 else f"{s / 60:.1f} min" if s >= 600 else f"{s:.0f} s"


def print_plan(result: Mapping[str, Any]) -> None:
    from predict.outputs import console, print_table

    by_rule: dict[str, list[Mapping[str, Any]]] = {}
    for r in result["jobs"]:
        if r["rule"] not in TARGET_RULES:
            by_rule.setdefault(r["rule"], []).append(r)
    rows = []
    for rule, jobs in by_rule.items():
        planned = [j["planned_s"] for j in jobs]
        known = all(p is not None for p in planned)
        peaks = [j["device_peak_gib"] for j in jobs if j["device_peak_gib"] is not None]
        disk = [j["disk_gb"] for j in jobs]
        rows.append([
            rule, str(len(jobs)),
            _fmt_s(statistics.median(planned)) if known else f"n/c (>= {_fmt_s(min(j['known_s'] for j in jobs))})",
            f"{sum(j['gpu_hours'] or 0 for j in jobs):.2f}" if any(j["gpus"] for j in jobs) else "-",
            f"{max(peaks):.1f}" if peaks else ("n/c" if any(j["gpus"] for j in jobs) else "-"),
            "n/c" if None in disk else f"{sum(disk):.3g}",
        ])
    t = result["totals"]
    title = (f"plan: {'+'.join(result['config'])} on {result['device']['kind']} ({result['device']['what']}), "
             f"profile {result['profile']}" + (f", {result['nodes']} nodes of {result['gpus_per_node']} GPU(s)"
                                               if result["profile"] == "slurm" else ""))
    print_table(title, ["rule", "jobs", "wall a job (median)", "GPU-hours", "device peak GiB", "disk GB"], rows)
    bound = "" if t["calibrated"] else ">= "
    console.print(
        f"total: {t['jobs']} jobs, wall {bound}{_fmt_s(t['wall_s'])}, GPU-hours {bound}{t['gpu_hours']:.2f}, "
        f"device peak {t['device_peak_gib'] if t['device_peak_gib'] is not None else '-'} GiB, "
        f"disk peak {bound}{t['disk_peak_gb']:.3g} GB; calibration {result['device']['calibration']}")
    if not t["calibrated"]:
        console.print(f"{t['jobs_not_calibrated']} of {t['jobs']} jobs not calibrated (n/c): the totals count only "
                      "the calibrated parts, a lower bound. Missing figures:")
        for m in t["not_calibrated"]:
            console.print(f"  - {m}", soft_wrap=True)


def write_plan(result: Mapping[str, Any], out: Path) -> None:
    import pyarrow as pa

    from predict.outputs import write_json, write_table

    write_json(dict(result), out)
    write_table(pa.Table.from_pylist(list(result["jobs"])), out.with_suffix(".parquet"),
                metadata={"plan": json.dumps({k: v for k, v in result.items() if k != "jobs"})})


def main(args: argparse.Namespace) -> int:
    try:
        result = plan(args.config, args.profile, args.device, args.nodes, args.targets)
    except CalibrationError as e:
        raise ConfigError(str(e)) from None
    print_plan(result)
    if args.out:
        write_plan(result, Path(args.out))
    return 0

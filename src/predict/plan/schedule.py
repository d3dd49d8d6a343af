"""The whole run's wall time and disk peak: the priced jobs laid out as the profile would run them.

Rules:

* A job starts once every job it depends on has finished and the profile's caps leave room for it: cores (a job
  takes its threads), the resources it asks (``gpu``, ``vllm_server``), the number of jobs at once; on SLURM the
  nodes' GPUs (a node has the GPUs of the largest request, at least ``cluster.gpus_per_job``; a job takes the GPUs
  it asks, and the jobs that ask none run beside them).
* Ready jobs start in Snakemake's order of jobids (an approximation of its scheduler, stated as one).
* A serving job on one machine with ``serving.shared`` leases the one server: the first lease, and a lease on a
  server started with another key (batch-invariant evaluation after RL), starts it; any other reloads the weights in
  place. Without a shared server, or on SLURM, every serving job starts its own. The wait for a lease held by the
  job beside it is not laid out here: the calibration's figures are per job as the profile ran them, waits included
  (benchmarks/calibrate.py says so for each kind).
* A job's planned wall time is its finish minus its start in this layout: what Snakemake's benchmark of the job
  measures.
* Disk: a job's outputs count from its end; what it holds while it runs (RL state deleted at publication) from its
  start to its end. The run's disk peak is the largest sum along the layout.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from predict.plan.costs import JobCost


@dataclass(frozen=True)
class Capacity:
    cores: float
    jobs: float = float("inf")
    resources: Mapping[str, float] = field(default_factory=dict)  # gpu, vllm_server ...
    shared_server: bool = False  # one machine, one server its serving jobs lease in turn
    nodes: int = 1
    gpus_per_node: int = 0  # SLURM: each node's GPUs (the largest job's request, at least cluster.gpus_per_job)


@dataclass
class Slot:
    cost: JobCost
    start: float = 0.0
    lease_start: float | None = None
    end: float = 0.0
    load: str = ""  # "start" or "reload" (serving jobs)

    @property
    def wall_s(self) -> float:
        return self.end - self.start


@dataclass
class Layout:
    slots: dict[int, Slot]
    wall_s: float
    disk_peak_bytes: float
    lower_bound: bool  # some job's time or disk is not calibrated: the totals count only what is


def _needs(cost: JobCost) -> dict[str, float]:
    job = cost.job
    needs = {"_cores": float(job.threads), "_jobs": 1.0}
    for name in ("gpu", "vllm_server"):
        if job.resource(name):
            needs[name] = job.resource(name)
    return needs


def lay_out(costs: Sequence[JobCost], capacity: Capacity) -> Layout:
    by_id = {c.job.jobid: c for c in costs}
    free = {"_cores": capacity.cores, "_jobs": capacity.jobs, **capacity.resources}
    waiting_on = {c.job.jobid: set(d for d in c.job.deps if d in by_id) for c in costs}
    ready = sorted(j for j, d in waiting_on.items() if not d)
    slots: dict[int, Slot] = {}
    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, jobid)
    order = itertools.count()
    now = 0.0
    server_key: str | None = None
    lower = False

    def fits(needs: Mapping[str, float]) -> bool:
        return all(free.get(k, float("inf")) >= v for k, v in needs.items())

    def start_lease(slot: Slot, t: float) -> None:
        nonlocal server_key, lower
        cost = slot.cost
        if capacity.shared_server and server_key == cost.server_key:
            slot.load = "reload"
        else:
            slot.load = "start"
        server_key = cost.server_key
        load = cost.load.get(slot.load)
        if load is None:
            lower = True
            cost.missing.extend(m for m in cost.units.get("load_missing", [])
                                if m.name == f"serving_{slot.load}_s")
        slot.lease_start = t
        heapq.heappush(events, (t + (load or 0.0) + cost.work_s, next(order), "end", cost.job.jobid))

    while ready or events:
        started = True
        while started:
            started = False
            for jobid in list(ready):
                cost = by_id[jobid]
                needs = _needs(cost)
                if cost.job.local:
                    needs.pop("_jobs")
                if not fits(needs):
                    continue
                for k, v in needs.items():
                    free[k] = free.get(k, float("inf")) - v
                ready.remove(jobid)
                slot = slots[jobid] = Slot(cost, start=now)
                started = True
                if cost.serving:
                    heapq.heappush(events, (now + cost.startup_s, next(order), "lease", jobid))
                else:
                    heapq.heappush(events, (now + cost.startup_s + cost.work_s, next(order), "end", jobid))
        if not events:
            break
        now, _, kind, jobid = heapq.heappop(events)
        slot = slots[jobid]
        if kind == "lease":
            start_lease(slot, now)
            continue
        slot.end = now
        for k, v in _needs(slot.cost).items():
            if k == "_jobs" and slot.cost.job.local:
                continue
            free[k] = free.get(k, float("inf")) + v
        for other, deps in waiting_on.items():
            if jobid in deps:
                deps.discard(jobid)
                if not deps and other not in slots:
                    ready.append(other)
        ready.sort()
    if len(slots) < len(costs):
        raise RuntimeError(f"{len(costs) - len(slots)} jobs could never start: a job asks more than the profile has")
    # disk along the layout
    changes: list[tuple[float, float]] = []
    for slot in slots.values():
        c = slot.cost
        if c.disk_bytes is None or c.transient_bytes is None:
            lower = True
        changes.append((slot.end, c.disk_bytes or 0.0))
        if c.transient_bytes:
            changes += [(slot.start, c.transient_bytes), (slot.end, -c.transient_bytes)]
    disk = peak = 0.0
    for _, delta in sorted(changes, key=lambda x: (x[0], x[1])):
        disk += delta
        peak = max(peak, disk)
    if any(c.missing for c in costs):
        lower = True
    wall = max((s.end for s in slots.values()), default=0.0)
    return Layout(slots, wall, peak, lower)

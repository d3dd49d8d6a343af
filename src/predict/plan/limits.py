"""A GPU rule's scheduler request from the plan, and the job's own watch on it (issue 60).

Rules:

* The workflow asks `WorkflowLimits.resources` for a rule's `resources:` (workflow/rules/common.smk: `PLANNED`):
  the hand-set sizes it had, with ``runtime`` (SLURM's time limit, minutes), ``mem_mb`` and ``planned_s`` taken from
  the plan of that job, priced like `predict plan` prices it (`predict.plan.costs.Pricer`) on the device kind's
  calibration. Each is a function of the job (Snakemake calls it with the job's wildcards and rule name), so an
  evaluation of two checkpoints and one of five get their own.
* The margin is stated here, once: the time limit is the planned time x `RUNTIME_MARGIN`, in whole minutes and at
  least `MIN_RUNTIME_MIN`; memory is the calibrated peak x `MEMORY_MARGIN`, at least `MIN_MEM_MB`. A serving job's
  memory stays hand-set: the peak its benchmark measured is the job's process tree, and a shared vLLM server is no
  child of the job, so the figure leaves the server out.
* A serving job is planned as if it starts the server (its worst case: which job starts it is the schedule's).
* Where the calibration lacks a figure the job needs (or the config names no device kind for a GPU run), the
  hand-set numbers stay, ``planned_s`` is 0 (no watch), and the workflow says so once per rule, naming what is
  missing.
* The job's watch (`watch_planned`, `predict <stage> --planned RULE=SECONDS`): once it has run longer than its plan x
  `RUNTIME_MARGIN` it writes ONE warning line to its log naming the rule, the planned and the actual seconds (on
  SLURM before the limit ends it); at its end one line of what it took against the plan.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predict.config.models import StudyConfig

RUNTIME_MARGIN = 2.0
"""The time limit, and the warning in the job's log, at the planned time x this."""
MIN_RUNTIME_MIN = 15
"""No time limit below this many minutes: a queue's granularity, a vLLM start on a busy node."""
MEMORY_MARGIN = 2.0
MIN_MEM_MB = 2000
SERVING_FAMILIES = {"evaluate", "evaluate_test", "rollout", "rl", "rft"}
# Figures a job's time does not need (its device peak, the disk it fills)
NOT_TIME = {"device_peak_gib", "output_bytes", "eval_bytes_per_episode", "state_bytes_per_param",
            "checkpoint_bytes_per_param", "checkpoint_extra_bytes"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobLimit:
    """One job's request: the plan's, or the hand-set one and why."""

    runtime: int
    mem_mb: int | None
    planned_s: int  # 0: no plan, no watch
    fallback: str = ""  # why the hand-set numbers stay ("" where the plan gave them)


def device_kind(study: StudyConfig) -> str | None:
    """The device kind whose calibration sizes the jobs: `cluster.device_kind`, else the CPU's where the config serves
    on the CPU, else None (a GPU run that names no kind)."""
    if study.cluster.device_kind:
        return study.cluster.device_kind
    return "cpu" if study.serving.device == "cpu" else None


def runtime_minutes(planned_s: float) -> int:
    return max(MIN_RUNTIME_MIN, math.ceil(planned_s * RUNTIME_MARGIN / 60))


def memory_mb(peak_mib: float) -> int:
    return max(MIN_MEM_MB, math.ceil(peak_mib * MEMORY_MARGIN * 1.048576))  # MiB -> MB


class WorkflowLimits:
    """The requests of one config's jobs on its device kind (`device_kind`)."""

    def __init__(self, config: Mapping[str, Any], repo: Path, say: Callable[[str], None] = log.info) -> None:
        from predict.plan.calibration import CalibrationError, load_calibration
        from predict.plan.costs import Pricer

        self.kind = device_kind(StudyConfig.model_validate(dict(config)))
        self.say = say
        self.pricer: Pricer | None = None
        self.why_not = ""
        self._seen: dict[tuple[str, str, int], JobLimit] = {}
        self._said: set[str] = set()
        if self.kind is None:
            self.why_not = ("the config serves on the GPU and names no device kind (cluster.device_kind: h100, h200)")
            return
        try:
            cal = load_calibration(repo, self.kind)
        except CalibrationError as e:
            self.why_not = str(e)
            return
        self.pricer = Pricer(config, cal, repo)
        self.calibration = cal

    @property
    def priced(self) -> bool:
        """Whether the device kind has a calibration to plan on."""
        return self.pricer is not None

    def job(self, rule: str, wildcards: Mapping[str, str], hand_set: Mapping[str, Any],
            checkpoints: int = 1) -> JobLimit:
        """The request of the job of `rule` with these wildcards (evaluation jobs: serving `checkpoints`)."""
        from predict.plan.costs import family

        key = (rule, repr(sorted(wildcards.items())), checkpoints)
        if key not in self._seen:
            self._seen[key] = self._price(rule, dict(wildcards), hand_set, checkpoints)
            limit = self._seen[key]
            fam = family(rule)
            if limit.fallback and fam not in self._said:  # once per family: every evaluate_<run> lacks the same
                self._said.add(fam)
                rules = f"rules {fam}*" if fam != rule else f"rule {rule}"
                self.say(f"{rules}: hand-set runtime {limit.runtime} min (no plan: {limit.fallback})")
        return self._seen[key]

    def _price(self, rule: str, wildcards: dict[str, str], hand_set: Mapping[str, Any], checkpoints: int) -> JobLimit:
        from predict.plan.costs import family
        from predict.plan.dag import Job

        hand = JobLimit(int(hand_set["runtime"]), hand_set.get("mem_mb"), 0)
        if self.pricer is None:
            return JobLimit(hand.runtime, hand.mem_mb, 0, self.why_not)
        job = Job(jobid=0, rule=rule, wildcards=wildcards, outputs=[""] * checkpoints,
                  resources={"gpu": str(hand_set.get("gpu", 0))})
        cost = self.pricer.price(job)
        # the time is what a limit needs: a device peak or a disk figure the calibration lacks does not stop it
        missing = [str(m) for m in cost.missing if m.name not in NOT_TIME]
        start = 0.0
        if cost.serving:  # planned as if it starts the server, its worst case
            start = cost.load.get("start")
            if start is None:
                missing += [str(m) for m in cost.units.get("load_missing", []) if m.name == "serving_start_s"]
        if missing:
            return JobLimit(hand.runtime, hand.mem_mb, 0,
                            f"{self.calibration.path.name} lacks {'; '.join(dict.fromkeys(missing))}")
        planned = cost.startup_s + (start or 0.0) + cost.work_s
        mem = hand.mem_mb
        if family(rule) not in SERVING_FAMILIES and cost.host_peak_mib:
            mem = memory_mb(cost.host_peak_mib)
        return JobLimit(runtime_minutes(planned), mem, max(1, round(planned)))

    def resources(self, hand_set: Mapping[str, Any], checkpoints: int = 1) -> dict[str, Any]:
        """A rule's `resources:`: `hand_set` with runtime, mem_mb and planned_s as functions of the job."""

        def pick(name: str) -> Callable[..., Any]:
            def value(wildcards: Any, rulename: str) -> Any:
                limit = self.job(rulename, dict(wildcards.items()), hand_set, checkpoints)
                return getattr(limit, name)

            return value

        out = {**hand_set, "runtime": pick("runtime"), "planned_s": pick("planned_s")}
        if "mem_mb" in hand_set:
            out["mem_mb"] = pick("mem_mb")
        return out


@contextmanager
def watch_planned(spec: str | None, margin: float = RUNTIME_MARGIN, name: str = "this job") -> Iterator[None]:
    """`spec` SECONDS, or NAME=SECONDS (`predict <stage> --planned`; Snakemake passes the job's planned seconds and
    the job is named by its stage, `name`: its log is its rule's): one warning line once the job outlives its plan x
    margin, and at its end what it took against the plan. Nothing to watch without a plan (0 s) or a spec."""
    if not spec:
        yield
        return
    given, _, seconds = spec.rpartition("=")
    rule = given or name
    try:
        planned = float(seconds)
    except ValueError:
        raise ValueError(f"--planned {spec!r}: expected SECONDS (or NAME=SECONDS)") from None
    if planned <= 0:
        log.info(f"{rule}: no planned time (its device kind has no calibration for it): not watched")
        yield
        return
    start = time.monotonic()

    def warn() -> None:
        log.warning(f"{rule}: still running after {time.monotonic() - start:.0f} s, planned {planned:.0f} s: "
                    f"past its plan by more than the margin (x{margin:g}; docs/plan.md)")

    timer = threading.Timer(planned * margin, warn)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        log.info(f"{rule}: took {time.monotonic() - start:.0f} s, planned {planned:.0f} s")

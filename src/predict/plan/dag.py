"""The jobs Snakemake would run: its own dry-run, read back.

Rules:

* The plan is of the DAG Snakemake builds, never a list of our own: `dry_run` runs ``snakemake -n -F
  --printshellcmds`` with the profile and config files the run would use, and `parse_dry_run` reads every job's
  block back (rule, jobid, input, output, benchmark, wildcards, threads, resources, shell command).
* ``-F`` plans every job from scratch (what the study costs before it runs), in a scratch folder: the repository's
  files are linked in, its run state (``results/``, ``logs/``, ``.snakemake/``, the ledger) is not, so planning writes
  nothing into the checkout and finds nothing done.
* A job's dependencies are the jobs whose outputs its inputs name: a file, or a file under a folder output (an SFT
  checkpoint folder, an RL step).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The checkout's run state: never linked into the scratch folder, so the dry-run plans from nothing.
RUN_STATE = {"results", "logs", ".snakemake", ".test-campaigns", ".cache", ".git", ".prime-rl", "models"}


class DryRunError(ValueError):
    """Snakemake's dry-run failed: its message's last lines."""


@dataclass
class Job:
    jobid: int
    rule: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    benchmark: str | None = None
    log: str | None = None
    wildcards: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    resources: dict[str, str] = field(default_factory=dict)
    shell: str = ""
    local: bool = False
    deps: list[int] = field(default_factory=list)

    def resource(self, name: str, default: float = 0) -> float:
        try:
            return float(self.resources.get(name, default))
        except ValueError:
            return default

    def flag_values(self, flag: str) -> list[str]:
        """Every value the shell command passes after `flag` (``--checkpoint sft --checkpoint step2``)."""
        try:
            words = shlex.split(self.shell.split(" > ")[0])
        except ValueError:
            words = self.shell.split()
        return [words[i + 1] for i, w in enumerate(words[:-1]) if w == flag]

    @property
    def label(self) -> str:
        wildcards = ",".join(f"{k}={v}" for k, v in self.wildcards.items())
        return f"{self.rule}[{wildcards}]" if wildcards else self.rule


_HEADER = re.compile(r"^(local)?(rule|checkpoint) (\w+):$")
_FIELD = re.compile(r"^    (\w+): (.*)$")


def _split_list(text: str) -> list[str]:
    return [part.strip().removesuffix(" (update)") for part in text.split(", ") if part.strip()]


def _pairs(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(", "):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


def parse_dry_run(text: str) -> list[Job]:
    """Every job block of ``snakemake -n --printshellcmds`` output, with its dependencies."""
    jobs: list[Job] = []
    current: Job | None = None
    for line in text.splitlines():
        if m := _HEADER.match(line):
            current = Job(jobid=-1, rule=m.group(3), local=bool(m.group(1)))
            jobs.append(current)
            continue
        if current is None:
            continue
        if m := _FIELD.match(line):
            key, value = m.groups()
            if key == "input":
                current.inputs = _split_list(value)
            elif key == "output":
                current.outputs = _split_list(value)
            elif key == "jobid":
                current.jobid = int(value)
            elif key == "benchmark":
                current.benchmark = value
            elif key == "log":
                current.log = value.split(" (")[0]
            elif key == "wildcards":
                current.wildcards = _pairs(value)
            elif key == "threads":
                current.threads = int(value)
            elif key == "resources":
                current.resources = _pairs(value)
        elif line.startswith("Shell command: "):
            current.shell = line.removeprefix("Shell command: ")
        elif not line.strip():
            current = None
    if not jobs:
        raise DryRunError("Snakemake's dry-run listed no job")
    _link(jobs)
    return jobs


def _link(jobs: list[Job]) -> None:
    producer: dict[str, int] = {}
    for job in jobs:
        for out in job.outputs:
            producer[out.rstrip("/")] = job.jobid
    for job in jobs:
        deps = set()
        for path in job.inputs:
            path = path.rstrip("/")
            if path in producer:
                deps.add(producer[path])
                continue
            # a file under a folder some job makes (a checkpoint's config.json), or a folder holding outputs
            parent = Path(path)
            while parent != parent.parent:
                parent = parent.parent
                if str(parent) in producer:
                    deps.add(producer[str(parent)])
                    break
        deps.discard(job.jobid)
        job.deps = sorted(deps)


def scratch_checkout(repo: Path, into: Path) -> Path:
    """A folder holding links to the repository's files but none of its run state (`RUN_STATE`)."""
    for entry in repo.iterdir():
        if entry.name not in RUN_STATE:
            (into / entry.name).symlink_to(entry.resolve())
    return into


def dry_run(repo: Path, profile: Path, configfiles: Sequence[Path], targets: Sequence[str] = ("all",),
            extra: Sequence[str] = ()) -> str:
    """Snakemake's dry-run of `targets` from nothing, in a scratch folder: its printed jobs."""
    with tempfile.TemporaryDirectory(prefix="predict-plan-") as tmp:
        work = scratch_checkout(repo, Path(tmp))
        cmd = [sys.executable, "-m", "snakemake", *targets, "--profile", str(profile), "-n", "-F", "--printshellcmds",
               "--directory", str(work), "--snakefile", str(work / "Snakefile"), *extra]
        if configfiles:
            cmd += ["--configfile", *map(str, configfiles)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-3:]
        raise DryRunError(f"snakemake's dry-run failed: {' | '.join(tail)}")
    return done.stdout + done.stderr

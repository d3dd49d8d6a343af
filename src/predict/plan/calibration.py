"""Per-unit figures measured on one device kind: what the plan prices jobs with.

Rules:

* One file per kind, ``benchmarks/calibration/<kind>.json``, written by ``benchmarks/calibrate.py`` from the
  benchmark and rehearsal JSON beside it: no figure is typed in by hand. Each figure names the file and field it
  came from (``source``) and how it was derived (``how``).
* A figure holds at the conditions it was measured at (``at``: the model's shape, the reply length, the micro-batch
  ...). The plan uses a figure only where every condition it names equals the job's; anything else is "not
  calibrated", and the job says which figure at which conditions it lacks. Nothing is scaled from another shape,
  length or card.
* What the work itself is (tokens per SFT trace, the bytes a stage writes, the trainer state per parameter) is the
  same on every device: ``workload.json`` holds it, beside every kind's own figures.
* A figure known to be missing is written down as such (``value`` null, ``missing``: what would give it), so the
  plan can say where it will come from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CALIBRATION_DIR = Path("benchmarks") / "calibration"
WORKLOAD = "workload"


class CalibrationError(ValueError):
    """No calibration for a device kind, or a calibration file that does not read."""


@dataclass(frozen=True)
class Missing:
    """A figure the plan needed at these conditions and the calibration does not hold."""

    name: str
    at: tuple[tuple[str, Any], ...]
    why: str = ""

    def __str__(self) -> str:
        at = ", ".join(f"{k}={v}" for k, v in self.at)
        return f"{self.name}" + (f" at {at}" if at else "") + (f" ({self.why})" if self.why else "")


@dataclass
class Calibration:
    kind: str
    device: str
    cores: int
    figures: dict[str, list[dict[str, Any]]]
    path: Path | None = None
    sources: list[str] = field(default_factory=list)
    workload: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """`WORKLOAD`'s figures: the work itself (tokens per trace, bytes written), the same on every device."""

    def entry(self, name: str, at: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """The calibrated entry of `name` whose conditions all equal `at`'s, else None."""
        at = dict(at or {})
        for entry in self.figures.get(name, []) + self.workload.get(name, []):
            if entry.get("value") is None:
                continue
            if holds_at(entry.get("at"), at):
                return entry
        return None

    def missing_reason(self, name: str, at: Mapping[str, Any] | None = None) -> str:
        """What the calibration says about a figure it lacks at these conditions (a recorded gap), else ''."""
        at = dict(at or {})
        for entry in self.figures.get(name, []) + self.workload.get(name, []):
            if entry.get("value") is None and all(at.get(k) == v for k, v in (entry.get("at") or {}).items()):
                return str(entry.get("missing") or "")
        return ""


def holds_at(conditions: Mapping[str, Any] | None, at: Mapping[str, Any]) -> bool:
    """Whether a figure measured at `conditions` holds at `at`: every condition it names equals `at`'s."""
    return all(k in at and at[k] == v for k, v in (conditions or {}).items())


def calibration_path(repo: Path, kind: str) -> Path:
    return repo / CALIBRATION_DIR / f"{kind}.json"


def known_kinds(repo: Path) -> list[str]:
    return sorted(p.stem for p in (repo / CALIBRATION_DIR).glob("*.json") if p.stem != WORKLOAD)


def load_calibration(repo: Path, kind: str) -> Calibration:
    path = calibration_path(repo, kind)
    if kind == WORKLOAD or not path.is_file():
        kinds = ", ".join(known_kinds(repo)) or "none"
        raise CalibrationError(f"no calibration for device kind {kind!r} ({path.relative_to(repo)} does not exist; "
                               f"calibrated kinds: {kinds}; benchmarks/calibrate.py writes them)")
    try:
        data = json.loads(path.read_text())
        shared = calibration_path(repo, WORKLOAD)
        workload = json.loads(shared.read_text())["figures"] if shared.is_file() else {}
        return Calibration(kind=data["kind"], device=data["device"], cores=int(data["cores"]),
                           figures=data["figures"], path=path, sources=list(data.get("sources", [])),
                           workload=workload)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CalibrationError(f"{path}: not a calibration file ({e})") from None

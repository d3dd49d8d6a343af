"""The study report: one self-contained HTML page built from parquet only (`predict report`).

Inputs are the tables of `predict stats` (metrics, pairs, confusion, classes, selection), the ablation tables,
the power table, the RL metrics of the training runs (optional: a missing run is said so in its section) and one
evaluation file to render a rollout from. Figures are matplotlib PNGs embedded as base64, so the page opens from
disk with no other file. Every section is a ``<section id=...>`` listed in `SECTIONS`, present even when its data
is not there yet (it then says what is missing).
"""

from __future__ import annotations

from predict.report.build import SECTIONS, build_report

__all__ = ["SECTIONS", "build_report"]

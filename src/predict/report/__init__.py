"""The study report: one self-contained HTML page built from parquet only (`predict report`).

Inputs are the tables of `predict stats` on val (`STATS_TABLES`) and, once the frozen test has run, on test
(`TEST_STATS_TABLES`, ``--test-stats``; `build` says how the page opens with it), the ablation tables, the extension
tables, the power table, the RL metrics of the training runs (optional: a missing run is said so in its section) and
one evaluation file to render a rollout from. Figures are matplotlib PNGs embedded as base64, so the page opens from
disk with no other file. Every section is a ``<section id=...>`` listed in `SECTIONS`, present even when its data is
not there yet (it then says what is missing).

RL metrics columns the report reads (any subset): ``step`` (required) and those `training.CURVES` names (training
curves). Training-time predicted vs verified class shares come from ``training_outcomes.parquet``.

Checking the page by eye: ``chromium --headless --no-sandbox --disable-gpu --user-data-dir=$(mktemp -d)
--screenshot=shot.png --window-size=1280,9000 file://$PWD/results/report/index.html``; tests/test_report.py does
the same and checks the pixels.
"""

from __future__ import annotations

from predict.report.build import SECTIONS, build_report

__all__ = ["SECTIONS", "build_report"]

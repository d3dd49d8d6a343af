"""A study a second party can check: the bundle (`predict bundle`, predict.bundle.build) holds everything the report
rests on, and `predict verify-bundle` (predict.bundle.verify) re-derives every number from it without the cluster.
docs/verify.md says what a reviewer runs and what each verdict means.

The bundle is a folder laid out like the results folder it comes from (so the stages re-run on it as they ran on
results/), plus its manifest, and one archive of that folder (``bundle.tar.gz``, byte-stable: sorted members, no
times or owners):

* ``report/index.html`` (the study report) and ``report/snakemake-report.zip`` (Snakemake's own report archive, where
  one was made before the bundle: ``snakemake --report results/report.zip``);
* ``eval/{run}/{checkpoint}/{split}/seed{seed}.parquet``: every evaluation the statistics read, val and test;
* ``stats/``, ``test/stats/``, ``ablations/``, ``extensions/``: every statistics table (the selection is
  ``stats/selection.parquet``), the power table and the training-outcome table;
* ``rl/{run}/seed{seed}/metrics.parquet``, ``sft/{run}/metrics.parquet``: the training metrics tables;
* ``ledger.jsonl``: the campaign registry's lines for this test split (its registration, every campaign on it, with
  its reason, and every ``started``/``done`` line of those campaigns), as the registry holds them;
* ``inspect/`` (optional: where the workflow exported them, `predict inspect-logs`): every evaluation as an Inspect log
  and Inspect's ``logs.json``, to browse the episodes with ``inspect view --log-dir inspect``; listed and hashed like
  every file, never required by verify-bundle (nothing is re-derived from them);
* ``weights/...`` (only with config ``bundle.weights``): the evaluated checkpoints, under their results path;
* ``manifest.json`` (`MANIFEST_KEYS`): the filled config and its design hash, the code commit (dirty or not, the
  diff's hash), MBPP's hash and the split's task ids, both environments' package versions, vLLM's version and the
  serving flags, the devices, each evaluated checkpoint's content hash, the report's example evaluation, the order
  in which the workflow handed the report its ablation, extension and training tables (``inputs``: config order,
  which the stages' sorted config slices do not keep, and the page follows), and the sha256 and size of every other
  file in the bundle.

Rules:

* The manifest lists every file of the bundle but itself, and nothing else: a file left out, added or changed is a
  failure naming it. The manifest's own sha256 is the bundle's identity (`manifest_digest`): publish it with the
  paper, and a reviewer compares.
* Paths in the bundle are the results paths (`relative`), so verify-bundle hands the bundle's files to the stages
  exactly where a results folder would have them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

FORMAT = "predict-bundle/1"
MANIFEST = "manifest.json"
LEDGER = "ledger.jsonl"
REPORT = "report/index.html"
SNAKEMAKE_REPORT = "report/snakemake-report.zip"
WEIGHTS = "weights"
INSPECT_LOGS = "inspect"
"""The Inspect logs' folder in the bundle (optional: predict.inspect_logs)."""
ARCHIVE_ROOT = "bundle"
"""The archive's one top-level folder."""

MANIFEST_KEYS = ("format", "created", "run_name", "config", "design_hash", "campaign", "code", "data",
                 "environments", "serving", "devices", "checkpoints", "report", "inputs", "files")


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's bytes, read now (never a cache: the bundle is what is checked)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_digest(bundle: str | Path) -> str:
    """The bundle's identity: the sha256 of its manifest (which holds every other file's sha256)."""
    return sha256_file(Path(bundle) / MANIFEST)


def bundle_files(root: str | Path) -> list[str]:
    """Every file under the bundle folder but the manifest, as sorted POSIX paths relative to it."""
    root = Path(root)
    return sorted(rel for p in root.rglob("*") if p.is_file() and (rel := p.relative_to(root).as_posix()) != MANIFEST)

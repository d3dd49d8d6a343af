"""Parquet in and out, the one way every stage writes its tables.

Writes are atomic (a temporary file in the same folder, then a rename), so a crash never leaves a
half-written parquet that Snakemake or a resuming stage would mistake for a finished one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def _atomic_target(path: Path) -> tuple[int, Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    return fd, Path(tmp)


def write_table(table: pa.Table, path: str | Path) -> Path:
    """Write a pyarrow table to parquet atomically."""
    path = Path(path)
    fd, tmp = _atomic_target(path)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_rows(rows: Iterable[Mapping[str, Any]], schema: pa.Schema, path: str | Path) -> Path:
    """Write dict rows with an explicit schema (so an empty table still has its columns)."""
    table = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    return write_table(table, path)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def write_json(obj: Any, path: str | Path) -> Path:
    """Write JSON atomically, keys sorted so the file is byte-stable."""
    path = Path(path)
    fd, tmp = _atomic_target(path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path

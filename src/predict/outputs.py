"""What a stage puts out: its tables (parquet), JSON and text, written atomically and read back by later stages,
and what it prints on the console (rich, on stderr: stdout stays free for data).

Writes are atomic (a temporary file in the same folder, then a rename), so a crash never leaves a
half-written parquet that Snakemake or a resuming stage would mistake for a finished one.
(Named outputs, not io: no module here is named like a standard-library module.)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def replacing_file(path: Path) -> Iterator[tuple[int, Path]]:
    """A temporary file beside ``path`` (its open descriptor and its path) that replaces ``path`` when the block
    ends, and is removed if the block fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp makes the file 0600; the output gets the mode any other new file would (0666 minus the umask), so
    # results and reports can be shared like the rest of the folder.
    os.fchmod(fd, 0o666 & ~_umask())
    try:
        yield fd, Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_table(table: pa.Table, path: str | Path, metadata: Mapping[str, str] | None = None) -> Path:
    """Write a pyarrow table to parquet atomically; ``metadata`` is added to its schema metadata (str -> str)."""
    path = Path(path)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    with replacing_file(path) as (fd, tmp):
        os.close(fd)
        pq.write_table(table, tmp)
    return path


def write_rows(rows: Iterable[Mapping[str, Any]], schema: pa.Schema, path: str | Path,
               metadata: Mapping[str, str] | None = None) -> Path:
    """Write dict rows with an explicit schema (so an empty table still has its columns)."""
    table = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    return write_table(table, path, metadata)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


class ResumableParquet:
    """Rows persisted as they finish, so an interrupted stage resumes where it stopped.

    Finished rows go to `<out>.partial/part-NNNNN.parquet` (each part written atomically); a rerun
    reads them back, skips their keys, and `finish()` concatenates everything into `<out>` and removes
    the folder. Snakemake deletes a failed job's declared output, never this undeclared folder.
    Which rows may be resumed is the caller's to settle first (`predict.fingerprint.start_or_resume` on
    `partial_dir_of(out)` empties a folder persisted under other inputs or settings; it keeps ``fingerprint.json``
    beside the parts). This module stays below `predict.fingerprint`, which writes through it.
    """

    def __init__(self, out: str | Path, schema: pa.Schema, key: Sequence[str]) -> None:
        self.out = Path(out)
        self.schema = schema
        self.key = tuple(key)
        self.partial_dir = self.partial_dir_of(self.out)
        self._rows = [r for part in self._parts() for r in self._read_part(part)]

    @staticmethod
    def partial_dir_of(out: str | Path) -> Path:
        """The folder an output's rows are persisted in until `finish()`."""
        out = Path(out)
        return out.with_name(out.name + ".partial")

    def _parts(self) -> list[Path]:
        return sorted(self.partial_dir.glob("part-*.parquet")) if self.partial_dir.exists() else []

    def _read_part(self, part: Path) -> list[dict[str, Any]]:
        table = pq.read_table(part)
        if table.schema.names != self.schema.names:
            raise ValueError(f"{part}: columns {table.schema.names} differ from {self.schema.names}; delete the folder")
        return table.to_pylist()

    @property
    def rows(self) -> list[dict[str, Any]]:
        return list(self._rows)

    def done(self) -> set[tuple]:
        """Keys of the rows already persisted."""
        return {tuple(r[k] for k in self.key) for r in self._rows}

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        parts = self._parts()
        index = int(parts[-1].stem.split("-")[1]) + 1 if parts else 0
        write_rows(rows, self.schema, self.partial_dir / f"part-{index:05d}.parquet")
        self._rows.extend(dict(r) for r in rows)

    def finish(self, metadata: Mapping[str, str] | None = None) -> Path:
        """Write every persisted row, ordered by key, to the output and drop the partial folder."""
        rows = sorted(self._rows, key=lambda r: tuple(r[k] for k in self.key))
        write_rows(rows, self.schema, self.out, metadata)
        if self.partial_dir.exists():
            # A part being written when an earlier run was killed (scancel, OOM) leaves its temporary file; its rows
            # were never persisted (they ran again here), so it goes too.
            for path in [*self._parts(), *self.partial_dir.glob(".part-*.tmp")]:
                path.unlink()
            (self.partial_dir / "fingerprint.json").unlink(missing_ok=True)
            self.partial_dir.rmdir()
        return self.out


def read_json(path: str | Path) -> Any:
    """The JSON in `path`; None when it is missing or not JSON (half-written by a job that died, or never written)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json(obj: Any, path: str | Path) -> Path:
    """Write JSON atomically, keys sorted so the file is byte-stable."""
    return write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def write_text(text: str, path: str | Path) -> Path:
    """Write a text file (e.g. the HTML report) atomically."""
    path = Path(path)
    with replacing_file(path) as (fd, _), os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The console
# ---------------------------------------------------------------------------------------------------------------
console = Console(stderr=True)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table on stderr: each cell as str() shows it, None as an empty cell."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(None if cell is None else str(cell) for cell in row))
    console.print(table)


def print_summary(title: str, summary: dict[str, Any], float_format: str = ".3f") -> None:
    """A stage's summary as a two-column table on stderr."""
    print_table(title, ("measure", "value"), [(key, format(value, float_format) if isinstance(value, float)
                                              else str(value)) for key, value in summary.items()])

"""What a stage prints: one rich console on stderr (stdout stays free for data), tables and summaries on it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

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

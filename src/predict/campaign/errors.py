"""How the campaign refuses: `SplitGuardError` when a rollout, an evaluation or a statistic would touch the test split
outside its one campaign, `StatsInputError` when an evaluation file is missing or disagrees with its path or the
selection. Each refusal names the file or the ledger (and line), what differs and what to do; `first_ids` gives the
first few task ids it names."""

from __future__ import annotations

from collections.abc import Iterable


class SplitGuardError(RuntimeError):
    """A rollout, an evaluation or a statistic would touch the test split outside its one campaign."""


class StatsInputError(ValueError):
    """An evaluation file is missing, misnamed or disagrees with its path (or with the selection)."""


def first_ids(ids: Iterable[int], n: int = 6) -> str:
    """The first few task ids, for a refusal: ``2, 3, 4, 5, 7, 8, ... (12 in all)``."""
    ids = sorted(ids)
    return ", ".join(map(str, ids[:n])) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")

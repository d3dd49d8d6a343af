"""The page's building blocks, shared by every section: tables, figures, and the cells they hold.

Rules: column labels are words (`LABELS`), never parquet field names; every rate is shown with its count and
denominator ("56.4% (282/500)", `pct`); p-values keep two significant digits (`pval`); a wide table is built from
merged cells (a comparison in one cell, a CI in one cell) so it fits the page."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any


def is_missing(value: Any) -> bool:
    """None or NaN: a number the statistics could not give (shown as "–")."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_value(value: Any) -> str:
    """A cell's text: "–" when missing, yes/no, three decimals (three significant digits when tiny), else escaped."""
    if is_missing(value):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
    return html.escape(str(value))


# Column labels in words, for the columns several tables share (each table labels its own columns): a parquet
# field name never reaches the page (one that is a word already, "run", "seed", "mode", is its own label).
LABELS: dict[str, str] = {
    "who": "run / checkpoint / seed", "n_infra": "infrastructure failures", "pass_at_1": "pass@1",
    "p_vs_reference": "McNemar p vs own SFT", "p_vs_B": "McNemar p vs Arm B (same seed)", "val_pass_at_1": "val pass@1",
    "fallback": "base stand-in", "selection_fallback": "base stand-in", "cls": "class",
    "budget_rev": "budget exhausted, ever revised", "budget_keep": "budget exhausted, never revised",
}


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], labels: Mapping[str, str] | None = None,
          wrap: Sequence[str] = ()) -> str:
    """An HTML table; `wrap`: columns whose cells may break over lines (long merged cells), the others never do."""
    labels = {**LABELS, **(labels or {})}
    text_cols = {c for c in columns if rows and isinstance(rows[0].get(c), str)}
    head = "".join(f'<th class="{"l" if c in text_cols else ""}">{html.escape(labels.get(c, c))}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in text_cols else ""}{" w" if c in wrap else ""}">{format_value(r.get(c))}</td>'
                         for c in columns) + "</tr>"
        for r in rows
    )
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def empty(message: str) -> str:
    return f'<p class="empty">{html.escape(message)}</p>'


def figure(fig: Any, alt: str) -> str:
    """A matplotlib figure as an embedded PNG."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def agg_pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display), imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pct(k: Any, n: Any) -> str:
    """A rate with its count and denominator: "56.4% (282/500)"; "– (0/0)" when there is no denominator."""
    if is_missing(k) or is_missing(n):
        return "–"
    return f"{100 * k / n:.1f}% ({k}/{n})" if n else f"– (0/{n})"


def pval(p: Any) -> str:
    """A p-value, two significant digits; "–" when no test ran (no shared task)."""
    if is_missing(p):
        return "–"
    return "<0.0001" if p < 1e-4 else f"{p:.2g}"


def points(diff: Any, low: Any = None, high: Any = None) -> str:
    """A difference of rates in percentage points, with its CI: "+4.4 pts [+0.2, +8.6]"."""
    if is_missing(diff):
        return "–"
    out = f"{100 * diff:+.1f} pts"
    return out if is_missing(low) or is_missing(high) else f"{out} [{100 * low:+.1f}, {100 * high:+.1f}]"


def eval_key(row: Mapping[str, Any], side: str = "") -> tuple[str, str, int]:
    """(run, checkpoint, seed) of a row, or of one side of a pair (`side` "_a", "_b")."""
    return row[f"run{side}"], row[f"checkpoint{side}"], row[f"seed{side}"]


def eval_label(row: Mapping[str, Any], side: str = "") -> str:
    """"run / checkpoint / seed N" of a row, or of one side of a pair."""
    run, checkpoint, seed = eval_key(row, side)
    return f"{run} / {checkpoint} / seed {seed}"

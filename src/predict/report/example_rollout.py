"""One evaluation rollout rendered step by step: the task, each reply with its action, prediction, decision and
verified outcome."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from predict.env.records import step_labels
from predict.report.elements import empty


def _tag(text: str, cls: str = "") -> str:
    return f'<span class="tag {cls}">{html.escape(text)}</span>'


def rollout_section(rows: list[dict[str, Any]] | None, tasks: Mapping[int, Mapping[str, Any]]) -> str:
    if not rows:
        return empty("No evaluation rollouts to render.")
    # the most telling one: predictions, a REVISE, then a pass
    row = max(rows, key=lambda r: (bool(r.get("n_predictions")), bool(r.get("ever_revised")), bool(r.get("final_pass")),
                                   bool(r.get("n_patches")), -r["task_id"]))
    task = tasks.get(row["task_id"]) or {}
    out = [f"<p><b>task {row['task_id']}</b> &middot; run arm {html.escape(str(row['arm']))} "
           f"({html.escape(str(row['protocol']))}, variant {html.escape(str(row['variant']))}) &middot; checkpoint "
           f"{html.escape(str(row['checkpoint']))} &middot; seed {row['seed']} &middot; split "
           f"{html.escape(str(row['split']))} &middot; final "
           f"{_tag(str(row.get('final_outcome')), 'pass' if row.get('final_pass') else 'fail')} stop "
           f"{html.escape(str(row['stop_reason']))} &middot; calls {row['calls_used']}/{row['budget']}</p>"]
    if task:
        out.append(f"<pre>{html.escape(str(task.get('text', '')))}\n\n"
                   f"{html.escape(chr(10).join(task.get('test_list') or []))}</pre>")
    for s in row.get("steps") or []:
        tags = [_tag(text, kind) for text, kind in step_labels(s)]
        out.append(f'<div class="step"><b>step {s.get("index")}</b> {"".join(tags)}'
                   f"<pre>{html.escape(s.get('reply') or '')}</pre>"
                   + (f"<pre>&rarr; {html.escape(s['result'])}</pre>" if s.get("result") else "") + "</div>")
    return "".join(out)

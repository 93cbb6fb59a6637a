"""A self-contained Plotly HTML report comparing simulation runs (plotly.js embedded, no CDN)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from scheduler.simulator import SimResult


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    n = len(xs)
    if n > 2000:  # thin to keep the file small; the shape is unchanged
        step = n / 2000
        idx = [int(i * step) for i in range(2000)] + [n - 1]
        return [xs[i] for i in idx], [(i + 1) / n for i in idx]
    return xs, [(i + 1) / n for i in range(n)]


def write_report(
    results: Sequence[SimResult], path: Path | str, title: str, total_gpus: int
) -> Path:
    """Write one HTML file: summary table, JCT CDF, utilization, efficiency and queue over time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "JCT CDF",
            "GPU utilization over time",
            "Cluster efficiency (normalized) over time",
            "Queued jobs over time",
        ),
    )
    for res in results:
        xs, ys = _cdf([j.jct for j in res.jobs])
        fig.add_trace(go.Scatter(x=xs, y=ys, name=f"{res.policy} JCT", mode="lines"), row=1, col=1)
        t = [x / 3600 for x in res.series["t"]]
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[b / total_gpus for b in res.series["busy"]],
                name=f"{res.policy} util",
                mode="lines",
            ),
            row=1,
            col=2,
        )
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[e / total_gpus for e in res.series["efficiency"]],
                name=f"{res.policy} eff",
                mode="lines",
            ),
            row=2,
            col=1,
        )
        fig.add_trace(
            go.Scatter(x=t, y=res.series["queued"], name=f"{res.policy} queued", mode="lines"),
            row=2,
            col=2,
        )
    fig.update_xaxes(title_text="JCT (s)", type="log", row=1, col=1)
    for r, c in ((1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(title_text="hours", row=r, col=c)
    fig.update_layout(height=850, title=title)
    body = fig.to_html(full_html=False, include_plotlyjs=True)
    keys = ["jobs", "avg_jct", "median_jct", "p95_jct", "p99_jct", "avg_queueing_delay", "makespan",
            "gpu_utilization", "cluster_efficiency", "scale_events", "preemptions"]  # fmt: skip
    rows = "".join(
        "<tr><td>"
        + html.escape(r.policy)
        + "</td>"
        + "".join(f"<td>{r.summary.get(k, '')}</td>" for k in keys)
        + "</tr>"
        for r in results
    )
    table = (
        "<table border=1 cellpadding=4><tr><th>policy</th>"
        + "".join(f"<th>{k}</th>" for k in keys)
        + f"</tr>{rows}</table>"
    )
    summaries = html.escape(json.dumps([r.summary for r in results]))
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
        f"<body><h1>{html.escape(title)}</h1>{table}{body}"
        f"<script type='application/json' id='summaries'>{summaries}</script></body></html>"
    )
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out

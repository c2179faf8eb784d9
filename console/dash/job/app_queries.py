"""The job page's app card (an existing app, spark_runtime/apps.py): each query's newest
figures and stateful operators, their input and processed rates over time, and the tail of the
app's output. Pure builders of console.services.app_operators.app_view's data: no database,
no Redis."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
from dash import html

from console.clock import utc
from console.dash.common import fmt_num, table

QUERY_COLUMNS = [
    "Query",
    "Batch",
    "Input (rows/s)",
    "Processed (rows/s)",
    "Batch (ms)",
    "State rows",
    "Watermark",
    "Sources: offset (lag)",
    "Stateful operators",
]


# A JVM object's default text, `package.Class@hash`: what Spark gives as a Python data source's
# description (an app's format("kafka") served by spark_runtime/kafka_compat.py, for one).
OBJECT_TEXT = re.compile(r"^(?:[\w$]+\.)*([\w$]+)@[0-9a-f]+$")


def source_label(description: str | None, end: str | None) -> str:
    """A source's name for the table: Spark's description, except that a bare JVM object's
    text becomes its topics when its offsets have Kafka's shape (topic -> partition -> offset),
    else its class's name."""
    found = OBJECT_TEXT.match(description or "")
    if found is None:
        return description or "?"
    try:
        offsets = json.loads(end or "")
    except ValueError:
        offsets = None
    if (
        isinstance(offsets, dict)
        and offsets
        and all(
            isinstance(parts, dict) and all(isinstance(o, int) for o in parts.values())
            for parts in offsets.values()
        )
    ):
        return "Kafka " + ", ".join(sorted(offsets))
    return found.group(1)


def _sources_text(sources: list[dict]) -> str:
    parts = []
    for source in sources:
        lag = "—" if source.get("lag") is None else fmt_num(source["lag"], 0)
        label = source_label(source.get("source"), source.get("end"))
        parts.append(f"{label}: {source.get('end') or '—'} (lag {lag})")
    return "; ".join(parts) or "—"


def query_rows(queries: list[dict]) -> list[list]:
    """One table row per query (app_view's `queries`)."""
    return [
        [
            q["query"],
            q["batch"],
            fmt_num(q["input_rate"], 1),
            fmt_num(q["processed_rate"], 1),
            fmt_num(q["batch_ms"], 0),
            fmt_num(q["state_rows"], 0),
            q["watermark"] or "—",
            _sources_text(q["sources"]),
            ", ".join(f"{op['name']} ({op['kind']})" for op in q["operators"]) or "none",
        ]
        for q in queries
    ]


def query_rates_figure(history: list) -> go.Figure:
    """Input and processed rows per second of each query over time, one line each (records:
    spark_runtime.progress.ProgressRecord, oldest first)."""
    figure = go.Figure()
    by_query: dict[str, list] = {}
    for record in history:
        by_query.setdefault(record.query, []).append(record)
    for query, records in sorted(by_query.items()):
        times = [utc(r.at) for r in records]
        for label, field, dash in (
            ("input", "input_rate", "dot"),
            ("processed", "processed_rate", "solid"),
        ):
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=[getattr(r, field) for r in records],
                    mode="lines+markers",
                    name=f"{query} {label}",
                    line={"dash": dash},
                )
            )
    figure.update_layout(
        title="Queries: rows per second",
        height=260,
        margin={"l": 50, "r": 20, "t": 40, "b": 30},
        yaxis_title="rows/s",
    )
    return figure


def output_tail(lines: list[dict]):
    """The app's newest output lines (oldest first), stderr marked."""
    if not lines:
        return html.P("The app has printed nothing yet.", className="muted")
    text = "\n".join(
        f"{utc(line.get('at', 0)):%H:%M:%S} "
        f"{'!' if line.get('stream') == 'stderr' else ' '} {line.get('line', '')}"
        for line in lines
    )
    return html.Pre(text, className="app-output", id="app-output-text")


def app_panel(view: dict | None):
    """(card hidden, queries table, rates figure, output tail) of `view` (app_view's; None:
    not an app, the card stays hidden)."""
    if view is None:
        return True, None, go.Figure(), None
    queries = table(
        QUERY_COLUMNS,
        query_rows(view["queries"]),
        "No query of the app has completed a batch yet.",
        table_id="app-queries-table",
    )
    return False, queries, query_rates_figure(view["history"]), output_tail(view["output"])

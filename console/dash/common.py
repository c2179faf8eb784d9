"""Pieces every console page shares: colours, refresh rate, time windows, role checks, tables."""

from __future__ import annotations

from datetime import datetime

from dash import dcc, html
from django.utils import timezone

from console.roles import VIEWER, has_role

# Pages poll the server this often (milliseconds); the issue asks for at least every 2 s.
REFRESH_MS = 2000

# Charts never get more points per series than this; data.py averages into buckets on the server.
MAX_POINTS = 600

# One colour per meaning, used by every page so a colour means the same thing everywhere.
ACTIVE = "#2457d6"  # hot standby
PASSIVE = "#8a94a6"  # checkpoint only
FAULT = "#c5221f"  # faults, failures, downtime
RECOVERY = "#f29900"  # catch-up after the downtime
OK = "#1e8e3e"
PRIMARY = "#162033"
STANDBY = ACTIVE
MODE_COLOURS = {"active": ACTIVE, "passive": PASSIVE}
# Series colours (nodes, jobs, operators, strategies), a colour-blind friendly qualitative set.
# Blue and grey come last: they are the active and passive colours of the DAG.
SERIES = ["#e8710a", "#12b5cb", "#9334e6", "#1e8e3e", "#e52592", "#7b5e00", "#2457d6", "#5f6368"]

WINDOWS = [
    {"label": "5 min", "value": 300},
    {"label": "15 min", "value": 900},
    {"label": "1 h", "value": 3600},
    {"label": "6 h", "value": 6 * 3600},
    {"label": "24 h", "value": 24 * 3600},
]
DEFAULT_WINDOW_S = 900

# Plotly layout shared by the charts: compact margins, the site's font, readable grid.
BASE_LAYOUT = {
    "margin": {"l": 56, "r": 16, "t": 36, "b": 36},
    "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12},
    "paper_bgcolor": "#ffffff",
    "plot_bgcolor": "#ffffff",
    "legend": {"orientation": "h", "y": -0.18},
    "hovermode": "x unified",
}
GRID = {"gridcolor": "#e6e9ef", "zerolinecolor": "#c8ced9"}


def can_view(user) -> bool:
    """Server-side gate for every data callback: the Dash endpoints must not leak to strangers."""
    return has_role(user, VIEWER)


def series_colour(index: int) -> str:
    """The index-th series colour, cycling."""
    return SERIES[index % len(SERIES)]


def fmt_time(value: datetime | None, now: datetime | None = None) -> str:
    """Clock time for today's events, date and time for older ones, a dash for none."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    today = timezone.localtime(now or timezone.now()).date()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")


def fmt_num(value, digits: int = 1, suffix: str = "") -> str:
    """A number with fixed decimals and thousands separators, or a dash when missing."""
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{suffix}"


def cpu_priority_label(nice: int | None, batch_every_s: float | None) -> str:
    """How a replica shares the CPU: its nice level (lower runs first) and, for a caught-up
    standby, how often it reads new input; empty until it reports."""
    if nice is None:
        return ""
    paced = f" · every {batch_every_s:g} s" if batch_every_s else ""
    return f"nice {nice}{paced}"


def count_of(n: int, singular: str, plural: str | None = None) -> str:
    """ "1 job", "2 jobs", "1 primary", "3 primaries"."""
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"


def fmt_pct(value) -> str:
    """A 0..1 fraction as a percentage."""
    return "—" if value is None else f"{value * 100:.0f}%"


def table(columns: list[str], rows: list[list], empty: str, table_id: str | None = None):
    """A plain HTML table styled by backstop.css; `empty` is shown when there are no rows."""
    if not rows:
        return html.P(empty, className="muted")
    props = {"className": "console-table"}
    if table_id:
        props["id"] = table_id
    body = html.Table(
        [
            html.Thead(html.Tr([html.Th(c) for c in columns])),
            html.Tbody([html.Tr([html.Td(cell) for cell in row]) for row in rows]),
        ],
        **props,
    )
    # Wide tables scroll inside their card instead of widening the page.
    return html.Div(body, className="table-wrap")


def badge(text: str, kind: str):
    """A small coloured label: job and node states, modes, roles of replicas."""
    return html.Span(text, className=f"status status-{kind}")


def recovered_cell(episode: dict):
    """When a recovery episode ended: a time, "measuring" while it is watched, or how long it
    was watched without the job getting back to normal."""
    if episode["recovered_at"] is not None:
        return fmt_time(episode["recovered_at"])
    if episode["watched_s"] is None:
        return badge("measuring", "starting")
    return badge(f"not within {episode['watched_s']:.0f} s", "failed")


def recovery_time_cell(episode: dict) -> str:
    """An episode's recovery time; "> watched" when it never got back to normal."""
    if episode["recovery_time_s"] is None and episode["watched_s"] is not None:
        return f"> {fmt_num(episode['watched_s'], 1)}"
    return fmt_num(episode["recovery_time_s"], 1)


def card(title: str, *children, extra_class: str = ""):
    """A white card with a heading, as on the Django pages."""
    return html.Section([html.H2(title), *children], className=f"card {extra_class}".strip())


def window_picker(component_id: str, value: int = DEFAULT_WINDOW_S):
    """Radio buttons choosing how far back charts go."""
    return dcc.RadioItems(
        id=component_id,
        options=WINDOWS,
        value=value,
        inline=True,
        className="window-picker",
    )


def refresh_timer(component_id: str = "refresh"):
    """The 2 s poll that drives every live callback on a page, and under it the line that says
    how old the page's shared data is (console.dash.sharing fills it)."""
    return html.Div(
        [
            dcc.Interval(id=component_id, interval=REFRESH_MS, n_intervals=0),
            html.Div(id="data-age", className="data-age-line muted small"),
        ]
    )


def message(text: str, ok: bool):
    """Result line under a control: green when it worked, red when refused."""
    return html.P(text, className="control-ok" if ok else "control-error")


def result_slot(component_id: str):
    """Where a control's result message appears, on its own line."""
    return html.Div(id=component_id, className="control-result")


# --- Inputs of list filters: what a browser sends, or anyone forging a callback request -------


def text_value(value, max_length: int = 100) -> str:
    """A free-text filter: stripped text of at most `max_length` characters, "" otherwise."""
    return value.strip()[:max_length] if isinstance(value, str) else ""


def choice_values(value, allowed=None, max_length: int = 100) -> tuple[str, ...]:
    """A dropdown's value (one string or a list of them) as a tuple of strings, keeping only
    `allowed` ones when given; anything else (numbers, dicts, nested lists) is dropped."""
    values = value if isinstance(value, list) else [value]
    kept = [v for v in values if isinstance(v, str) and v and len(v) <= max_length]
    if allowed is not None:
        kept = [v for v in kept if v in allowed]
    return tuple(dict.fromkeys(kept))


def one_choice(value, allowed, default: str) -> str:
    """A single choice among `allowed`, or `default`."""
    return value if isinstance(value, str) and value in allowed else default


def page_number(value, pages: int | None = None) -> int:
    """A 1-based page number (an int, not a bool), clamped to `pages` when given."""
    page = value if isinstance(value, int) and not isinstance(value, bool) else 1
    page = max(1, page)
    return min(page, max(1, pages)) if isinstance(pages, int) else page


def scroll_box(child, box_id: str | None = None):
    """A long list (50 nodes, hundreds of replicas) that scrolls inside its card instead of
    making the page endless."""
    props = {"id": box_id} if box_id else {}
    return html.Div(child, className="scroll-box", **props)

"""`manage.py page_timing`: the server time of the console's pages and API endpoints at fleet
size (the goal: p95 <= 500 ms on a 2-core machine with 200 jobs on 50 nodes).

A fleet is seeded (bench.fleet.seed: `jobs` jobs on `nodes` nodes, `minutes` of samples every
`step_s` seconds of every node's usage and every live job's throughput and latency, as the
agents and the progress ingestion write them), PostgreSQL's planner statistics are taken (as
autovacuum keeps them on a live database), and every page of bench.pages is timed as a viewer.

Nothing of a user's is touched: the rows go into a database of the run's own on the configured
server (bench.scratch, dropped at the end), and the shared page data into a Redis of the run's
own (bench.fleet.services.PrivateRedis, stopped at the end) unless `--redis-url` names another,
so no viewer of a real console is shown the seeded fleet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.models import Group, User
from django.db import connection

from bench.fleet.seed import seed_fleet
from bench.pages import page_requests, time_pages
from console.models import MetricSample, Team
from console.roles import VIEWER
from console.services.teams import DEFAULT_TEAM

GOAL_P95_MS = 500.0
VIEWER_NAME = "page-timing-viewer"


@dataclass(frozen=True)
class PageTimingSettings:
    """The fleet to seed and how often each page is requested."""

    jobs: int = 200
    nodes: int = 50
    minutes: float = 16.0
    step_s: int = 1
    requests: int = 20

    def __post_init__(self):
        for name, low in (("jobs", 1), ("nodes", 2), ("requests", 1), ("step_s", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: at least {low}, not {getattr(self, name)}")
        if self.minutes <= 0:
            raise ValueError(f"minutes: more than 0, not {self.minutes}")


def viewer() -> User:
    """A viewer of the default team, as whom the pages are requested."""
    user, _ = User.objects.get_or_create(username=VIEWER_NAME)
    user.set_unusable_password()
    user.save()
    user.groups.add(Group.objects.get_or_create(name=VIEWER)[0], Team.named(DEFAULT_TEAM).group)
    return user


def run(settings: PageTimingSettings, metrics_token: str, say: Callable[[str], None]) -> dict:
    """Seed the fleet into the current database, time every page; the report (JSON types)."""
    say(f"seeding {settings.jobs} jobs on {settings.nodes} nodes, {settings.minutes:g} min of "
        f"samples every {settings.step_s} s")  # fmt: skip
    started = time.perf_counter()
    fleet = seed_fleet(
        jobs=settings.jobs,
        nodes=settings.nodes,
        minutes=settings.minutes,
        job_step_s=settings.step_s,
        node_step_s=settings.step_s,
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Without statistics PostgreSQL reads a job's every sample to find its newest.
            cursor.execute("ANALYZE")
    seeded_s = time.perf_counter() - started
    samples = MetricSample.objects.count()
    say(f"seeded {samples:,d} metric samples in {seeded_s:.0f} s")
    pages = tuple(page_requests(metrics_token))
    timed = time_pages(viewer(), metrics_token, settings.requests, pages, progress=say)
    slow = {
        page: p95
        for page, p95 in timed["p95_ms"].items()
        if p95 is None or p95 > GOAL_P95_MS  # an error misses the goal too
    }
    return {
        "jobs": len(fleet.jobs),
        "live_jobs": len(fleet.live),
        "nodes": len(fleet.nodes),
        "metric_samples": samples,
        "seeded_s": round(seeded_s, 1),
        "database": connection.display_name,
        "goal_p95_ms": GOAL_P95_MS,
        "over_goal": slow,
        **timed,
    }


def render(report: dict, command: str, when: str, load: str) -> str:
    """The table of the run, as printed and as docs/RESULTS.md cites it."""
    lines = [
        f"Measured {when} on {report['database']}, load average at the start {load}: "
        f"{report['jobs']} jobs ({report['live_jobs']} live) on {report['nodes']} nodes, "
        f"{report['metric_samples']:,d} metric samples, each page {report['requests']} times "
        "with the shared data stale. Command:",
        "",
        f"    {command}",
        "",
        "| page | p50 ms | p95 ms | max ms | bytes |",
        "|---|---|---|---|---|",
    ]

    def cell(value) -> str:
        return "error" if value is None else f"{value:.0f}"

    for page in report["p95_ms"]:
        lines.append(
            f"| {page} | {cell(report['p50_ms'][page])} | {cell(report['p95_ms'][page])} | "
            f"{cell(report['max_ms'][page])} | {report['bytes'][page]:,d} |"
        )
    over = report["over_goal"]
    lines += [
        "",
        f"Goal p95 <= {report['goal_p95_ms']:.0f} ms: "
        + ("met by every page." if not over else "missed by " + ", ".join(over) + "."),
    ]
    if report["errors"]:
        lines.append("Errors: " + ", ".join(f"{k}: {v}" for k, v in report["errors"].items()))
    return "\n".join(lines)

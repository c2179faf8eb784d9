"""The Grafana dashboard and the compose services that provision it: every series a panel asks
for is one /metrics serves, and every file compose mounts exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from console.models import MetricSample
from tests.dash.seed import seed_console
from tests.web.test_metrics import TOKEN, scrape

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "backstop.json"
COMPOSE = ROOT / "docker" / "compose.yml"
PROMQL_FUNCTIONS = {"sum", "by", "increase", "histogram_quantile", "rate", "le"}


def series_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (identifiers that are not functions, labels
    or label values)."""
    without_labels = re.sub(r"\{[^}]*\}|\([^()]*\bby\b[^()]*\)", " ", expr)
    without_by = re.sub(r"\bby\s*\([^)]*\)", " ", without_labels)
    names = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", without_by))
    return {n for n in names if n.startswith("backstop_")} - PROMQL_FUNCTIONS


@pytest.mark.django_db
def test_every_panel_reads_series_the_endpoint_serves(client, settings):
    settings.METRICS_TOKEN = TOKEN
    seeded = seed_console(minutes=5)
    # The seed has no stage-level or spare samples: add one of each, as the controller writes.
    MetricSample.objects.bulk_create([
        MetricSample(at=seeded.now, job=seeded.adaptive, stage="count",
                     name="state_memory_bytes", value=1.5e6),
        MetricSample(at=seeded.now, node=seeded.nodes[0], name="warm_spares", value=1.0),
    ])  # fmt: skip
    served = {sample.name for samples in scrape(client).values() for sample in samples}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    wanted = set().union(*(series_names(e) for e in exprs))
    # Controller cycle series exist once a controller has run a cycle; everything else is seeded.
    unseeded = {
        "backstop_controller_cycle_duration_seconds",
        "backstop_controller_cycle_age_seconds",
    }
    assert wanted - unseeded <= served, sorted(wanted - unseeded - served)


def test_compose_provisions_prometheus_and_grafana_from_files_in_the_repository():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert {"prometheus", "grafana", "web", "redis", "postgres"} <= set(services)
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).resolve().exists(), volume
    prometheus = yaml.safe_load((COMPOSE.parent / "prometheus" / "prometheus.yml").read_text())
    (scrape_config,) = prometheus["scrape_configs"]
    assert scrape_config["metrics_path"] == "/metrics"
    assert scrape_config["static_configs"][0]["targets"] == ["web:8000"]
    assert compose["secrets"]["metrics_token"] == {"environment": "METRICS_TOKEN"}
    assert "METRICS_TOKEN" in services["web"]["environment"]

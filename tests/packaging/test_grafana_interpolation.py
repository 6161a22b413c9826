"""dashboards/grafana.py makes the substitutions Grafana's Prometheus data source
makes; the Prometheus tier (tests/prometheus) relies on it to evaluate the dashboards."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("dashboards_grafana", ROOT / "dashboards" / "grafana.py")
grafana = sys.modules.setdefault("dashboards_grafana", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(grafana)

VARIABLES = [{"type": "datasource", "name": "datasource"},
             {"type": "query", "name": "namespace", "allValue": ".*"},
             {"type": "query", "name": "service", "allValue": ".*"}]
TWO_MINUTES = grafana.TimeRange(1000.0, 1120.0, scrape_interval=1.0)


@pytest.mark.parametrize("seconds, scrape, points, interval, rate_interval", [
    (120, 1.0, 900, "1s", "4s"),          # range/points = 133 ms -> 100 ms, then the 1 s scrape floor
    (3600, 15.0, 900, "15s", "1m"),       # Grafana's defaults for an hour: 4 s -> 5 s, floor 15 s
    (6 * 3600, 15.0, 900, "20s", "1m"),   # 24 s rounds to 20 s
    (24 * 3600, 30.0, 300, "5m", "330s"), # 288 s rounds to 5 m
])
def test_intervals_as_grafana_rounds_them(seconds, scrape, points, interval, rate_interval):
    r = grafana.TimeRange(0.0, float(seconds), scrape, points)
    b = r.builtins()
    assert b["__interval"] == {"1m": "60s", "5m": "300s"}.get(interval, interval)
    assert b["__rate_interval"] == {"1m": "60s"}.get(rate_interval, rate_interval)
    assert b["__range"] == f"{seconds}s"


def test_all_uses_the_custom_all_value_verbatim():
    expr = 'rate(x{namespace=~"$namespace", service=~"${service:regex}-engine"}[$__rate_interval])'
    assert grafana.interpolate(expr, VARIABLES, grafana.Selection(), TWO_MINUTES) == \
        'rate(x{namespace=~".*", service=~".*-engine"}[4s])'


def test_values_are_regex_escaped_and_alternated():
    picked = grafana.Selection({"namespace": ["team.a"], "service": ["chat", "code+1"]})
    expr = 'x{namespace=~"$namespace", service=~"${service}"} [$__range] ${datasource}'
    assert grafana.interpolate(expr, VARIABLES, picked, TWO_MINUTES) == \
        'x{namespace=~"team\\.a", service=~"(chat|code\\+1)"} [120s] ${datasource}'


def test_every_dashboard_variable_is_a_label_values_query_over_our_labels():
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert grafana._LABEL_VALUES.match(variable["query"]["query"]), variable
        for panel, target in grafana.panel_targets(dashboard):
            left = grafana.interpolate(target["expr"], dashboard["templating"]["list"], grafana.Selection(),
                                       TWO_MINUTES)
            assert "$" not in left.replace("${datasource}", ""), (path.name, panel["title"], left)

"""The Grafana dashboards: valid against our schema of Grafana's dashboard model,
the required variables and panels, and every metric their PromQL reads is one
our code exports (collected from the real Prometheus registries)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = {p.name: p for p in sorted((ROOT / "dashboards").glob("*.json"))}
SCHEMA = json.loads((Path(__file__).parent / "grafana_dashboard.schema.json").read_text())
# A metric name as PromQL spells ours: engine names are vLLM's (`vllm:`), ours are pagedkube_*.
METRIC = re.compile(r"\b(vllm:[a-zA-Z0-9_:]+|pagedkube_[a-zA-Z0-9_]+)")
PROMQL_WORDS = {"sum", "by", "max", "min", "avg", "rate", "increase", "changes", "histogram_quantile", "le",
                "without", "count", "on", "ignoring"}


def _sample_names(registry) -> set[str]:
    """What a scrape of `registry` can contain: counters as name_total, histograms as
    name_bucket/_sum/_count, gauges as name (families with no children included)."""
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


@pytest.fixture(scope="module")
def exported() -> set[str]:
    from prometheus_client import CollectorRegistry

    from pagedkube.engine.server.metrics import EngineMetrics
    from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
    from pagedkube.gateway.metrics import GatewayMetrics

    names = _sample_names(EngineMetrics("m", lambda: (None, 0)).registry)
    names |= _sample_names(GatewayMetrics(lambda: {}, lambda: {}).registry)
    autoscaler = CollectorRegistry()
    AutoscalerMetrics(autoscaler)
    return names | _sample_names(autoscaler)


def _exprs(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_three_dashboards_exist():
    assert set(DASHBOARDS) == {"engine.json", "routing.json", "autoscaling.json"}


def test_dashboards_are_what_build_py_writes():
    result = subprocess.run([sys.executable, str(ROOT / "dashboards" / "build.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_matches_grafana_schema(name):
    dashboard = json.loads(DASHBOARDS[name].read_text())
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(dashboard)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_layout_and_variables(name):
    dashboard = json.loads(DASHBOARDS[name].read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["namespace"]["type"] == variables["service"]["type"] == "query"
    panels = dashboard["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    for p in panels:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
    # no two panels overlap on the grid
    cells = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    for expr in _exprs(dashboard):
        if "label_values" not in expr:
            assert '$namespace' in expr and '$service' in expr or "${service" in expr, expr
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_invalid_dashboard_is_rejected():
    bad = json.loads(DASHBOARDS["engine.json"].read_text())
    bad["panels"][1]["datasource"] = {"type": "prometheus", "uid": "hard-coded-uid"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
    bad = json.loads(DASHBOARDS["engine.json"].read_text())
    bad["panels"][1]["gridPos"]["w"] = 30
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_required_panels_are_there():
    def titles(name):
        return " | ".join(p["title"].lower() for p in json.loads(DASHBOARDS[name].read_text())["panels"])

    engine, routing, scaling = titles("engine.json"), titles("routing.json"), titles("autoscaling.json")
    for word in ("running", "waiting", "kv cache", "hit rate", "time to first token", "inter-token",
                 "end-to-end", "tokens / s", "preemptions"):
        assert word in engine, word
    for word in ("requests / s", "error", "reason", "predicted", "realized", "per endpoint", "per pod"):
        assert word in routing, word
    for word in ("desired vs ready", "queue depth", "target", "scale events"):
        assert word in scaling, word


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_metric_is_exported_by_our_code(name, exported):
    dashboard = json.loads(DASHBOARDS[name].read_text())
    used = {m for expr in _exprs(dashboard) for m in METRIC.findall(expr)}
    assert used, "a dashboard that reads no metric"
    missing = used - exported
    assert not missing, f"{name} reads metrics no registry exports: {sorted(missing)}"
    for expr in _exprs(dashboard):
        # anything else that looks like a selector's metric name must be ours too
        for word in re.findall(r"\b([a-zA-Z_][a-zA-Z0-9_:]*)\s*\{", expr):
            assert word in exported or word.startswith("$"), (word, expr)


def test_metric_check_catches_a_renamed_metric(exported):
    assert "vllm:kv_cache_usage_perc" in exported
    assert "vllm:gpu_cache_usage_perc" not in exported  # vLLM's old name (docs/design.md "Pitfalls")
    assert "pagedkube_gateway_routing_decisions_total" in exported
    assert "vllm:time_to_first_token_seconds_bucket" in exported
    assert "pagedkube_autoscaler_scale_events_total" in exported

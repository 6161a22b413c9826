"""Every query of every dashboard, evaluated by a real Prometheus that scraped the
`pagedkube up --autoscale` stack under the scripted load (conftest.py, tier_load.py).

For each dashboard and for two variable selections (Grafana's "All", and the one
value each variable query finds), every panel target and annotation is
interpolated as Grafana would (dashboards/grafana.py) and sent to
/api/v1/query_range over the load's window. Each must parse and evaluate, and
each must return data, unless ALLOWED_EMPTY names it and says why.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tier_stack import NAMESPACE, REPORT_KEY, ROOT, SCRAPE_INTERVAL_S, SERVICE

DASHBOARDS = ROOT / "dashboards"
# (dashboard, panel title, refId) -> why the load leaves it empty.
ALLOWED_EMPTY = {
    ("routing.json", "Error ratio (4xx and 5xx)", "A"):
        "5xx share: the run has no 5xx (no engine failed or shed load); the 4xx target has data",
    ("routing.json", "Upstream retries / s", "A"):
        "no retry: no engine refused a connection or answered 5xx during the run",
}
# What each dashboard's variables must offer: the labels the scrape attached (tier_stack.py).
EXPECTED_OPTIONS = {
    "engine.json": {"namespace": NAMESPACE, "service": f"{SERVICE}-engine"},
    "routing.json": {"namespace": NAMESPACE, "service": SERVICE},
    "autoscaling.json": {"namespace": NAMESPACE, "service": SERVICE},
}


def _grafana():
    spec = importlib.util.spec_from_file_location("dashboards_grafana", DASHBOARDS / "grafana.py")
    module = sys.modules.setdefault("dashboards_grafana", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


grafana = _grafana()


def _queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every panel target and annotation."""
    out = [(panel["title"], target["refId"], target["expr"]) for panel, target in grafana.panel_targets(dashboard)]
    out += [(f"annotation: {a['name']}", "-", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    return out


def _selections(prom, dashboard: dict, name: str, window) -> list:
    """Grafana's default "All", then the single value each variable query offers."""
    variables = dashboard["templating"]["list"]
    picked = grafana.Selection()
    for variable in variables:
        if variable["type"] != "query":
            continue
        options = grafana.variable_values(prom, variable, variables, picked, window)
        expected = EXPECTED_OPTIONS[name][variable["name"]]
        assert options == [expected], f"{name}: variable {variable['name']} offers {options}, expected [{expected}]"
        picked.values[variable["name"]] = options
    return [grafana.Selection(), picked]


def test_every_dashboard_query_evaluates_and_shows_data(loaded, prometheus, request, tmp_path):
    prom = grafana.Prometheus(prometheus.url)
    window = grafana.TimeRange(loaded.start - 5, loaded.end, SCRAPE_INTERVAL_S)
    report = {"evaluated": 0, "panels": 0, "with_data": 0, "allowed_empty": [], "missing": [], "errors": [],
              "window_s": round(window.end - window.start, 1), "load": {"statuses": loaded.statuses,
                                                                     "engines": loaded.engines}}
    seen_allowed = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        report["panels"] += len([p for p in dashboard["panels"] if p.get("targets")])
        variables = dashboard["templating"]["list"]
        for selection in _selections(prom, dashboard, path.name, window):
            for title, ref, expr in _queries(dashboard):
                query = grafana.interpolate(expr, variables, selection, window)
                item = {"dashboard": path.name, "panel": title, "ref": ref, "expr": query}
                report["evaluated"] += 1
                try:
                    result = prom.query_range(query, window.start, window.end, window.interval)
                except grafana.QueryError as e:
                    report["errors"].append({**item, "error": str(e)})
                    continue
                if grafana.has_data(result):
                    report["with_data"] += 1
                elif (path.name, title, ref) in ALLOWED_EMPTY:
                    if (path.name, title, ref) not in seen_allowed:
                        seen_allowed.add((path.name, title, ref))
                        report["allowed_empty"].append({**item, "reason": ALLOWED_EMPTY[(path.name, title, ref)]})
                else:
                    report["missing"].append(item)
    request.config.stash[REPORT_KEY] = report
    assert not report["errors"], json.dumps(report["errors"], indent=1)
    assert not report["missing"], json.dumps(report["missing"], indent=1)


def test_render_script_draws_every_dashboard(loaded, prometheus, tmp_path):
    out = tmp_path / "img"
    result = subprocess.run([sys.executable, str(DASHBOARDS / "render.py"), "--prometheus", prometheus.url,
                             "--start", f"{loaded.start - 5:.3f}", "--end", f"{loaded.end:.3f}",
                             "--scrape-interval", f"{SCRAPE_INTERVAL_S:g}", "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["dashboard-autoscaling.png", "dashboard-engine.png", "dashboard-routing.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    if os.environ.get("PAGEDKUBE_RENDER_DOCS"):   # refresh the pictures of docs/observability.md
        docs = ROOT / "docs" / "img"
        for p in pngs:
            (docs / p).write_bytes((out / p).read_bytes())

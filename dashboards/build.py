"""Writes the three Grafana dashboards (engine.json, routing.json, autoscaling.json).

    python dashboards/build.py          # rewrite the JSON files next to this script
    python dashboards/build.py --check  # exit 1 if they differ from what this script writes

The JSON is the artefact (Grafana imports it, the Helm chart ships it); this script
keeps three dashboards consistent: the same variables (datasource, namespace,
service), the same layout rules and the same metric-name conventions. Metric names
are a contract (docs/design.md "Pitfalls"): tests/packaging/test_dashboards.py checks every name
used here against the engine's and gateway's Prometheus registries.

Label conventions: Prometheus Operator scrapes (the operator's ServiceMonitor, the
chart's PodMonitor) attach `namespace`, `service` and `pod`. The engine Service of
LLMService NAME is NAME-engine and its gateway Service is NAME, so the engine
dashboard's `service` lists NAME-engine and the others list NAME.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"


def variables(service_metric: str) -> dict:
    def query_var(name: str, label: str, query: str) -> dict:
        return {"type": "query", "name": name, "label": label, "datasource": DS,
                "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
                "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*", "sort": 1,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}

    return {"list": [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        query_var("namespace", "Namespace", f"label_values({service_metric}, namespace)"),
        query_var("service", "Service", f'label_values({service_metric}{{namespace=~"$namespace"}}, service)'),
    ]}


class Layout:
    """Places panels left to right, 24 grid units per row, and numbers them."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"id": len(self.panels) + 1, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []})
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0

    def panel(self, title: str, targets: list[tuple[str, str]], unit: str = "short", w: int = 8,
              h: int = 8, kind: str = "timeseries", description: str = "") -> None:
        if self.x + w > 24:
            self._newline()
        panel = {
            "id": len(self.panels) + 1, "type": kind, "title": title, "description": description,
            "datasource": DS, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": ({"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                         "tooltip": {"mode": "multi", "sort": "desc"}} if kind == "timeseries"
                        else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                              "colorMode": "value", "graphMode": "area"}),
            "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend,
                         "range": True} for i, (expr, legend) in enumerate(targets)],
        }
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def dashboard(uid: str, title: str, description: str, service_metric: str, layout: Layout,
              annotations: list[dict] | None = None) -> dict:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["pagedkube"],
        "timezone": "browser", "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": variables(service_metric),
        "annotations": {"list": [{"builtIn": 1, "type": "dashboard", "name": "Annotations & Alerts",
                                  "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)"}]
                        + (annotations or [])},
        "links": [{"type": "dashboards", "tags": ["pagedkube"], "title": "pagedkube", "asDropdown": True}],
        "panels": layout.panels,
    }


def quantiles(metric: str, sel: str, qs=(0.5, 0.9, 0.99), label: str = "") -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{sel}{RATE})))",
             f"{label}p{int(q * 100)}") for q in qs]


def engine() -> dict:
    sel = '{namespace=~"$namespace", service=~"$service"}'
    lay = Layout()
    lay.row("Load")
    lay.panel("Running requests", [(f"sum by (pod) (vllm:num_requests_running{sel})", "{{pod}}")])
    lay.panel("Waiting requests", [(f"sum by (pod) (vllm:num_requests_waiting{sel})", "{{pod}}")],
              description="Queue depth per engine; the autoscaler's input.")
    lay.panel("KV cache usage", [(f"max by (pod) (vllm:kv_cache_usage_perc{sel})", "{{pod}}")], unit="percentunit")
    lay.row("Prefix cache")
    lay.panel("Prefix-cache hit rate (tokens)", [
        (f"sum(rate(vllm:prefix_cache_hits_total{sel}{RATE})) / sum(rate(vllm:prefix_cache_queries_total{sel}{RATE}))",
         "all engines"),
        (f"sum by (pod) (rate(vllm:prefix_cache_hits_total{sel}{RATE})) / "
         f"sum by (pod) (rate(vllm:prefix_cache_queries_total{sel}{RATE}))", "{{pod}}")], unit="percentunit", w=12)
    lay.panel("Preemptions / s", [(f"sum by (pod) (rate(vllm:num_preemptions_total{sel}{RATE}))", "{{pod}}")],
              unit="ops", w=12, description="Requests preempted (recomputed) because KV blocks ran out.")
    lay.row("Latency")
    lay.panel("Time to first token", quantiles("vllm:time_to_first_token_seconds", sel), unit="s")
    lay.panel("Inter-token latency", quantiles("vllm:inter_token_latency_seconds", sel), unit="s")
    lay.panel("End-to-end request latency", quantiles("vllm:e2e_request_latency_seconds", sel), unit="s")
    lay.panel("Queue time", quantiles("vllm:request_queue_time_seconds", sel, (0.5, 0.99)), unit="s")
    lay.row("Throughput")
    lay.panel("Tokens / s", [(f"sum(rate(vllm:prompt_tokens_total{sel}{RATE}))", "prompt (prefill)"),
                             (f"sum(rate(vllm:generation_tokens_total{sel}{RATE}))", "generation")], unit="short")
    lay.panel("Finished requests / s", [
        (f"sum by (finished_reason) (rate(vllm:request_success_total{sel}{RATE}))", "{{finished_reason}}")],
        unit="reqps")
    return dashboard("pagedkube-engine", "pagedkube / Engine",
                     "Engine pods: batch, KV cache, prefix cache, latency and throughput (vLLM metric names).",
                     "vllm:num_requests_running", lay)


def routing() -> dict:
    sel = '{namespace=~"$namespace", service=~"$service"}'
    engines = '{namespace=~"$namespace", service=~"${service:regex}-engine"}'
    lay = Layout()
    lay.row("Traffic")
    lay.panel("Requests / s by code", [
        (f"sum by (code) (rate(pagedkube_gateway_requests_total{sel}{RATE}))", "{{code}}")], unit="reqps")
    lay.panel("Error ratio (4xx and 5xx)", [
        (f'sum(rate(pagedkube_gateway_requests_total{{namespace=~"$namespace", service=~"$service", code=~"5.."}}{RATE}))'
         f" / sum(rate(pagedkube_gateway_requests_total{sel}{RATE}))", "5xx"),
        (f'sum(rate(pagedkube_gateway_requests_total{{namespace=~"$namespace", service=~"$service", code=~"4.."}}{RATE}))'
         f" / sum(rate(pagedkube_gateway_requests_total{sel}{RATE}))", "4xx")], unit="percentunit")
    lay.panel("Gateway latency", quantiles("pagedkube_gateway_request_duration_seconds", sel, (0.5, 0.99),
                                           "duration ")
              + quantiles("pagedkube_gateway_time_to_first_token_seconds", sel, (0.5,), "TTFT "), unit="s",
              description="Request duration p50/p99 and streaming TTFT p50, as the client sees them.")
    lay.row("Routing decisions")
    lay.panel("Decisions / s by reason", [
        (f"sum by (reason) (rate(pagedkube_gateway_routing_decisions_total{sel}{RATE}))", "{{reason}}")],
        unit="ops", w=12, description="affinity: deepest cached prefix; ring: bounded-load consistent hashing; "
                                      "overflow: the preferred pod was over the load bound.")
    lay.panel("Upstream retries / s", [
        (f"sum by (cause) (rate(pagedkube_gateway_upstream_retries_total{sel}{RATE}))", "{{cause}}")],
        unit="ops", w=12)
    lay.row("Cache hits: predicted vs realized")
    lay.panel("Cached prompt tokens / s", [
        (f"sum(rate(pagedkube_gateway_predicted_cached_tokens_total{sel}{RATE}))", "predicted by the gateway"),
        (f"sum(rate(pagedkube_gateway_realized_cached_tokens_total{sel}{RATE}))", "realized by the engines")],
        w=12)
    lay.panel("Realized / predicted", [
        (f"sum(rate(pagedkube_gateway_realized_cached_tokens_total{sel}{RATE})) / "
         f"sum(rate(pagedkube_gateway_predicted_cached_tokens_total{sel}{RATE}))", "ratio")],
        unit="percentunit", w=12, description="Near 1 when the gateway's view of the engines' caches is accurate.")
    lay.row("Per-pod load")
    lay.panel("In-flight requests per endpoint", [
        (f"sum by (endpoint) (pagedkube_gateway_endpoint_in_flight{sel})", "{{endpoint}}")])
    lay.panel("Engine queue per pod", [(f"sum by (pod) (vllm:num_requests_waiting{engines})", "{{pod}}")])
    lay.panel("Endpoints by state", [(f"sum by (state) (pagedkube_gateway_endpoints{sel})", "{{state}}")])
    return dashboard("pagedkube-routing", "pagedkube / Routing",
                     "Gateway: traffic, errors, routing decisions, predicted vs realized prefix-cache hits, per-pod load.",
                     "pagedkube_gateway_requests_total", lay)


def autoscaling() -> dict:
    sel = '{namespace=~"$namespace", service=~"$service"}'
    engines = '{namespace=~"$namespace", service=~"${service:regex}-engine"}'
    lay = Layout()
    lay.row("Replicas")
    lay.panel("Desired vs ready replicas", [
        (f"max(pagedkube_autoscaler_desired_replicas{sel})", "desired"),
        (f"max(pagedkube_autoscaler_ready_replicas{sel})", "ready")], w=16)
    lay.panel("Ready replicas", [(f"max(pagedkube_autoscaler_ready_replicas{sel})", "ready")], kind="stat", w=8)
    lay.row("Queue depth")
    lay.panel("Queue depth per ready engine vs target", [
        (f"max(pagedkube_autoscaler_queue_depth{sel})", "queue depth"),
        (f"max(pagedkube_autoscaler_target_queue_depth{sel})", "target")], w=16)
    lay.panel("Waiting requests (engines)", [(f"sum(vllm:num_requests_waiting{engines})", "waiting")],
              kind="stat", w=8)
    lay.panel("Held requests (scale from zero)", [(f"sum(pagedkube_autoscaler_held_requests{sel})", "held")],
              w=16, description="Requests the gateway holds while no engine is ready; they go out when one is.")
    lay.panel("Acting replica (Lease holder)", [(f"max by (pod) (pagedkube_autoscaler_leader{sel})", "{{pod}}")],
              kind="stat", w=8, description="1 on the gateway replica that holds the autoscaler Lease.")
    lay.row("Scale events")
    lay.panel("Scale events", [
        (f"sum by (direction) (increase(pagedkube_autoscaler_scale_events_total{sel}[5m]))", "{{direction}}")],
        unit="short", w=16)
    lay.panel("Scale events in range", [
        (f"sum by (direction) (increase(pagedkube_autoscaler_scale_events_total{sel}[$__range]))", "{{direction}}")],
        kind="stat", w=8)
    marks = [{"name": "Scale events", "enable": True, "iconColor": "orange", "datasource": DS,
              "expr": f"sum(changes(pagedkube_autoscaler_desired_replicas{sel}[2m])) > 0",
              "titleFormat": "desired replicas changed", "step": "60s"}]
    return dashboard("pagedkube-autoscaling", "pagedkube / Autoscaling",
                     "Queue-depth autoscaler: desired vs ready replicas, queue depth vs target, scale events.",
                     "pagedkube_autoscaler_desired_replicas", lay, annotations=marks)


DASHBOARDS = {"engine.json": engine, "routing.json": routing, "autoscaling.json": autoscaling}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = HERE / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale dashboards, run python dashboards/build.py:", ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

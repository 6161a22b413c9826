"""What Grafana does to a dashboard's PromQL before Prometheus sees it, without Grafana.

Grafana (AGPL) is never installed or run here; the dashboards are checked and
drawn by evaluating their queries through Prometheus' HTTP API after the same
substitutions Grafana's Prometheus data source makes:

* `$__interval`: the query step, (to - from) / max data points, rounded as
  Grafana's `rangeutil.roundInterval` rounds it, never under the data source's
  scrape interval.
* `$__rate_interval`: max($__interval + scrape interval, 4 x scrape interval)
  (Grafana 7.2+), so a rate() always spans at least four scrapes.
* `$__range`: the whole time range in seconds, as `<N>s`.
* query variables (`$namespace`, `${service}`, `${service:regex}`): with
  "All" selected and a custom allValue (".*" in our dashboards) the allValue
  goes in verbatim, unformatted (Grafana skips formatting of custom all values);
  one value goes in regex-escaped; several go in as `(a|b)`.
* `label_values(metric{...}, label)` variable queries list the label's values
  over the series that match.

Plain module (no package): dashboards/render.py and tests/prometheus load it by path.
"""
from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

# Grafana's default "max data points" for a panel is its width in pixels; a
# half-width panel on a 1920 px screen is ~900 px. Our render script uses 300.
DEFAULT_MAX_DATA_POINTS = 900
# Grafana's rangeutil.roundInterval: (upper bound in ms, rounded value in ms), first match wins.
_ROUND_MS = [(15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000), (3500, 2000),
             (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000), (90000, 60000),
             (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
             (2700000, 1800000), (5400000, 3600000), (9000000, 7200000), (16200000, 10800000),
             (32400000, 21600000), (86400000, 43200000)]
_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)")
_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", re.S)


def round_interval_ms(ms: float) -> int:
    for bound, value in _ROUND_MS:
        if ms < bound:
            return value
    return 86400000


def duration(seconds: float) -> str:
    """Seconds as a PromQL duration: 4s, 1500ms."""
    ms = int(round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(slots=True)
class TimeRange:
    start: float                  # unix seconds
    end: float
    scrape_interval: float        # the data source's "Scrape interval" setting
    max_data_points: int = DEFAULT_MAX_DATA_POINTS

    @property
    def interval(self) -> float:
        raw_ms = (self.end - self.start) * 1000 / self.max_data_points
        return max(self.scrape_interval, round_interval_ms(raw_ms) / 1000)

    @property
    def rate_interval(self) -> float:
        return max(self.interval + self.scrape_interval, 4 * self.scrape_interval)

    def builtins(self) -> dict[str, str]:
        return {"__interval": duration(self.interval), "__rate_interval": duration(self.rate_interval),
                "__range": f"{int(math.ceil(self.end - self.start))}s",
                "__interval_ms": str(int(self.interval * 1000))}


@dataclass(slots=True)
class Selection:
    """The values picked for each query variable; ALL means the "All" option."""
    values: dict[str, list[str]] = field(default_factory=dict)

    ALL = "$__all"


def _escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(r"\\\1", value)


def interpolate(expr: str, variables: list[dict], selection: Selection, time_range: TimeRange) -> str:
    """`expr` as Grafana's Prometheus data source sends it."""
    by_name = {v["name"]: v for v in variables}
    builtins = time_range.builtins()

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name in builtins:
            return builtins[name]
        variable = by_name.get(name)
        if variable is None or variable["type"] == "datasource":
            return match.group(0)
        picked = selection.values.get(name, [Selection.ALL])
        if picked == [Selection.ALL]:
            if variable.get("allValue") is not None:
                return variable["allValue"]     # custom all value: verbatim, unformatted
            picked = variable.get("options_values", [])
        escaped = [_escape(v) for v in picked]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return _VARIABLE.sub(replace, expr)


class Prometheus:
    """The few calls of Prometheus' HTTP API (v1) the checks and the render script need."""

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: list[tuple[str, str]]) -> dict:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:   # 400/422: a bad query; the body says why
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", [("query", expr), ("start", f"{start:.3f}"),
                                                 ("end", f"{end:.3f}"), ("step", f"{step:g}")])["result"]

    def label_values(self, match: str, label: str, start: float, end: float) -> list[str]:
        data = self._get(f"/api/v1/label/{label}/values", [("match[]", match), ("start", f"{start:.3f}"),
                                                           ("end", f"{end:.3f}")])
        return sorted(data)

    def targets(self) -> list[dict]:
        return self._get("/api/v1/targets", [("state", "active")])["activeTargets"]


class QueryError(Exception):
    pass


def variable_values(prom: Prometheus, variable: dict, variables: list[dict], selection: Selection,
                    time_range: TimeRange) -> list[str]:
    """The options of a `label_values(metric{...}, label)` query variable."""
    match = _LABEL_VALUES.match(variable["query"]["query"])
    if match is None:
        raise ValueError(f"variable {variable['name']}: not a label_values() query: {variable['query']['query']}")
    selector = interpolate(match.group(1), variables, selection, time_range)
    return prom.label_values(selector, match.group(2), time_range.start, time_range.end)


def has_data(result: list[dict]) -> bool:
    """At least one series with a finite value (Grafana draws NaN and Inf as gaps)."""
    return any(math.isfinite(float(v)) for series in result for _, v in series.get("values", []))


def panel_targets(dashboard: dict) -> list[tuple[dict, dict]]:
    """(panel, target) for every query of every panel, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for inner in [panel] + list(panel.get("panels", [])):
            for target in inner.get("targets", []):
                if target.get("expr"):
                    out.append((inner, target))
    return out

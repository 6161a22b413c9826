"""Draws each Grafana dashboard's panels from a Prometheus run, one PNG per dashboard.

    python dashboards/render.py --prometheus http://127.0.0.1:9090 --start T0 --end T1 --out docs/img

Grafana (AGPL) is not used: every panel target is interpolated as Grafana
would with "All" selected (grafana.py), evaluated through Prometheus'
query_range API, and drawn with matplotlib at the panel's gridPos, so a reader
sees what the dashboards show before installing anything. The Prometheus tier
(tests/prometheus) runs it against its stack; PAGEDKUBE_RENDER_DOCS=1 there
refreshes docs/img/dashboard-*.png.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import grafana  # noqa: E402

ROW_UNIT_IN = 0.32          # inches per gridPos height unit
WIDTH_IN = 18.0             # 24 gridPos width units
TITLE_IN, BOTTOM_IN = 0.6, 0.3   # room for the dashboard title and the last row's axis label
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str, labels: dict) -> str:
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt or "") or json.dumps(labels)


def scale_for(unit: str) -> tuple[float, str]:
    return (100.0, "%") if unit == "percentunit" else (1.0, {"s": "seconds", "reqps": "req/s", "ops": "ops/s"}.get(
        unit, ""))


def draw_dashboard(dashboard: dict, prom: grafana.Prometheus, window: grafana.TimeRange, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height = rows * ROW_UNIT_IN + TITLE_IN + BOTTOM_IN
    fig = plt.figure(figsize=(WIDTH_IN, height))
    fig.suptitle(dashboard["title"], x=0.01, ha="left", fontsize=14, fontweight="bold")
    top = 1 - TITLE_IN / height
    unit_h = (top - BOTTOM_IN / height) / rows
    variables = dashboard["templating"]["list"]
    for panel in panels:
        g = panel["gridPos"]
        left, bottom = g["x"] / 24, top - (g["y"] + g["h"]) * unit_h
        if panel["type"] == "row":
            fig.text(left + 0.005, bottom + 0.2 * unit_h, panel["title"], fontsize=11, fontweight="bold")
            continue
        ax = fig.add_axes((left + 0.035, bottom + 0.9 * unit_h, g["w"] / 24 - 0.045, (g["h"] - 1.9) * unit_h))
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        factor, label = scale_for(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))
        series = []
        for target in panel.get("targets", []):
            expr = grafana.interpolate(target["expr"], variables, grafana.Selection(), window)
            for s in prom.query_range(expr, window.start, window.end, window.interval):
                points = [(float(t) - window.start, float(v) * factor) for t, v in s["values"]]
                series.append((legend(target.get("legendFormat", ""), s["metric"]), points))
        if panel["type"] == "stat":
            ax.axis("off")
            last = [p[-1][1] for _, p in series if p]
            ax.text(0.5, 0.45, f"{last[-1]:.3g}" if last else "No data", ha="center", va="center", fontsize=22,
                    transform=ax.transAxes, color="tab:green" if last else "gray")
            continue
        for name, points in series:
            ax.plot([t for t, _ in points], [v for _, v in points], label=name, linewidth=1.2)
        if not series:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="gray")
        else:
            ax.legend(fontsize=6, loc="upper left", ncols=min(4, len(series)), frameon=False)
        ax.set_ylabel(label, fontsize=7)
        ax.set_xlabel("seconds into the run", fontsize=7)
        ax.grid(alpha=0.3)
    path = out / f"dashboard-{dashboard['uid'].removeprefix('pagedkube-')}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", required=True, help="Prometheus base URL")
    p.add_argument("--start", type=float, required=True, help="unix seconds")
    p.add_argument("--end", type=float, required=True, help="unix seconds")
    p.add_argument("--scrape-interval", type=float, default=15.0, help="seconds, as the Grafana data source says")
    p.add_argument("--max-data-points", type=int, default=300)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    prom = grafana.Prometheus(args.prometheus)
    window = grafana.TimeRange(args.start, args.end, args.scrape_interval, args.max_data_points)
    for path in sorted(HERE.glob("*.json")):
        print(draw_dashboard(json.loads(path.read_text()), prom, window, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

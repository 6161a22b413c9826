"""Copies what the chart ships from its sources into charts/pagedkube/.

    python charts/sync.py           # copy
    python charts/sync.py --check   # exit 1 if the chart's copies are stale

Helm reads files only from inside the chart folder, so the chart carries copies:
  manifests/crd.yaml                    -> files/crd.yaml (templates/crd.yaml)
  ClusterRole rules of install.yaml     -> files/operator-rules.yaml (templates/rbac.yaml)
  dashboards/*.json                     -> dashboards/ (templates/dashboards.yaml)
tests/packaging/test_chart.py also compares the rendered objects with the sources.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "pagedkube"
RULES_HEADER = "# The operator's ClusterRole rules, copied from manifests/install.yaml by charts/sync.py.\n"


def operator_rules_yaml() -> str:
    objects = [o for o in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if o]
    roles = [o for o in objects if o["kind"] == "ClusterRole"]
    if len(roles) != 1:
        raise SystemExit(f"manifests/install.yaml has {len(roles)} ClusterRoles, expected 1")
    return RULES_HEADER + yaml.safe_dump(roles[0]["rules"], sort_keys=False, default_flow_style=False)


def wanted() -> dict[Path, str]:
    out = {CHART / "files" / "crd.yaml": (ROOT / "manifests" / "crd.yaml").read_text(),
           CHART / "files" / "operator-rules.yaml": operator_rules_yaml()}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        out[CHART / "dashboards" / path.name] = path.read_text()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    files = wanted()
    extra = set((CHART / "dashboards").glob("*.json")) - set(files)
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text] + sorted(extra)
    if args.check:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run python charts/sync.py)", file=sys.stderr)
        return 1 if stale else 0
    for p in extra:
        p.unlink()
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

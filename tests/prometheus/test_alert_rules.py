"""The chart's PrometheusRule, as `helm template` renders it: `promtool check rules`
passes, and `promtool test rules` (alerts_test.yaml) shows every alert pending,
firing and resolved on synthetic series. Plus the chart's switch: off by
default, rendered only when enabled and the cluster serves the API."""
from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tier_stack import ROOT

CHART = ROOT / "charts" / "pagedkube"
API = "monitoring.coreos.com/v1/PrometheusRule"
TESTS = Path(__file__).parent / "alerts_test.yaml"
_LABEL = re.compile(r"\{\{ \$labels\.(\w+) \}\}")


@pytest.fixture(scope="module")
def helm() -> Path:
    spec = importlib.util.spec_from_file_location("binaries", ROOT / "tests" / "tools" / "binaries.py")
    binaries = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(binaries)
    return binaries.helm_path()


def render(helm: Path, *args: str, check: bool = True) -> list[dict] | subprocess.CompletedProcess:
    result = subprocess.run([str(helm), "template", "t", str(CHART), "--namespace", "pagedkube-system", *args],
                            capture_output=True, text=True, timeout=120)
    if not check:
        return result
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def rules_of(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] == "PrometheusRule"]


@pytest.fixture(scope="module")
def rule_groups(helm) -> list[dict]:
    (rule,) = rules_of(render(helm, "--set", "monitoring.prometheusRule.enabled=true", "--api-versions", API))
    return rule["spec"]["groups"]


def alerts(groups: list[dict]) -> dict[str, dict]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_promtool_checks_the_rendered_rules(rule_groups, promtool, tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts(rule_groups))} rules found" in result.stdout


def test_every_alert_fires_and_resolves_under_promtool(rule_groups, promtool, tmp_path):
    rules = alerts(rule_groups)
    assert set(rules) == {"PagedkubeEngineDown", "PagedkubeKVCacheNearlyFull", "PagedkubeTTFTHigh",
                          "PagedkubeEngineNotReady", "PagedkubeEndpointsEjected", "PagedkubeHighErrorRatio",
                          "PagedkubeCacheFeedLagging", "PagedkubeQueueAboveTarget",
                          "PagedkubeAutoscalerAtMaxReplicas"}
    suite = yaml.safe_load(TESTS.read_text())
    firing, quiet = set(), set()
    for case in suite["tests"]:
        for check in case["alert_rule_test"]:
            name = check["alertname"]
            (firing if check["exp_alerts"] else quiet).add(name)
            for expected in check["exp_alerts"]:
                labels = expected["exp_labels"]
                expected["exp_annotations"] = {
                    key: _LABEL.sub(lambda m: str(labels[m.group(1)]), text)
                    for key, text in rules[name]["annotations"].items()}
                assert not any("{{" in v for v in expected["exp_annotations"].values()), expected
    assert firing == set(rules) and quiet == set(rules), (set(rules) - firing, set(rules) - quiet)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(tmp_path / "alerts_test.yaml")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rule_is_off_by_default_and_needs_the_api(helm):
    assert rules_of(render(helm)) == []
    assert rules_of(render(helm, "--api-versions", API)) == []
    assert rules_of(render(helm, "--set", "monitoring.prometheusRule.enabled=true")) == []
    (rule,) = rules_of(render(helm, "--set", "monitoring.prometheusRule.enabled=true", "--api-versions", API,
                              "--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
                              "--set-json", "monitoring.prometheusRule.ttftP99Seconds=0.5"))
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert alerts(rule["spec"]["groups"])["PagedkubeTTFTHigh"]["expr"].endswith("> 0.5")


def test_schema_rejects_bad_thresholds(helm):
    result = render(helm, "--set-json", "monitoring.prometheusRule.kvCacheUsage=2", check=False)
    assert result.returncode != 0 and "kvCacheUsage" in result.stderr
    result = render(helm, "--set", "monitoring.prometheusRule.engineDownFor=soon", check=False)
    assert result.returncode != 0 and "engineDownFor" in result.stderr

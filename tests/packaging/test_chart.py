"""The Helm chart, with the pinned helm binary and no cluster: lint and template over
several value sets, every rendered object strictly valid, the schema rejecting bad
values, and the CRD and RBAC equal to manifests/."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pagedkube"
K8S_VERSION = "1.35"          # the pinned kubectl/helm client's Kubernetes version
NAMESPACE = "pagedkube-system"
PODMONITOR_API = "monitoring.coreos.com/v1/PodMonitor"

VALUE_SETS = {
    "default": {},
    "monitoring-on": {"monitoring": {"podMonitor": {"enabled": True, "interval": "15s",
                                                    "labels": {"release": "kube-prometheus-stack"}}}},
    "monitoring-off": {"monitoring": {"podMonitor": {"enabled": False}}, "dashboards": {"enabled": False}},
    "custom-images": {"operator": {"image": {"repository": "registry.example.com/ml/pagedkube-gateway",
                                             "tag": "0.1.0-rc1", "pullPolicy": "Always"},
                                   "imagePullSecrets": [{"name": "regcred"}]}},
    "resources": {"operator": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                             "limits": {"cpu": 1, "memory": "1Gi"}},
                               "nodeSelector": {"kubernetes.io/os": "linux"},
                               "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra",
                                                "effect": "NoSchedule"}],
                               "priorityClassName": "system-cluster-critical",
                               "podAnnotations": {"sidecar.istio.io/inject": "false"}}},
    "namespaced": {"operator": {"watchNamespaces": ["team-a", "team-b"], "extraArgs": ["--verbose"],
                                "modelCacheHostPath": "/var/lib/pagedkube/models"},
                   "serviceAccount": {"create": False, "name": "my-operator"},
                   "dashboards": {"namespace": "monitoring", "annotations": {"grafana_folder": "pagedkube"}},
                   "crds": {"install": True, "keep": False}},
    "no-crd": {"crds": {"install": False, "keep": True}, "rbac": {"create": False}},
}


def helm_template(helm: Path, tmp_path: Path, values: dict, api_versions=(), check=True):
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    cmd = [str(helm), "template", "t", str(CHART), "--namespace", NAMESPACE, "-f", str(values_file)]
    for api in api_versions:
        cmd += ["--api-versions", api]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if not check:
        return result
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def install_yaml() -> list[dict]:
    return [o for o in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if o]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict(name, helm, tmp_path):
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(VALUE_SETS[name]))
    result = subprocess.run([str(helm), "lint", "--strict", str(CHART), "-f", str(values_file)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("api_versions", [(), (PODMONITOR_API,)], ids=["no-prometheus-operator", "prometheus-operator"])
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_object_is_valid(name, api_versions, helm, tmp_path):
    objects = helm_template(helm, tmp_path, VALUE_SETS[name], api_versions)
    assert by_kind(objects, "Deployment")
    for obj in objects:
        if obj["kind"] == "PodMonitor":
            check_podmonitor(obj)
            continue
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION, obj["kind"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "pagedkube" or obj["kind"] == "CustomResourceDefinition"


def check_podmonitor(obj: dict) -> None:
    """No PodMonitor schema ships offline; check the fields Prometheus Operator requires."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    spec = obj["spec"]
    assert set(spec) == {"namespaceSelector", "selector", "podMetricsEndpoints"}
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "pagedkube-operator"
    for endpoint in spec["podMetricsEndpoints"]:
        assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
        # the dashboards select on `service`, which only ServiceMonitors set by themselves
        services = {(r["regex"], r["replacement"]) for r in endpoint["relabelings"] if r["targetLabel"] == "service"}
        assert services == {("(.+);engine", "${1}-engine"), ("(.+);gateway", "${1}")}


def test_a_broken_object_fails_validation():
    deployment = yaml.safe_load(yaml.safe_dump(by_kind(install_yaml(), "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_podmonitor_only_when_asked_and_the_api_exists(helm, tmp_path):
    on = VALUE_SETS["monitoring-on"]
    assert by_kind(helm_template(helm, tmp_path, on, [PODMONITOR_API]), "PodMonitor")
    assert not by_kind(helm_template(helm, tmp_path, on), "PodMonitor")
    assert not by_kind(helm_template(helm, tmp_path, {}, [PODMONITOR_API]), "PodMonitor")
    monitor = by_kind(helm_template(helm, tmp_path, on, [PODMONITOR_API]), "PodMonitor")[0]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"
    scoped = {**on, "operator": {"watchNamespaces": ["team-a"]}}
    monitor = by_kind(helm_template(helm, tmp_path, scoped, [PODMONITOR_API]), "PodMonitor")[0]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_crd_equals_manifests_and_is_kept(helm, tmp_path):
    source = yaml.safe_load((ROOT / "manifests" / "crd.yaml").read_text())
    crd = by_kind(helm_template(helm, tmp_path, {}), "CustomResourceDefinition")
    assert len(crd) == 1
    annotations = crd[0]["metadata"].pop("annotations")
    assert annotations == {"helm.sh/resource-policy": "keep"}
    assert crd[0] == source
    # and install.yaml carries the same CRD
    assert by_kind(install_yaml(), "CustomResourceDefinition")[0] == source


def test_crd_switches(helm, tmp_path):
    not_kept = by_kind(helm_template(helm, tmp_path, VALUE_SETS["namespaced"]), "CustomResourceDefinition")[0]
    assert not not_kept["metadata"].get("annotations")
    assert not by_kind(helm_template(helm, tmp_path, VALUE_SETS["no-crd"]), "CustomResourceDefinition")


def test_rbac_equals_install_yaml(helm, tmp_path):
    objects = helm_template(helm, tmp_path, {})
    role, = by_kind(objects, "ClusterRole")
    assert role["rules"] == by_kind(install_yaml(), "ClusterRole")[0]["rules"]
    binding, = by_kind(objects, "ClusterRoleBinding")
    account, = by_kind(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    deployment, = by_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert not [r for r in role["rules"] if "*" in r["verbs"] or "*" in r["resources"]]


def test_operator_deployment_matches_install_yaml(helm, tmp_path):
    """Default values give the same operator pod as manifests/install.yaml, image and labels aside."""
    chart_pod = by_kind(helm_template(helm, tmp_path, {}), "Deployment")[0]["spec"]
    plain_pod = by_kind(install_yaml(), "Deployment")[0]["spec"]
    assert chart_pod["replicas"] == plain_pod["replicas"] == 1
    assert chart_pod["strategy"] == plain_pod["strategy"] == {"type": "Recreate"}
    chart_spec, plain_spec = chart_pod["template"]["spec"], plain_pod["template"]["spec"]
    for key in ("securityContext", "volumes"):
        assert chart_spec[key] == plain_spec[key], key
    chart_c, plain_c = chart_spec["containers"][0], plain_spec["containers"][0]
    for key in ("command", "args", "env", "ports", "livenessProbe", "resources", "securityContext", "volumeMounts"):
        assert chart_c[key] == plain_c[key], key
    assert chart_c["image"] == plain_c["image"] == "ghcr.io/pagedkube/gateway:0.1.0"
    # The operator runs as the user its image creates (Dockerfile.gateway's USER), as the engine
    # and gateway pods the operator builds do.
    user = next(line.split()[1] for line in (ROOT / "Dockerfile.gateway").read_text().splitlines()
                if line.startswith("USER "))
    assert f"{chart_spec['securityContext']['runAsUser']}:{chart_spec['securityContext']['runAsGroup']}" == user


def test_values_reach_the_deployment(helm, tmp_path):
    objects = helm_template(helm, tmp_path, VALUE_SETS["custom-images"])
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/ml/pagedkube-gateway:0.1.0-rc1"
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    objects = helm_template(helm, tmp_path, VALUE_SETS["resources"])
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                 "limits": {"cpu": 1, "memory": "1Gi"}}
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "system-cluster-critical"
    objects = helm_template(helm, tmp_path, VALUE_SETS["namespaced"])
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["operator", "--namespace", "team-a", "--namespace", "team-b",
                                            "--standalone", "--model-cache-host-path", "/var/lib/pagedkube/models",
                                            "--liveness", "http://0.0.0.0:8080/healthz", "--verbose"]
    assert pod["serviceAccountName"] == "my-operator"
    assert not by_kind(objects, "ServiceAccount")
    digest = "sha256:" + "a" * 64
    objects = helm_template(helm, tmp_path, {"operator": {"image": {"repository": "r.io/gw", "tag": digest,
                                                                    "pullPolicy": "IfNotPresent"}}})
    assert by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"] == f"r.io/gw@{digest}"


def test_dashboards_ship_as_sidecar_configmaps(helm, tmp_path):
    maps = by_kind(helm_template(helm, tmp_path, {}), "ConfigMap")
    assert len(maps) == 3
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == NAMESPACE
        (filename, text), = cm["data"].items()
        assert json.loads(text) == json.loads((ROOT / "dashboards" / filename).read_text())
    moved = by_kind(helm_template(helm, tmp_path, VALUE_SETS["namespaced"]), "ConfigMap")
    assert {cm["metadata"]["namespace"] for cm in moved} == {"monitoring"}
    assert all(cm["metadata"]["annotations"] == {"grafana_folder": "pagedkube"} for cm in moved)
    assert not by_kind(helm_template(helm, tmp_path, VALUE_SETS["monitoring-off"]), "ConfigMap")


BAD_VALUES = [
    ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "pullPolicy"),
    ({"operator": {"image": {"tag": "has space"}}}, "tag"),
    ({"operator": {"image": {"repository": ""}}}, "repository"),
    ({"operator": {"watchNamespaces": "team-a"}}, "watchNamespaces"),
    ({"operator": {"watchNamespaces": ["Team_A"]}}, "watchNamespaces"),
    ({"operator": {"resources": {"limits": {"memory": "lots"}}}}, "memory"),
    ({"operator": {"resources": {"requets": {"cpu": "1"}}}}, "requets"),
    ({"operator": {"replicas": 2}}, "replicas"),
    ({"operator": {"extraArgs": ["verbose"]}}, "extraArgs"),
    ({"operator": {"modelCacheHostPath": "var/lib/models"}}, "modelCacheHostPath"),
    ({"serviceAccount": {"create": False}}, "name"),
    ({"crds": {"keep": "yes"}}, "keep"),
    ({"monitoring": {"podMonitor": {"enabled": True, "interval": "30 seconds"}}}, "interval"),
    ({"dashboards": {"enabled": "true"}}, "enabled"),
    ({"dashboards": {"labels": {"grafana_dashboard": 1}}}, "grafana_dashboard"),
    ({"bogus": 1}, "bogus"),
]


@pytest.mark.parametrize("values,word", BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_schema_rejects_bad_values(values, word, helm, tmp_path):
    result = helm_template(helm, tmp_path, values, check=False)
    assert result.returncode != 0, f"accepted {values}"
    assert "don't meet the specifications of the schema" in result.stderr, result.stderr
    assert word in result.stderr, result.stderr


def test_chart_version_follows_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == project
    import pagedkube
    assert pagedkube.__version__ == project


def test_chart_links_to_its_sources():
    """The chart reads manifests/ and dashboards/ through symlinks (Helm reads only
    files inside the chart), so a regenerated CRD or dashboard needs no copy step."""
    links = {CHART / "files" / "crd.yaml": ROOT / "manifests" / "crd.yaml",
             CHART / "files" / "install.yaml": ROOT / "manifests" / "install.yaml"}
    links |= {CHART / "dashboards" / p.name: p for p in (ROOT / "dashboards").glob("*.json")}
    assert set((CHART / "dashboards").iterdir()) == {p for p in links if p.parent.name == "dashboards"}
    for link, source in links.items():
        assert link.is_symlink() and not Path(link.readlink()).is_absolute(), link
        assert link.resolve() == source.resolve(), link


def test_package_carries_file_contents(helm, tmp_path):
    result = subprocess.run([str(helm), "package", str(CHART), "-d", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    import tarfile
    with tarfile.open(tmp_path / "pagedkube-0.1.0.tgz") as tar:
        member = tar.getmember("pagedkube/files/crd.yaml")
        assert member.isfile()
        assert tar.extractfile(member).read() == (ROOT / "manifests" / "crd.yaml").read_bytes()


def test_notes_explain_first_steps(helm):
    result = subprocess.run([str(helm), "install", "t", str(CHART), "--namespace", NAMESPACE, "--dry-run=client"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    notes = result.stdout[result.stdout.index("NOTES:"):]
    # The LLMService the notes apply is the repository's first example (same name, model, replicas).
    block = notes[notes.index("kubectl apply -f -\n") + len("kubectl apply -f -\n"):]
    shown = yaml.safe_load(textwrap.dedent(block[:block.index("  YAML\n")]))
    example = yaml.safe_load((ROOT / "manifests" / "examples" / "llmservice.yaml").read_text())
    assert shown["kind"] == example["kind"] == "LLMService"
    assert shown["metadata"]["name"] == example["metadata"]["name"]
    for key in ("model", "replicas"):
        assert shown["spec"][key] == example["spec"][key], key
    name, model = example["metadata"]["name"], example["spec"]["model"]["name"]
    for needle in (f"kubectl port-forward svc/{name} 8080:80", f'"model": "{model}"',
                   "/v1/chat/completions", "from openai import OpenAI", 'grafana_dashboard="1"',
                   "deployment/t-pagedkube-operator", "builtin://tiny"):
        assert needle in notes, needle

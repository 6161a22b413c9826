"""Hub sources by name and the model cache engine pods share (operator/builders/model.py), the
CRD's rules for them, and the status while a pod downloads (pure; no cluster)."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pagedkube.operator.builders import build_children
from pagedkube.operator.builders.model import VLLM_DOWNLOAD_SCRIPT
from pagedkube.operator.spec import LLMServiceSpec
from pagedkube.operator.status import compute_status

sys.path.insert(0, str(Path(__file__).parent))
from llms_crd_check import validate

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "manifests/crd.yaml").read_text())
NODE_CACHE = "/var/lib/pagedkube/models"


def engine_pod(model: dict, engine: dict | None = None, host_path: str = "") -> dict:
    body = {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
            "metadata": {"name": "demo", "namespace": "team-a", "uid": "u", "generation": 1},
            "spec": {"model": model, "engine": engine or {}}}
    svc = LLMServiceSpec.from_body(body)
    (deployment,) = [c for c in build_children(svc, with_service_monitor=False, model_cache_host_path=host_path)
                     if c["kind"] == "Deployment" and c["metadata"]["name"] == "demo-engine"]
    assert kubernetes_validate.validate(deployment, "1.37", strict=True) == "1.37"
    return deployment["spec"]["template"]["spec"]


def cache_volume(pod: dict) -> dict:
    (volume,) = [v for v in pod["volumes"] if v["name"] == "model-cache"]
    return volume


def test_a_gguf_in_a_hub_repo_is_fetched_by_name_into_the_named_pvc() -> None:
    pod = engine_pod({"source": "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", "cache": {"claimName": "models"}},
                     host_path=NODE_CACHE)       # the service's own claim wins over the node's folder
    (init,), (c,) = pod["initContainers"], pod["containers"]
    assert cache_volume(pod) == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}}
    assert init["args"] == ["download", "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
                            "--termination-log", "/dev/termination-log"]
    assert c["args"][:4] == ["serve", "--model", "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
                             "--served-model-name"]
    assert c["args"][4] == "SmolLM2-135M-Instruct-GGUF"      # spec.model.name unset: the repo's name
    cache_env = [{"name": "HF_HOME", "value": "/models/cache/huggingface"},
                 {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
                 {"name": "PAGEDKUBE_CACHE_DIR", "value": "/models/cache/pagedkube"}]
    assert init["env"] == cache_env
    assert [v for v in c["env"] if v in cache_env] == cache_env     # the GGUF's conversion is shared too


def test_without_a_claim_the_node_cache_else_an_empty_dir() -> None:
    assert cache_volume(engine_pod({"source": "org/m"}, host_path=NODE_CACHE)) == {
        "name": "model-cache", "hostPath": {"path": NODE_CACHE, "type": "DirectoryOrCreate"}}
    assert cache_volume(engine_pod({"source": "org/m"})) == {"name": "model-cache", "emptyDir": {}}
    assert [v["name"] for v in engine_pod({"source": "builtin://tiny"}, host_path=NODE_CACHE)["volumes"]] == ["tmp"]


def test_vllm_reads_the_same_cache_offline_at_the_named_revision() -> None:
    pod = engine_pod({"source": "hf://org/m@v2", "cache": {"claimName": "models"}}, {"runtime": "vllm"})
    (init,), (c,) = pod["initContainers"], pod["containers"]
    assert init["command"] == ["python3", "-c", VLLM_DOWNLOAD_SCRIPT] and init["args"] == ["org/m", "v2"]
    assert c["args"][:2] == ["--model", "org/m"] and c["args"][-2:] == ["--revision", "v2"]
    names = [v["name"] for v in c["env"]]
    assert len(names) == len(set(names))                  # the mount's HF_HOME, not the runtime default too
    assert {"name": "HF_HOME", "value": "/models/cache/huggingface"} in c["env"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]


def crd_object(model: dict) -> dict:
    return {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService", "metadata": {"name": "demo"},
            "spec": {"model": model}}


@pytest.mark.parametrize("source", ["Qwen/Qwen2.5-0.5B-Instruct", "hf://Qwen/Qwen2.5-0.5B-Instruct@v1.0",
                                    "org/m:Q4_K_M", "org/m:UD-Q4_K_XL@main", "hf://org/m/model.Q8_0.gguf"])
def test_the_crd_and_the_operator_accept_hub_names(source: str) -> None:
    assert validate(CRD, crd_object({"source": source, "cache": {"claimName": "models"}})) == []
    LLMServiceSpec.from_body({**crd_object({"source": source}), "metadata": {"name": "demo"}})


@pytest.mark.parametrize("model, error", [
    ({"source": "org/m", "cache": {"claimName": "Models_1"}}, "spec.model.cache.claimName: 'Models_1' does not match"),
    ({"source": "org/m", "cache": {}}, "spec.model.cache: 'claimName' is a required property"),
    ({"source": "pvc://w/m", "cache": {"claimName": "c"}}, "model.cache holds Hub downloads"),
    ({"source": "org/m:"}, "spec.model.source: 'org/m:' does not match"),
    ({"source": "s3://org/m"}, "spec.model.source: 's3://org/m' does not match"),
])
def test_the_crd_refuses_what_the_operator_would(model: dict, error: str) -> None:
    problems = validate(CRD, crd_object(model))
    assert any(error in p for p in problems), problems
    with pytest.raises(ValueError):
        LLMServiceSpec.from_body(copy.deepcopy(crd_object(model)))


def test_a_pod_downloading_is_the_ready_conditions_message() -> None:
    pod = {"metadata": {"name": "demo-engine-1"}, "status": {"initContainerStatuses": [
        {"name": "model-download", "state": {"running": {"startedAt": "2026-01-02T03:00:00Z"}}}]}}
    deployment = {"metadata": {"generation": 1}, "status": {"replicas": 1, "observedGeneration": 1}}
    s = compute_status(name="demo", namespace="ns", generation=1, desired_replicas=1, deployment=deployment,
                       pods=iter([pod]), now="2026-01-02T03:04:05Z")
    (ready,) = [c for c in s["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ModelDownloading")
    assert ready["message"] == ("0/1 engines ready; pod demo-engine-1 is downloading the model (since "
                                "2026-01-02T03:00:00Z); progress: kubectl logs demo-engine-1 -c model-download")


def test_a_failed_download_reports_its_one_line_reason() -> None:
    pod = {"metadata": {"name": "demo-engine-1"}, "status": {"initContainerStatuses": [
        {"name": "model-download", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 2, "message": "org/m is a gated repo: accept its terms"}}}]}}
    deployment = {"metadata": {"generation": 1}, "status": {"replicas": 1, "observedGeneration": 1}}
    s = compute_status(name="demo", namespace="ns", generation=1, desired_replicas=1, deployment=deployment,
                       pods=[pod], now="2026-01-02T03:04:05Z")
    (degraded,) = [c for c in s["conditions"] if c["type"] == "Degraded"]
    assert degraded["reason"] == "ModelDownloadFailing"
    assert degraded["message"].startswith("pod demo-engine-1: the model download failed (exit code 2): "
                                          "org/m is a gated repo: accept its terms; ")

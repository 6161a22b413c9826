"""The operator's pure builders: exact children, valid against Kubernetes 1.37 (strict)."""
from __future__ import annotations

import kubernetes_validate
import pytest

from pagedkube import __version__
from pagedkube.operator import naming
from pagedkube.operator.builders import build_children
from pagedkube.operator.spec import LLMServiceSpec

K8S_VERSION = "1.37"
UID = "0b9e3a4c-1111-2222-3333-444455556666"


def body(spec: dict, name: str = "demo", namespace: str = "team-a") -> dict:
    return {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
            "metadata": {"name": name, "namespace": namespace, "uid": UID, "generation": 3}, "spec": spec}


SPECS = {
    "builtin-cpu": {"model": {"source": "builtin://tiny"}},
    "hf-gpu-autoscaled": {
        "model": {"name": "qwen", "source": "hf://Qwen/Qwen2.5-0.5B-Instruct@main",
                  "hfTokenSecretRef": {"name": "hf"}},
        "replicas": 2,
        "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8, "targetQueueDepth": 2.5},
        "engine": {"resources": {"limits": {"nvidia.com/gpu": 1, "memory": "24Gi"}},
                   "maxModelLen": 4096, "extraArgs": ["--max-waiting", "64"],
                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                   "nodeSelector": {"gpu": "h100"}, "imagePullPolicy": "Never",
                   "env": [{"name": "HF_ENDPOINT", "value": "http://mirror.internal:8080"}]},
        "gateway": {"replicas": 2, "apiKeySecretRef": {"name": "keys"},
                    "routing": {"policy": "least-load", "loadBound": 1.5}},
    },
    "pvc-vllm": {"model": {"source": "pvc://weights/llama/8b"},
                 "engine": {"runtime": "vllm", "blockSize": 32}},
    "hf-gpu-tp8": {"model": {"source": "hf://meta-llama/Llama-3.1-70B-Instruct"},
                   "engine": {"tensorParallelSize": 8, "maxModelLen": 8192,
                              "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "320Gi"}}}},
}


def children(spec_name: str, with_service_monitor: bool = True) -> dict[str, dict]:
    svc = LLMServiceSpec.from_body(body(SPECS[spec_name]))
    return {f"{c['kind']}/{c['metadata']['name']}": c
            for c in build_children(svc, with_service_monitor=with_service_monitor)}


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_every_child_is_valid_kubernetes_and_owned(spec_name: str) -> None:
    objs = children(spec_name)
    assert sorted(objs) == [
        "Deployment/demo-engine", "Deployment/demo-gateway", "NetworkPolicy/demo-engine",
        "PodDisruptionBudget/demo-engine", "Role/demo-gateway", "RoleBinding/demo-gateway", "Service/demo", "Service/demo-engine",
        "ServiceAccount/demo-gateway", "ServiceMonitor/demo"]
    for key, obj in objs.items():
        if obj["kind"] != "ServiceMonitor":  # not in the Kubernetes schemas; checked below
            assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION, key
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [{
            "apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService", "name": "demo", "uid": UID,
            "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "pagedkube-operator"
        assert meta["labels"]["pagedkube.io/llmservice"] == "demo"
        assert meta["labels"]["app.kubernetes.io/instance"] == "demo"


def test_strict_validation_really_rejects_unknown_fields() -> None:
    deployment = children("builtin-cpu")["Deployment/demo-engine"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_status_selector_selects_the_engine_pods_and_nothing_else() -> None:
    objs = children("builtin-cpu")
    selector = dict(part.split("=") for part in naming.engine_selector("demo").split(","))
    engine_pod_labels = objs["Deployment/demo-engine"]["spec"]["template"]["metadata"]["labels"]
    gateway_pod_labels = objs["Deployment/demo-gateway"]["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= engine_pod_labels.items()
    assert not selector.items() <= gateway_pod_labels.items()
    assert objs["Deployment/demo-engine"]["spec"]["selector"]["matchLabels"] == selector
    assert objs["Service/demo-engine"]["spec"]["selector"] == selector
    assert objs["PodDisruptionBudget/demo-engine"]["spec"]["selector"]["matchLabels"] == selector
    assert naming.engine_selector("demo") == (
        "app.kubernetes.io/component=engine,app.kubernetes.io/instance=demo,app.kubernetes.io/name=pagedkube")


def test_builtin_engine_on_cpu() -> None:
    d = children("builtin-cpu")["Deployment/demo-engine"]
    pod = d["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert d["spec"]["replicas"] == 1
    assert c["image"] == f"ghcr.io/pagedkube/engine:{__version__}"
    assert c["command"] == ["pagedkube"]
    assert c["args"] == ["serve", "--model", "builtin://tiny", "--served-model-name", "tiny", "--host", "0.0.0.0", "--port", "8000",
                         "--block-size", "16", "--max-num-seqs", "256", "--drain-timeout", "30",
                         "--tool-call-parser", "auto", "--structured-outputs-backend", "auto"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert pod["terminationGracePeriodSeconds"] == 5 + 30 + 10
    assert c["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert "initContainers" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_hf_model_is_downloaded_by_an_init_container_into_the_model_cache_on_gpu() -> None:
    objs = children("hf-gpu-autoscaled")
    d = objs["Deployment/demo-engine"]
    pod = d["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (c,) = pod["containers"]
    assert d["spec"]["replicas"] == 2
    assert init["name"] == "model-download"
    assert init["image"] == c["image"]
    assert init["command"] == ["pagedkube"]
    # its one-line error is the termination message the LLMService's status shows
    assert init["args"] == ["download", "Qwen/Qwen2.5-0.5B-Instruct@main", "--termination-log", "/dev/termination-log"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}} in init["env"]
    # spec.engine.env and the pull policy reach the download too (a Hub mirror via HF_ENDPOINT)
    mirror = {"name": "HF_ENDPOINT", "value": "http://mirror.internal:8080"}
    assert mirror in c["env"] and mirror in init["env"]
    assert init["imagePullPolicy"] == c["imagePullPolicy"] == "Never"
    # No spec.model.cache and no node cache: an emptyDir holds HF_HOME; the engine reads it offline.
    assert {"name": "model-cache", "emptyDir": {}} in pod["volumes"]
    cache = {"name": "model-cache", "mountPath": "/models/cache"}
    assert cache in c["volumeMounts"] and cache in init["volumeMounts"]
    home = {"name": "HF_HOME", "value": "/models/cache/huggingface"}
    assert home in c["env"] and home in init["env"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    assert "HF_HUB_OFFLINE" not in {v["name"] for v in init["env"]}
    assert c["args"] == ["serve", "--model", "Qwen/Qwen2.5-0.5B-Instruct@main", "--served-model-name", "qwen",
                         "--host", "0.0.0.0", "--port", "8000", "--block-size", "16", "--max-num-seqs", "256",
                         "--max-model-len", "4096", "--drain-timeout", "256", "--tool-call-parser", "auto",
                         "--structured-outputs-backend", "auto", "--device", "cuda", "--max-waiting", "64"]
    # No drainTimeoutSeconds: long enough for a 4096-token answer at 20 tokens/s (x 1.25), the
    # scale-in's rule; the pod's grace covers preStop (5 s), the drain and 10 s to exit.
    assert pod["terminationGracePeriodSeconds"] == 5 + 256 + 10
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 1, "memory": "24Gi"}}
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_gateway_points_at_the_engine_service_with_autoscaling_and_api_keys() -> None:
    objs = children("hf-gpu-autoscaled")
    g = objs["Deployment/demo-gateway"]
    pod = g["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert g["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "demo-gateway"
    assert c["image"] == f"ghcr.io/pagedkube/gateway:{__version__}"
    assert c["args"] == ["gateway", "--kube-service", "demo-engine", "--namespace", "team-a",
                         "--llmservice", "demo",   # its scale subresource and status.adapters
                         "--host", "0.0.0.0", "--port", "8080", "--routing", "least-load", "--load-bound", "1.5",
                         "--pending-ttl", "0",   # two gateway replicas: no pending record (pending.py)
                         "--api-keys", "/etc/pagedkube/api-keys/api-keys.yaml",
                         "--autoscale", "--min-replicas", "1", "--max-replicas", "8",
                         "--target-queue-depth", "2.5", "--engine-capacity", "256", "--scale-up-window", "0",
                         "--scale-down-window", "300"]
    assert {"name": "api-keys", "secret": {"secretName": "keys", "items": [
        {"key": "api-keys.yaml", "path": "api-keys.yaml"}]}} in pod["volumes"]
    assert {"name": "api-keys", "mountPath": "/etc/pagedkube/api-keys", "readOnly": True} in c["volumeMounts"]
    svc = objs["Service/demo"]["spec"]
    assert svc["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert svc["selector"] == naming.selector_labels("demo", "gateway")
    engine_svc = objs["Service/demo-engine"]["spec"]
    assert engine_svc["clusterIP"] == "None"
    assert engine_svc["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_probes_are_patient_on_a_loaded_node() -> None:
    """Issue 18: a 2 s /health probe restarted a busy gateway. The gateway's liveness is a TCP
    connect (the kernel answers it, not the event loop); every HTTP probe waits 10 s, and
    liveness restarts only after a minute of misses."""
    objs = children("hf-gpu-autoscaled")
    (gateway,) = objs["Deployment/demo-gateway"]["spec"]["template"]["spec"]["containers"]
    (engine,) = objs["Deployment/demo-engine"]["spec"]["template"]["spec"]["containers"]
    assert gateway["livenessProbe"] == {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "timeoutSeconds": 10,
                                        "failureThreshold": 6}
    assert gateway["readinessProbe"] == {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5,
                                         "timeoutSeconds": 10, "failureThreshold": 3}
    assert engine["livenessProbe"] == {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                                       "timeoutSeconds": 10, "failureThreshold": 6}
    assert engine["readinessProbe"]["timeoutSeconds"] == engine["startupProbe"]["timeoutSeconds"] == 10
    assert engine["readinessProbe"]["failureThreshold"] == 3


@pytest.mark.parametrize("runtime, source, variable", [("pagedkube", "builtin://tiny", "PAGEDKUBE_API_KEY"),
                                                       ("vllm", "pvc://weights/llama/8b", "VLLM_API_KEY")])
def test_engine_api_key_reaches_the_engines_and_the_gateway(runtime: str, source: str, variable: str) -> None:
    spec = {"model": {"source": source}, "engine": {"runtime": runtime, "apiKeySecretRef": {"name": "engine-key"}}}
    objs = {f"{c['kind']}/{c['metadata']['name']}": c
            for c in build_children(LLMServiceSpec.from_body(body(spec)), with_service_monitor=False)}
    ref = {"secretKeyRef": {"name": "engine-key", "key": "api-key"}}
    (engine,) = objs["Deployment/demo-engine"]["spec"]["template"]["spec"]["containers"]
    (gateway,) = objs["Deployment/demo-gateway"]["spec"]["template"]["spec"]["containers"]
    keyed = [e for e in engine["env"] if "valueFrom" in e]
    assert keyed[0] == {"name": variable, "valueFrom": ref}
    # Our engines also get the generated hash seed; vLLM seeds its own per process.
    assert keyed[1:] == ([] if runtime == "vllm" else [{"name": "PAGEDKUBE_HASH_SEED", "valueFrom": {
        "secretKeyRef": {"name": "demo-engine-secret", "key": "hash-seed"}}}])
    assert {"name": "PAGEDKUBE_ENGINE_API_KEY", "valueFrom": ref} in gateway["env"]
    # Probes and scrapes stay on the paths a keyed engine leaves open.
    assert engine["readinessProbe"]["httpGet"]["path"] in ("/ready", "/health")
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
    for obj in objs.values():
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION, obj["kind"]
    # Without the field, the generated Secret's key (tests/operator/test_security.py).


def test_gateway_role_holds_exactly_what_the_gateway_does() -> None:
    objs = children("builtin-cpu")
    assert objs["Role/demo-gateway"]["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["pagedkube.io"], "resources": ["llmservices/scale"], "verbs": ["get", "patch"],
         "resourceNames": ["demo"]},
        {"apiGroups": ["pagedkube.io"], "resources": ["llmservices"], "verbs": ["get"],   # spec.adapters
         "resourceNames": ["demo"]},
        {"apiGroups": ["pagedkube.io"], "resources": ["llmservices/status"], "verbs": ["patch"],   # status.adapters
         "resourceNames": ["demo"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
         "resourceNames": ["demo-autoscaler"]},   # the operator creates it: no create to grant
    ]
    binding = objs["RoleBinding/demo-gateway"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "demo-gateway"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-gateway", "namespace": "team-a"}]


def test_vllm_runtime_runs_the_upstream_image_with_equivalent_arguments() -> None:
    objs = children("pvc-vllm")
    pod = objs["Deployment/demo-engine"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == naming.VLLM_IMAGE
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"] == ["--model", "/models/llama/8b", "--served-model-name", "8b", "--host", "0.0.0.0",
                         "--port", "8000", "--block-size", "32", "--max-num-seqs", "256", "--enable-prefix-caching"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["ports"][0]["containerPort"] == 8000
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # Same Service and gateway; the gateway falls back to the ring without a cache feed.
    assert objs["Service/demo-engine"]["spec"]["ports"][0]["port"] == 8000
    gateway = objs["Deployment/demo-gateway"]
    assert "--kube-service" in gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    # One gateway replica: the pending record stays on (the gateway's default).
    assert gateway["spec"]["replicas"] == 1
    assert "--pending-ttl" not in gateway["spec"]["template"]["spec"]["containers"][0]["args"]


def test_tensor_parallel_engine_gets_one_gpu_per_rank_and_a_sized_shm() -> None:
    """70B on 8 GPUs in one pod: --tensor-parallel-size 8, 8 GPUs (validated equal), /dev/shm for NCCL."""
    pod = children("hf-gpu-tp8")["Deployment/demo-engine"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "8"
    assert c["args"][c["args"].index("--device") + 1] == "cuda"
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8, "memory": "320Gi"}}
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # At TP=1 (the default) the flag is absent, and a CPU engine has no /dev/shm volume.
    cpu = children("builtin-cpu")["Deployment/demo-engine"]["spec"]["template"]["spec"]
    assert "--tensor-parallel-size" not in cpu["containers"][0]["args"]
    assert all(v["name"] != "shm" for v in cpu["volumes"])


def test_tensor_parallel_on_cpu_passes_the_flag_without_gpus() -> None:
    svc = LLMServiceSpec.from_body(body({"model": {"source": "builtin://tiny"}, "engine": {"tensorParallelSize": 2}}))
    (engine,) = [c for c in build_children(svc, with_service_monitor=False) if c["metadata"]["name"] == "demo-engine"
                 and c["kind"] == "Deployment"]
    (c,) = engine["spec"]["template"]["spec"]["containers"]
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "2" and "--device" not in c["args"]
    assert kubernetes_validate.validate(engine, K8S_VERSION, strict=True) == K8S_VERSION


def test_service_monitor_scrapes_both_parts_only_when_the_crd_exists() -> None:
    sm = children("builtin-cpu")["ServiceMonitor/demo"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"] == {"selector": {"matchLabels": {"app.kubernetes.io/name": "pagedkube",
                                                       "app.kubernetes.io/instance": "demo"}},
                          "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}]}
    assert "ServiceMonitor/demo" not in children("builtin-cpu", with_service_monitor=False)


def test_pdb_allows_draining_one_engine_at_a_time() -> None:
    assert children("builtin-cpu")["PodDisruptionBudget/demo-engine"]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("spec, message", [
    ({}, "spec.model.source is required"),
    ({"model": {"source": "s3://bucket/model"}}, r"is not \[hf://\]ORG/NAME\[:QUANT\]"),
    ({"model": {"source": "org/m:Q4_K_M"}, "engine": {"runtime": "vllm"}}, "not a GGUF in it"),
    ({"model": {"source": "org/m", "cache": {"claimName": "Bad_Name"}}}, "is not a PersistentVolumeClaim name"),
    ({"model": {"source": "pvc://w/m", "cache": {"claimName": "c"}}}, "has nothing to cache"),
    ({"model": {"source": "builtin://tiny"}, "engine": {"runtime": "vllm"}}, "vllm cannot serve builtin"),
    ({"model": {"source": "builtin://tiny"}, "replicas": 9, "autoscaling": {"enabled": True, "maxReplicas": 4}},
     "must lie within autoscaling"),
    ({"model": {"source": "builtin://tiny"}, "autoscaling": {"minReplicas": 5, "maxReplicas": 4}}, "exceeds"),
    ({"model": {"source": "builtin://tiny"}, "engine": {"blockSize": 12}}, "blockSize must be one of"),
    ({"model": {"source": "builtin://tiny"}, "gateway": {"routing": {"loadBound": 0.5}}}, "loadBound"),
    ({"model": {"source": "pvc://c/../x"}}, "has a '..' segment"),
    ({"model": {"source": "pvc://claim/../../var/run/secrets/kubernetes.io"}}, "has a '..' segment"),
    ({"model": {"source": "pvc://claim/models/.."}}, "has a '..' segment"),
    ({"model": {"source": "hf://org/name@../main"}}, "has a '..' segment"),
    ({"model": {"source": "builtin://tiny"}, "gateway": {"requireApiKey": False, "apiKeySecretRef": {"name": "k"}}},
     "spec.gateway.requireApiKey false contradicts"),
    ({"model": {"source": "builtin://tiny"}, "engine": {"tensorParallelSize": 0}},
     r"spec.engine.tensorParallelSize must be an integer >= 1, got 0"),
    ({"model": {"source": "builtin://tiny"}, "engine": {"tensorParallelSize": 128}},
     r"spec.engine.tensorParallelSize must be <= 64, got 128"),
    ({"model": {"source": "hf://org/big"}, "engine": {"tensorParallelSize": 8,
                                                      "resources": {"limits": {"nvidia.com/gpu": 4}}}},
     r"spec.engine.resources.limits\[nvidia.com/gpu\] is 4, but tensorParallelSize 8 runs one rank per GPU"),
])
def test_invalid_specs_raise_clear_errors(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLMServiceSpec.from_body(body(spec))


@pytest.mark.parametrize("example, count", [("llmservice.yaml", 9), ("llmservice-gpu.yaml", 9),
                                            ("llmservice-lora.yaml", 10)])   # + the adapters' ConfigMap
def test_examples_build_valid_children(example: str, count: int) -> None:
    import pathlib
    import yaml
    doc = yaml.safe_load((pathlib.Path(__file__).resolve().parents[2] / "manifests/examples" / example).read_text())
    doc["metadata"].update(namespace="default", uid=UID)
    objs = build_children(LLMServiceSpec.from_body(doc), with_service_monitor=False)
    assert len(objs) == count
    for obj in objs:
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION

"""The LLMService CustomResourceDefinition, the source of manifests/crd.yaml (pure).

Structural schema with defaults from spec.py, enums and bounds; CEL rules for
what one field cannot say alone. `python -m pagedkube.operator.manifests`
writes the YAML; a test checks the file is up to date.
"""
from __future__ import annotations

from typing import Any

from pagedkube.model_source import PVC_CLAIM
from pagedkube.operator import adapters as lora, naming, spec as d


def _int(minimum: int | None = None, maximum: int | None = None, default: int | None = None,
         description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "format": "int32"}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    if default is not None:
        out["default"] = default
    if description:
        out["description"] = description
    return out


def _str(description: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": "string", **({"description": description} if description else {}), **extra}


def _obj(properties: dict[str, Any], description: str = "", /, **extra: Any) -> dict[str, Any]:
    return {"type": "object", **({"description": description} if description else {}),
            "properties": properties, **extra}


def _secret_ref(description: str) -> dict[str, Any]:
    return _obj({"name": _str("Secret name in the LLMService's namespace.", minLength=1, maxLength=253)},
                description, required=["name"])


QUANTITY_MAP = {
    "type": "object",
    "additionalProperties": {"x-kubernetes-int-or-string": True,
                             "anyOf": [{"type": "integer"}, {"type": "string"}]},
}
RESOURCES = _obj({"limits": QUANTITY_MAP, "requests": QUANTITY_MAP},
                 "Compute resources, as a container's (e.g. limits: {nvidia.com/gpu: 1}).")
FREE_FORM_ITEMS = {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
PULL_POLICY = _str("Image pull policy.", enum=["Always", "IfNotPresent", "Never"])

MODEL = _obj({
    "name": _str("Served model name (the `model` field of requests). Default: the source's last path part.",
                 maxLength=253),
    "source": _str("A Hugging Face Hub repo, [hf://]ORG/NAME[@REVISION], or a GGUF in one, ORG/NAME:QUANT or "
                   "ORG/NAME/FILE.gguf; pvc://CLAIM/PATH; builtin://tiny or builtin://smollm2-135m-instruct.",
                   pattern=d.SOURCE_PATTERN, maxLength=512),
    "hfTokenSecretRef": _secret_ref("Secret with key HF_TOKEN, for gated or private Hugging Face models."),
    "cache": _obj({"claimName": _str("PersistentVolumeClaim (ReadWriteMany to share it across nodes) that holds "
                                     "the Hub download cache (HF_HOME) of every engine pod.",
                                     pattern=f"^{PVC_CLAIM}$", maxLength=63)},
                  "Where a Hub source's downloads live. Default: the node-local cache when the operator has "
                  "one (--model-cache-host-path), else an emptyDir per pod.", required=["claimName"]),
}, "Which model to serve.", required=["source"], **{"x-kubernetes-validations": [{
    "rule": "!self.source.contains('://') || self.source.startsWith('hf://') || self.source.startsWith('pvc://')"
            " || self.source.startsWith('builtin://')",
    "message": "model.source must be ORG/NAME or use the hf://, pvc:// or builtin:// scheme",
}, {
    "rule": "!has(self.cache) || !self.source.contains('://') || self.source.startsWith('hf://')",
    "message": "model.cache holds Hub downloads; a pvc:// or builtin:// source has nothing to cache",
}, {
    "rule": f"!self.source.matches('{d.DOT_DOT_SEGMENT}')",
    "message": "model.source must not have a '..' segment",
}]})

AUTOSCALING = _obj({
    "enabled": {"type": "boolean", "default": False},
    "minReplicas": _int(0, 1000, d.DEFAULT_MIN_REPLICAS, "0 allows scale to zero."),
    "maxReplicas": _int(1, 1000, d.DEFAULT_MAX_REPLICAS),
    "targetQueueDepth": {"type": "number", "exclusiveMinimum": True, "minimum": 0,
                         "default": d.DEFAULT_TARGET_QUEUE_DEPTH,
                         "description": "Mean waiting requests per ready engine to aim for."},
    "scaleUpWindowSeconds": _int(0, 3600, d.DEFAULT_SCALE_UP_WINDOW_S),
    "scaleDownWindowSeconds": _int(0, 3600, d.DEFAULT_SCALE_DOWN_WINDOW_S),
}, "Queue-depth autoscaling by the gateway, through the scale subresource.",
    **{"x-kubernetes-validations": [{"rule": "self.minReplicas <= self.maxReplicas",
                                     "message": "autoscaling.minReplicas must not exceed maxReplicas"}]})

ENGINE = _obj({
    "runtime": _str("pagedkube (ours) or vllm (the upstream vllm/vllm-openai image).",
                    enum=list(d.RUNTIMES), default="pagedkube"),
    "image": _str("Engine image. Default: the runtime's image for this release."),
    "imagePullPolicy": PULL_POLICY,
    "resources": RESOURCES,
    "blockSize": {"type": "integer", "enum": list(d.BLOCK_SIZES), "default": d.DEFAULT_BLOCK_SIZE},
    "maxModelLen": _int(1, 1048576),
    "maxNumSeqs": _int(1, 65536, d.DEFAULT_MAX_NUM_SEQS),
    "maxNumBatchedTokens": _int(1, 1048576),
    "drainTimeoutSeconds": _int(0, 3600, None,
                                "How long a stopping engine lets in-flight requests finish. Default: long enough "
                                "for a maxModelLen-token answer at a slow decode rate when maxModelLen is set "
                                f"(1.25 x maxModelLen / {d.ASSUMED_DECODE_TOKENS_PER_S} s), else "
                                f"{d.DEFAULT_DRAIN_TIMEOUT_S}."),
    "extraArgs": {"type": "array", "items": {"type": "string"}, "maxItems": 64,
                  "description": "Appended to the engine command line."},
    "env": FREE_FORM_ITEMS,
    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
    "tolerations": FREE_FORM_ITEMS,
    "apiKeySecretRef": _secret_ref("Your own Secret with key api-key, instead of the generated "
                                   "<name>-engine-secret: engines want it as a bearer token on every path but "
                                   "/health, /ready and /metrics, and the gateway sends it (docs/operator.md)."),
    "toolCallParser": _str("Reads tool calls out of tool_choice=auto answers (--tool-call-parser): auto = the "
                           "format the model's chat template calls for, none = off (docs/server.md).",
                           enum=list(d.TOOL_CALL_PARSERS), default=d.DEFAULT_TOOL_CALL_PARSER),
    "structuredOutputsBackend": _str("Grammar library for structured outputs and forced tool calls "
                                     "(--structured-outputs-backend); auto = xgrammar.",
                                     enum=list(d.STRUCTURED_OUTPUTS_BACKENDS),
                                     default=d.DEFAULT_STRUCTURED_OUTPUTS_BACKEND),
    "tensorParallelSize": _int(1, d.MAX_TENSOR_PARALLEL_SIZE, d.DEFAULT_TENSOR_PARALLEL_SIZE,
                               "Ranks of one engine in its pod (--tensor-parallel-size), each holding 1/N of every "
                               "layer: GPUs per pod on GPU (resources' nvidia.com/gpu must then equal it), "
                               "processes sharing the pod's cores on CPU. Must divide the model's attention "
                               "heads, KV heads and MLP size."),
    "nodesPerReplica": _int(1, d.MAX_NODES_PER_REPLICA, 1,
                            "Pods (nodes) of one engine, each running tensorParallelSize ranks (--nnodes): the "
                            "model is split over tensorParallelSize x nodesPerReplica ranks. Above 1 the engine "
                            "is a LeaderWorkerSet (sigs.k8s.io/lws, which must be installed) of that size, one "
                            "group per replica; runtime pagedkube only."),
    "requireApiKey": {"type": "boolean", "default": True,
                      "description": "false: engines answer anyone who reaches them (no key at all). "
                                     "Default true: the generated key, or apiKeySecretRef's."},
    "maxLoras": _int(1, lora.MAX_ADAPTERS, None,
                     "LoRA adapters one engine step may run (--max-loras). Default "
                     f"{d.DEFAULT_MAX_LORAS} when spec.adapters is set. Setting it turns LoRA on even with no "
                     "adapters yet, so the first one added later restarts nothing."),
    "maxLoraRank": _int(1, 1024, None, f"Largest adapter rank accepted (--max-lora-rank); default "
                                       f"{d.DEFAULT_MAX_LORA_RANK}. A larger value costs engine memory per slot."),
}, "The engine pods.", **{"x-kubernetes-validations": [{
    "rule": "!has(self.requireApiKey) || self.requireApiKey || !has(self.apiKeySecretRef)",
    "message": "engine.requireApiKey false contradicts engine.apiKeySecretRef; drop one",
}]})

GATEWAY = _obj({
    "replicas": _int(1, 100, d.DEFAULT_GATEWAY_REPLICAS),
    "image": _str("Gateway image. Used only when the operator runs with --allow-gateway-image (the chart's "
                  "operator.allowGatewayImage); otherwise this release's image runs."),
    "imagePullPolicy": PULL_POLICY,
    "resources": RESOURCES,
    "routing": _obj({
        "policy": _str(enum=list(d.ROUTING_POLICIES), default=d.DEFAULT_ROUTING_POLICY),
        "loadBound": {"type": "number", "minimum": 1.0, "maximum": 10.0, "default": d.DEFAULT_LOAD_BOUND,
                      "description": "c in consistent hashing with bounded loads."},
    }, default={}),
    "apiKeySecretRef": _secret_ref("Your own Secret with key api-keys.yaml (keys, rate limits, tenant salts; "
                                   "docs/operator.md), instead of the generated <name>-api-key."),
    "tensorParallelSize": _int(1, d.MAX_TENSOR_PARALLEL_SIZE, d.DEFAULT_TENSOR_PARALLEL_SIZE,
                               "Ranks of one engine in its pod (--tensor-parallel-size), each holding 1/N of every "
                               "layer: GPUs per pod on GPU (resources' nvidia.com/gpu must then equal it), "
                               "processes sharing the pod's cores on CPU. Must divide the model's attention "
                               "heads, KV heads and MLP size."),
    "requireApiKey": {"type": "boolean", "default": True,
                      "description": "false: the gateway serves anyone who reaches it (no key at all). Default "
                                     "true: apiKeySecretRef's keys, or one generated key in the Secret "
                                     "<name>-api-key (key api-key)."},
    "serviceType": _str(enum=list(d.SERVICE_TYPES), default="ClusterIP"),
    "routeHeaders": {"type": "boolean", "default": False,
                     "description": "Send x-pagedkube-endpoint / x-pagedkube-route (internal engine addresses) "
                                    "to clients (gateway --route-headers). Off by default."},
}, "The gateway in front of the engines.", **{"x-kubernetes-validations": [{
    "rule": "!has(self.requireApiKey) || self.requireApiKey || !has(self.apiKeySecretRef)",
    "message": "gateway.requireApiKey false contradicts gateway.apiKeySecretRef; drop one",
}]})

SELECTOR = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
            "description": "A label selector (matchLabels, matchExpressions); {} selects everything."}
PEER = _obj({
    "podSelector": SELECTOR,
    "namespaceSelector": SELECTOR,
    "ipBlock": _obj({"cidr": _str(), "except": {"type": "array", "items": {"type": "string"}}},
                    required=["cidr"]),
}, "A NetworkPolicyPeer, as in a NetworkPolicy's ingress.from.", minProperties=1)

NETWORK_POLICY = _obj({
    "enabled": {"type": "boolean", "default": True,
                "description": "A NetworkPolicy letting only this service's gateway pods and metricsFrom "
                               "reach the engine pods."},
    "metricsFrom": {"type": "array", "items": PEER, "maxItems": 16,
                    "description": "Who may scrape the engines' /metrics. Default: pods labelled "
                                   "app.kubernetes.io/name=prometheus in any namespace (the Prometheus "
                                   "Operator's); [] admits no scraper."},
}, "Ingress to the engine pods (docs/operator.md, Security model).")

MONITORING = _obj({
    "enabled": {"type": "boolean", "default": True,
                "description": "Create a ServiceMonitor when the Prometheus Operator is installed."},
    "interval": _str(pattern=r"^[0-9]+(ms|s|m|h)$", default=d.DEFAULT_SCRAPE_INTERVAL),
})

ADAPTERS = {
    "type": "array", "maxItems": lora.MAX_ADAPTERS,
    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],   # the API server refuses a repeated name
    "description": "LoRA adapters served beside the model, each selected by its name as a request's `model`. "
                   "Adding or removing one loads or unloads it on the running engines without a restart "
                   "(docs/operator.md, LoRA adapters).",
    "items": _obj({
        "name": _str("The adapter's model name in requests: a DNS label.", pattern=f"^{lora.ADAPTER_NAME}$",
                     maxLength=lora.MAX_ADAPTER_NAME),
        "source": _str("A PEFT adapter (adapter_config.json, adapter_model.safetensors): on the Hugging Face Hub, "
                       "[hf://]ORG/NAME[@REVISION], or a folder in a PersistentVolumeClaim, pvc://CLAIM/PATH.",
                       pattern=lora.ADAPTER_SOURCE_PATTERN, maxLength=512),
    }, required=["name", "source"], **{"x-kubernetes-validations": [{
        "rule": f"!self.source.matches('{d.DOT_DOT_SEGMENT}')",
        "message": "adapter source must not have a '..' segment",
    }]}),
}

SPEC = _obj({
    "model": MODEL,
    "replicas": _int(0, 1000, d.DEFAULT_REPLICAS,
                     "Engine replicas. With autoscaling on, the autoscaler writes it (scale subresource)."),
    "autoscaling": AUTOSCALING,
    "engine": {**ENGINE, "default": {}},
    "gateway": {**GATEWAY, "default": {}},
    "monitoring": {**MONITORING, "default": {}},
    "networkPolicy": {**NETWORK_POLICY, "default": {}},
    "adapters": ADAPTERS,
}, required=["model"], **{"x-kubernetes-validations": [
    {"rule": "!has(self.autoscaling) || !self.autoscaling.enabled || "
             "(self.replicas >= self.autoscaling.minReplicas && self.replicas <= self.autoscaling.maxReplicas)",
     "message": "replicas must lie within [autoscaling.minReplicas, autoscaling.maxReplicas] when autoscaling"},
    {"rule": "self.engine.runtime != 'vllm' || !self.model.source.startsWith('builtin://')",
     "message": "the vllm runtime cannot serve builtin:// models; use hf:// or pvc://"},
    {"rule": "self.engine.runtime != 'vllm' || ((!has(self.adapters) || size(self.adapters) == 0) "
             "&& !has(self.engine.maxLoras))",
     "message": "spec.adapters needs the pagedkube runtime"},
]})

CONDITION = _obj({
    "type": _str(), "status": _str(enum=["True", "False", "Unknown"]), "reason": _str(), "message": _str(),
    "lastTransitionTime": _str(format="date-time"), "observedGeneration": {"type": "integer", "format": "int64"},
}, required=["type", "status"])

ADAPTER_STATUS = _obj({
    "name": _str(), "ready": {"type": "boolean"},
    "engines": _int(description="Ready engines that serve the adapter."), "message": _str(),
}, "Written by the gateway, which reads every engine's /v1/models.", required=["name", "ready"])

STATUS = _obj({
    "replicas": _int(), "readyReplicas": _int(),
    "selector": _str("Label selector of the engine pods (scale subresource)."),
    "url": _str("In-cluster URL of the gateway Service."),
    "observedGeneration": {"type": "integer", "format": "int64"},
    "conditions": {"type": "array", "items": CONDITION,
                   "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    "adapters": {"type": "array", "items": ADAPTER_STATUS,
                 "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
}, **{"x-kubernetes-preserve-unknown-fields": True})  # kopf keeps its handler progress here

ROOT = _obj({
    "apiVersion": _str(), "kind": _str(), "metadata": {"type": "object"},
    "spec": SPEC, "status": STATUS,
}, required=["spec"], **{"x-kubernetes-validations": [{
    "rule": f"size(self.metadata.name) <= {d.MAX_NAME_LENGTH}",
    "message": f"metadata.name must be at most {d.MAX_NAME_LENGTH} characters (children append -gateway)",
}]})


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{naming.PLURAL}.{naming.GROUP}",
                     "labels": {"app.kubernetes.io/name": "pagedkube"}},
        "spec": {
            "group": naming.GROUP,
            "scope": "Namespaced",
            "names": {"kind": naming.KIND, "listKind": f"{naming.KIND}List", "plural": naming.PLURAL,
                      "singular": naming.SINGULAR, "shortNames": list(naming.SHORT_NAMES),
                      "categories": ["pagedkube"]},
            "versions": [{
                "name": naming.VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": ROOT},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                              "labelSelectorPath": ".status.selector"},
                },
                "additionalPrinterColumns": [
                    {"name": "Model", "type": "string", "jsonPath": ".spec.model.source"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                    {"name": "URL", "type": "string", "jsonPath": ".status.url"},
                    {"name": "Adapters", "type": "string", "jsonPath": ".spec.adapters[*].name",
                     "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }

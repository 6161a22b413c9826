"""The LLMService spec as the operator reads it (pure, torch-free).

The API server applies the CRD's defaults and validations before the operator
sees an object, but builders must not trust that (an old CRD, a hand-made test
object), so `LLMServiceSpec.from_body` re-applies the same defaults and raises
ValueError with a message a user can act on. The defaults live here once and
the CRD schema (crd.py) reads them from here.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

# The gateway's and the engine's own definitions (torch-free modules), not restated here:
# the operator passes them to the gateway and engines it runs.
from pagedkube import model_source as ms
from pagedkube.operator.adapters import AdapterSpec, parse_adapters
from pagedkube.operator.model_spec import ModelSource, cache_claim
from pagedkube.defaults import default_of
from pagedkube.engine.config import STRUCTURED_OUTPUTS_BACKENDS, EngineConfig
from pagedkube.engine.server.config import ServerConfig
from pagedkube.engine.server.tool_parsers import PARSER_NAMES as TOOL_CALL_PARSERS
from pagedkube.gateway.autoscaler import policy as autoscale
from pagedkube.gateway.config import GatewayConfig
from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_BOUND
from pagedkube.gateway.routing.types import ROUTING_POLICIES

# Defaults shared with crd.py. Each says where its number comes from.
DEFAULT_REPLICAS = 1
DEFAULT_BLOCK_SIZE: int = default_of(EngineConfig, "block_size")       # the engine's (vLLM's) default
BLOCK_SIZES = (8, 16, 32, 64, 128)
DEFAULT_MAX_NUM_SEQS: int = default_of(EngineConfig, "max_num_seqs")   # the engine's (vLLM's) default
DEFAULT_DRAIN_TIMEOUT_S = 30       # long enough for a 1k-token reply at ~40 tok/s
# The drain timeout when maxModelLen is set and drainTimeoutSeconds is not: the autoscaler's scale-in
# grace (gateway/autoscaler/policy.py) with a decode rate assumed, as the operator measures none. 20
# tokens/s per sequence is a slow engine (a loaded CPU, or a big batch of a large model on one GPU).
ASSUMED_DECODE_TOKENS_PER_S = 20
MAX_DRAIN_TIMEOUT_S = 3600
# The gateway autoscaler's defaults (gateway/autoscaler/policy.py); the windows are whole seconds in the CRD.
DEFAULT_MIN_REPLICAS = autoscale.DEFAULT_MIN_REPLICAS
DEFAULT_MAX_REPLICAS = autoscale.DEFAULT_MAX_REPLICAS
DEFAULT_TARGET_QUEUE_DEPTH = autoscale.DEFAULT_TARGET_QUEUE_DEPTH
DEFAULT_SCALE_UP_WINDOW_S = int(autoscale.DEFAULT_SCALE_UP_WINDOW_S)      # HPA's default scale-up stabilization
DEFAULT_SCALE_DOWN_WINDOW_S = int(autoscale.DEFAULT_SCALE_DOWN_WINDOW_S)  # HPA's default scale-down stabilization
DEFAULT_GATEWAY_REPLICAS = 1
DEFAULT_ROUTING_POLICY: str = default_of(GatewayConfig, "routing")
RUNTIMES = ("pagedkube", "vllm")
DEFAULT_TOOL_CALL_PARSER: str = default_of(ServerConfig, "tool_call_parser")      # auto: from the chat template
DEFAULT_STRUCTURED_OUTPUTS_BACKEND: str = default_of(EngineConfig, "structured_outputs_backend")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
DEFAULT_TENSOR_PARALLEL_SIZE: int = default_of(EngineConfig, "tensor_parallel_size")
MAX_TENSOR_PARALLEL_SIZE = 64     # 8 GPUs per node is the usual most; 64 leaves room for larger boxes
# --max-loras when spec.adapters is set and spec.engine.maxLoras is not: a fixed number, not the count of
# adapters, so that adding one never changes the pod template (builders/adapters.py). 8 runs every adapter
# of a small fleet in one step; more adapters than slots take turns between steps (LRU), as in vLLM.
DEFAULT_MAX_LORAS = 8
DEFAULT_MAX_LORA_RANK: int = default_of(EngineConfig, "max_lora_rank")   # the engine's (vLLM's is 16)
MAX_NODES_PER_REPLICA = 16       # 16 x 8 GPUs: a 405B model in bf16 needs 2 nodes of 8 x 80 GB
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_SCRAPE_INTERVAL = "30s"    # Prometheus Operator's usual interval
# Who may scrape engine /metrics through the NetworkPolicy when spec.networkPolicy.metricsFrom is unset:
# pods the Prometheus Operator runs (it labels every Prometheus pod app.kubernetes.io/name=prometheus),
# in any namespace. docs/operator.md, "Security model".
DEFAULT_METRICS_FROM: tuple[Mapping[str, Any], ...] = (
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
)
PEER_KEYS = ("podSelector", "namespaceSelector", "ipBlock")   # a NetworkPolicyPeer's fields
# `<name>-gateway` must stay a DNS-1035 label (63 chars) for Services.
MAX_NAME_LENGTH = 55

SOURCE_PATTERN = ms.SOURCE_PATTERN
DOT_DOT_SEGMENT = ms.DOT_DOT_SEGMENT


@dataclass(frozen=True, slots=True)
class Autoscaling(autoscale.AutoscaleBounds):
    enabled: bool = False
    scale_up_window_s: int = DEFAULT_SCALE_UP_WINDOW_S
    scale_down_window_s: int = DEFAULT_SCALE_DOWN_WINDOW_S


@dataclass(frozen=True, slots=True)
class EngineSpec:
    runtime: str = "pagedkube"
    image: str = ""                       # "" = the runtime's default image
    image_pull_policy: str = ""
    resources: Mapping[str, Any] = field(default_factory=dict)
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    drain_timeout_s: int = DEFAULT_DRAIN_TIMEOUT_S
    extra_args: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    api_key_secret: str = ""              # Secret with key `api-key`; "" = the generated Secret's key
    require_api_key: bool = True          # False (and no api_key_secret): engines answer anyone who reaches them
    tool_call_parser: str = DEFAULT_TOOL_CALL_PARSER                        # --tool-call-parser
    structured_outputs_backend: str = DEFAULT_STRUCTURED_OUTPUTS_BACKEND    # --structured-outputs-backend
    tensor_parallel_size: int = DEFAULT_TENSOR_PARALLEL_SIZE                # --tensor-parallel-size: ranks per pod
    max_loras: int | None = None          # --max-loras; None: DEFAULT_MAX_LORAS when there are adapters
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK                              # --max-lora-rank
    nodes_per_replica: int = 1            # pods of one engine (--nnodes); > 1: a LeaderWorkerSet

    @property
    def num_gpus(self) -> int:
        limits = self.resources.get("limits") or {}
        return int(str(limits.get(GPU_RESOURCE, 0)))


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    replicas: int = DEFAULT_GATEWAY_REPLICAS
    image: str = ""
    image_pull_policy: str = ""
    resources: Mapping[str, Any] = field(default_factory=dict)
    routing_policy: str = DEFAULT_ROUTING_POLICY
    load_bound: float = DEFAULT_LOAD_BOUND
    api_key_secret: str = ""              # the user's Secret name; "" = the generated <name>-api-key
    require_api_key: bool = True          # False (and no api_key_secret): anyone who reaches the gateway is served
    service_type: str = "ClusterIP"
    route_headers: bool = False           # x-pagedkube-endpoint / -route on responses (internal addresses)


@dataclass(frozen=True, slots=True)
class NetworkPolicySpec:
    enabled: bool = True
    metrics_from: tuple[Mapping[str, Any], ...] = DEFAULT_METRICS_FROM   # NetworkPolicyPeers for /metrics


@dataclass(frozen=True, slots=True)
class LLMServiceSpec:
    """One LLMService, defaults applied. `name`/`namespace`/`uid` come from metadata."""

    name: str
    namespace: str
    uid: str
    generation: int
    model_name: str
    source: ModelSource
    hf_token_secret: str = ""
    model_cache_claim: str = ""          # spec.model.cache.claimName: the PVC that holds HF_HOME
    replicas: int = DEFAULT_REPLICAS
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    engine: EngineSpec = field(default_factory=EngineSpec)
    gateway: GatewaySpec = field(default_factory=GatewaySpec)
    monitoring_enabled: bool = True
    scrape_interval: str = DEFAULT_SCRAPE_INTERVAL
    network_policy: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)
    adapters: tuple[AdapterSpec, ...] = ()

    @property
    def lora_enabled(self) -> bool:
        """Engines run with --enable-lora: spec.adapters lists some, or spec.engine.maxLoras is set
        (a service that starts with none and gains them later without a restart)."""
        return bool(self.adapters) or self.engine.max_loras is not None

    @property
    def max_loras(self) -> int:
        return self.engine.max_loras if self.engine.max_loras is not None else DEFAULT_MAX_LORAS

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "LLMServiceSpec":
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        name = meta.get("name") or ""
        if not name or len(name) > MAX_NAME_LENGTH:
            raise ValueError(f"metadata.name must be 1..{MAX_NAME_LENGTH} characters, got {name!r}")
        model = spec.get("model") or {}
        if not model.get("source"):
            raise ValueError("spec.model.source is required")
        source = ModelSource.parse(model["source"])
        engine = _engine(spec.get("engine") or {})
        if engine.runtime == "vllm" and source.scheme == "builtin":
            raise ValueError("spec.engine.runtime vllm cannot serve builtin:// models; use hf:// or pvc://")
        if engine.runtime == "vllm" and source.scheme == "hf" and source.is_gguf:
            raise ValueError("spec.engine.runtime vllm serves a Hub repo's checkpoint, not a GGUF in it "
                             "(ORG/NAME:QUANT); use the pagedkube runtime or a pvc:// source")
        autoscaling = _autoscaling(spec.get("autoscaling") or {})
        replicas = _int(spec, "replicas", DEFAULT_REPLICAS, "spec.replicas", low=0)
        if autoscaling.enabled and not autoscaling.min_replicas <= replicas <= autoscaling.max_replicas:
            raise ValueError(
                f"spec.replicas {replicas} must lie within autoscaling "
                f"[{autoscaling.min_replicas}, {autoscaling.max_replicas}]"
            )
        monitoring = spec.get("monitoring") or {}
        model_name = model.get("name") or source.default_name()
        adapters = parse_adapters(spec.get("adapters"), model_name)
        if engine.runtime == "vllm" and (adapters or engine.max_loras is not None):
            raise ValueError("spec.adapters needs the pagedkube runtime (its engines follow the adapter list "
                             "without a restart); the vllm runtime takes --lora-modules in spec.engine.extraArgs")
        ranks = engine.tensor_parallel_size * engine.nodes_per_replica
        if ranks > 1 and (adapters or engine.max_loras is not None):
            raise ValueError(f"spec.adapters needs one rank per engine for now: LoRA adapters are not sharded for "
                             f"tensor parallelism (tensorParallelSize x nodesPerReplica is {ranks})")
        return cls(
            name=name,
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 0),
            model_name=model_name,
            source=source,
            hf_token_secret=_secret_name(model, "hfTokenSecretRef"),
            model_cache_claim=cache_claim(model, source),
            replicas=replicas,
            autoscaling=autoscaling,
            engine=engine,
            gateway=_gateway(spec.get("gateway") or {}),
            monitoring_enabled=bool(monitoring.get("enabled", True)),
            scrape_interval=monitoring.get("interval", DEFAULT_SCRAPE_INTERVAL),
            network_policy=_network_policy(spec.get("networkPolicy") or {}),
            adapters=adapters,
        )


def _secret_name(d: Mapping[str, Any], key: str) -> str:
    """The `name` of a `{key}: {name: ...}` Secret reference; "" when absent."""
    return (d.get(key) or {}).get("name", "")


def _int(d: Mapping[str, Any], key: str, default: int | None, where: str, low: int = 1) -> Any:
    value = d.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where} must be an integer >= {low}, got {value!r}")
    return value


def _autoscaling(d: Mapping[str, Any]) -> Autoscaling:
    a = Autoscaling(
        enabled=bool(d.get("enabled", False)),
        min_replicas=_int(d, "minReplicas", DEFAULT_MIN_REPLICAS, "spec.autoscaling.minReplicas", low=0),
        max_replicas=_int(d, "maxReplicas", DEFAULT_MAX_REPLICAS, "spec.autoscaling.maxReplicas"),
        target_queue_depth=float(d.get("targetQueueDepth", DEFAULT_TARGET_QUEUE_DEPTH)),
        scale_up_window_s=_int(d, "scaleUpWindowSeconds", DEFAULT_SCALE_UP_WINDOW_S,
                               "spec.autoscaling.scaleUpWindowSeconds", low=0),
        scale_down_window_s=_int(d, "scaleDownWindowSeconds", DEFAULT_SCALE_DOWN_WINDOW_S,
                                 "spec.autoscaling.scaleDownWindowSeconds", low=0),
    )
    autoscale.check_bounds(a.min_replicas, a.max_replicas, a.target_queue_depth, autoscale.SPEC_NAMES)
    return a


def _engine(d: Mapping[str, Any]) -> EngineSpec:
    runtime = d.get("runtime", "pagedkube")
    if runtime not in RUNTIMES:
        raise ValueError(f"spec.engine.runtime must be one of {RUNTIMES}, got {runtime!r}")
    block_size = d.get("blockSize", DEFAULT_BLOCK_SIZE)
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"spec.engine.blockSize must be one of {BLOCK_SIZES}, got {block_size!r}")
    extra_args = d.get("extraArgs") or ()
    if not all(isinstance(a, str) for a in extra_args):
        raise ValueError("spec.engine.extraArgs must be a list of strings")
    engine = EngineSpec(
        runtime=runtime,
        image=d.get("image", ""),
        image_pull_policy=d.get("imagePullPolicy", ""),
        resources=d.get("resources") or {},
        block_size=block_size,
        max_model_len=_int(d, "maxModelLen", None, "spec.engine.maxModelLen"),
        max_num_seqs=_int(d, "maxNumSeqs", DEFAULT_MAX_NUM_SEQS, "spec.engine.maxNumSeqs"),
        max_num_batched_tokens=_int(d, "maxNumBatchedTokens", None, "spec.engine.maxNumBatchedTokens"),
        drain_timeout_s=_int(d, "drainTimeoutSeconds", _derived_drain_timeout(d.get("maxModelLen")),
                             "spec.engine.drainTimeoutSeconds", low=0),
        extra_args=tuple(extra_args),
        env=tuple(d.get("env") or ()),
        node_selector=d.get("nodeSelector") or {},
        tolerations=tuple(d.get("tolerations") or ()),
        api_key_secret=_secret_name(d, "apiKeySecretRef"),
        require_api_key=_bool(d, "requireApiKey", True, "spec.engine.requireApiKey"),
        tool_call_parser=_choice(d, "toolCallParser", DEFAULT_TOOL_CALL_PARSER, TOOL_CALL_PARSERS),
        structured_outputs_backend=_choice(d, "structuredOutputsBackend", DEFAULT_STRUCTURED_OUTPUTS_BACKEND,
                                           STRUCTURED_OUTPUTS_BACKENDS),
        tensor_parallel_size=_int(d, "tensorParallelSize", DEFAULT_TENSOR_PARALLEL_SIZE,
                                  "spec.engine.tensorParallelSize"),
        max_loras=_int(d, "maxLoras", None, "spec.engine.maxLoras"),
        max_lora_rank=_int(d, "maxLoraRank", DEFAULT_MAX_LORA_RANK, "spec.engine.maxLoraRank"),
        nodes_per_replica=_int(d, "nodesPerReplica", 1, "spec.engine.nodesPerReplica"),
    )
    if engine.nodes_per_replica > MAX_NODES_PER_REPLICA:
        raise ValueError(f"spec.engine.nodesPerReplica must be <= {MAX_NODES_PER_REPLICA}, "
                         f"got {engine.nodes_per_replica}")
    if engine.nodes_per_replica > 1 and runtime != "pagedkube":
        raise ValueError(f"spec.engine.nodesPerReplica {engine.nodes_per_replica} needs runtime pagedkube: the "
                         f"vllm runtime spans nodes through Ray, which the operator does not set up")
    if engine.tensor_parallel_size > MAX_TENSOR_PARALLEL_SIZE:
        raise ValueError(f"spec.engine.tensorParallelSize must be <= {MAX_TENSOR_PARALLEL_SIZE}, "
                         f"got {engine.tensor_parallel_size}")
    _check_gpus(engine)
    if not engine.require_api_key and engine.api_key_secret:
        raise ValueError("spec.engine.requireApiKey false contradicts spec.engine.apiKeySecretRef; drop one")
    return engine


def _check_gpus(engine: EngineSpec) -> None:
    """Under tensor parallelism on GPUs each rank has its own: a pod that asks for GPUs asks for
    exactly one per rank. (At tensorParallelSize 1 any count stays allowed, as before: a vLLM
    runtime given --tensor-parallel-size in extraArgs.)"""
    if engine.tensor_parallel_size == 1:
        return
    for kind in ("limits", "requests"):
        value = (engine.resources.get(kind) or {}).get(GPU_RESOURCE)
        if value is not None and str(value) != str(engine.tensor_parallel_size):
            raise ValueError(f"spec.engine.resources.{kind}[{GPU_RESOURCE}] is {value}, but tensorParallelSize "
                             f"{engine.tensor_parallel_size} runs one rank per GPU: set them equal")


def _choice(d: Mapping[str, Any], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = d.get(key, default)
    if value not in choices:
        raise ValueError(f"spec.engine.{key} must be one of {choices}, got {value!r}")
    return value
def _derived_drain_timeout(max_model_len: Any) -> int:
    """The longest allowed answer at ASSUMED_DECODE_TOKENS_PER_S, as the autoscaler's grace; 30 s without one."""
    if isinstance(max_model_len, int) and not isinstance(max_model_len, bool) and max_model_len > 0:
        grace = autoscale.GRACE_FACTOR * max_model_len / ASSUMED_DECODE_TOKENS_PER_S
        return min(MAX_DRAIN_TIMEOUT_S, max(DEFAULT_DRAIN_TIMEOUT_S, math.ceil(grace)))
    return DEFAULT_DRAIN_TIMEOUT_S


def _bool(d: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where} must be true or false, got {value!r}")
    return value


def _network_policy(d: Mapping[str, Any]) -> NetworkPolicySpec:
    peers = d.get("metricsFrom")
    if peers is None:
        peers = DEFAULT_METRICS_FROM
    if not isinstance(peers, (list, tuple)) or not all(
            isinstance(p, Mapping) and p and set(p) <= set(PEER_KEYS) for p in peers):
        raise ValueError(f"spec.networkPolicy.metricsFrom must be a list of NetworkPolicy peers "
                         f"(objects with {', '.join(PEER_KEYS)}), got {peers!r}")
    return NetworkPolicySpec(enabled=_bool(d, "enabled", True, "spec.networkPolicy.enabled"),
                             metrics_from=tuple(copy.deepcopy(dict(p)) for p in peers))   # never the shared default


def _gateway(d: Mapping[str, Any]) -> GatewaySpec:
    routing = d.get("routing") or {}
    policy = routing.get("policy", DEFAULT_ROUTING_POLICY)
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"spec.gateway.routing.policy must be one of {ROUTING_POLICIES}, got {policy!r}")
    load_bound = float(routing.get("loadBound", DEFAULT_LOAD_BOUND))
    if load_bound < 1.0:
        raise ValueError(f"spec.gateway.routing.loadBound must be >= 1.0, got {load_bound}")
    service_type = d.get("serviceType", "ClusterIP")
    if service_type not in SERVICE_TYPES:
        raise ValueError(f"spec.gateway.serviceType must be one of {SERVICE_TYPES}, got {service_type!r}")
    gateway = GatewaySpec(
        replicas=_int(d, "replicas", DEFAULT_GATEWAY_REPLICAS, "spec.gateway.replicas"),
        image=d.get("image", ""),
        image_pull_policy=d.get("imagePullPolicy", ""),
        resources=d.get("resources") or {},
        routing_policy=policy,
        load_bound=load_bound,
        api_key_secret=_secret_name(d, "apiKeySecretRef"),
        require_api_key=_bool(d, "requireApiKey", True, "spec.gateway.requireApiKey"),
        service_type=service_type,
        route_headers=_bool(d, "routeHeaders", False, "spec.gateway.routeHeaders"),
    )
    if not gateway.require_api_key and gateway.api_key_secret:
        raise ValueError("spec.gateway.requireApiKey false contradicts spec.gateway.apiKeySecretRef; drop one")
    return gateway

"""The engine Deployment and its headless Service (pure).

Replicas come from spec.replicas, which the gateway's autoscaler (or HPA/KEDA,
or `kubectl scale`) writes through the LLMService scale subresource; the
operator is the only writer of the Deployment's replicas, so nothing fights
over that field under server-side apply.

Termination: the pod leaves the EndpointSlice when deletion starts, but
gateways learn that a moment later. preStop sleeps PRESTOP_SLEEP_S so they stop
sending new requests, then SIGTERM makes the engine drain (readiness false,
in-flight requests finish within --drain-timeout); the grace period covers
both plus a margin.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from pagedkube.operator import naming
from pagedkube.operator.builders.common import (
    HOME_ENV, TMP_MOUNT, TMP_VOLUME, container_security_context, http_probe, liveness_probe, maybe, readiness_probe)
from pagedkube.operator.builders.deployment import component_deployment
from pagedkube.operator.builders.adapters import fetch_adapters_too, lora_pod
from pagedkube.operator.builders.model import ModelCache, ModelMount, model_mount
from pagedkube.operator.builders.security import engine_api_key_env, hash_seed_env
from pagedkube.operator.spec import LLMServiceSpec

PRESTOP_SLEEP_S = 5       # EndpointSlice propagation to every gateway replica
GRACE_MARGIN_S = 10       # process exit after the drain
ENGINE_CONTAINER = "engine"
# Loading weights (and downloading them first) can take many minutes; the
# startup probe holds liveness off for up to 30 min.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 180
# /dev/shm of a tensor-parallel GPU pod: NCCL's troubleshooting guide has containers started with
# --shm-size=1g; it counts against the pod's memory only as far as it is used
NCCL_SHM_SIZE = "1Gi"


def engine_image(svc: LLMServiceSpec) -> str:
    if svc.engine.image:
        return svc.engine.image
    return naming.VLLM_IMAGE if svc.engine.runtime == "vllm" else naming.ENGINE_IMAGE


def termination_grace_s(svc: LLMServiceSpec) -> int:
    return PRESTOP_SLEEP_S + svc.engine.drain_timeout_s + GRACE_MARGIN_S


def engine_command(svc: LLMServiceSpec, model_path: str | None) -> tuple[list[str], list[str]]:
    """(command, args) for the runtime, per docs/interfaces.md "Processes and flags"."""
    e = svc.engine
    common = ["--served-model-name", svc.model_name, "--host", "0.0.0.0", "--port", str(naming.ENGINE_PORT),
              "--block-size", str(e.block_size), "--max-num-seqs", str(e.max_num_seqs)]
    optional: list[str] = []
    if e.max_model_len:
        optional += ["--max-model-len", str(e.max_model_len)]
    if e.max_num_batched_tokens:
        optional += ["--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    if e.tensor_parallel_size > 1:       # the same flag in both runtimes
        optional += ["--tensor-parallel-size", str(e.tensor_parallel_size)]
    if e.nodes_per_replica > 1:          # the leader of a LeaderWorkerSet group (engine_lws.py)
        optional += ["--nnodes", str(e.nodes_per_replica), "--master-port", str(naming.MASTER_PORT)]
    if e.runtime == "vllm":
        assert model_path is not None, "vllm needs a model path (validated in spec)"
        tools = ([] if e.tool_call_parser in ("auto", "none")    # vLLM has no template detection
                 else ["--enable-auto-tool-choice", "--tool-call-parser", e.tool_call_parser])
        return (["python3", "-m", "vllm.entrypoints.openai.api_server"],
                ["--model", model_path, *common, *optional, "--enable-prefix-caching", *tools, *e.extra_args])
    args = ["serve", *(["--model", model_path] if model_path else []), *common, *optional,
            "--drain-timeout", str(e.drain_timeout_s), "--tool-call-parser", e.tool_call_parser,
            "--structured-outputs-backend", e.structured_outputs_backend]
    if e.num_gpus:
        args += ["--device", "cuda"]
    return ["pagedkube"], [*args, *e.extra_args]


def engine_env(svc: LLMServiceSpec, model_env: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """model_env: the model mount's (HF_HOME on the model cache, ...), ahead of the runtime's defaults."""
    # vLLM reads its key from VLLM_API_KEY (and guards only its /v1 paths with it).
    key_var = "VLLM_API_KEY" if svc.engine.runtime == "vllm" else "PAGEDKUBE_API_KEY"
    if svc.lora_enabled:   # a Hub adapter added at run time is fetched by the engine (builders/adapters.py)
        model_env = [v for v in model_env if v["name"] != "HF_HUB_OFFLINE"]
    env = [*HOME_ENV, *engine_api_key_env(svc, key_var), *hash_seed_env(svc), *(dict(v) for v in model_env)]
    if svc.engine.runtime == "vllm":
        given = {v["name"] for v in model_env}
        env += [v for v in ({"name": "HF_HOME", "value": "/tmp/hf"},
                            {"name": "HF_HUB_OFFLINE", "value": "1"},
                            {"name": "VLLM_NO_USAGE_STATS", "value": "1"}) if v["name"] not in given]
    return env + [dict(v) for v in svc.engine.env]


def engine_model_mount(svc: LLMServiceSpec, image: str, model_cache_host_path: str) -> ModelMount:
    """The model's volumes and download for an engine pod (leader and workers alike)."""
    e = svc.engine
    mount = model_mount(svc.source, runtime=e.runtime, image=image, hf_token_secret=svc.hf_token_secret,
                        security_context=container_security_context(), tmp_mount=TMP_MOUNT,
                        cache=ModelCache(svc.model_cache_claim, model_cache_host_path))
    # The model download runs in the engine image with the engine's pull policy and
    # spec.engine.env (HF_ENDPOINT for a Hub mirror, HTTPS_PROXY, ...).
    for init in mount.init_containers:
        init.update(maybe("imagePullPolicy", e.image_pull_policy))
        init["env"] = [*init["env"], *(dict(v) for v in e.env)]
        if svc.lora_enabled:
            fetch_adapters_too(init)
    return mount


def engine_volumes(svc: LLMServiceSpec, mount: ModelMount) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) of an engine container: /tmp, the model, and /dev/shm where needed."""
    e = svc.engine
    volumes = [TMP_VOLUME, *mount.volumes]
    mounts = [TMP_MOUNT, *mount.mounts]
    if e.runtime == "vllm" or (e.num_gpus and e.tensor_parallel_size > 1):
        # NCCL and vLLM's worker processes share memory through /dev/shm; the container runtime's
        # default is 64 MiB, too little for NCCL between the GPUs of one pod
        shm: dict[str, Any] = {"medium": "Memory"}
        if e.tensor_parallel_size > 1:
            shm["sizeLimit"] = NCCL_SHM_SIZE
        volumes.append({"name": "shm", "emptyDir": shm})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    return volumes, mounts


def engine_pod(svc: LLMServiceSpec, container: dict[str, Any], mount: ModelMount,
               volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod spec's own fields around an engine container (the server or a multi-node worker)."""
    e = svc.engine
    return {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": termination_grace_s(svc),
        **maybe("initContainers", mount.init_containers),
        "containers": [container],
        "volumes": volumes,
        **maybe("nodeSelector", dict(e.node_selector)),
        **maybe("tolerations", [dict(t) for t in e.tolerations]),
    }


def engine_server_pod(svc: LLMServiceSpec, model_cache_host_path: str = "") -> dict[str, Any]:
    """The pod that serves HTTP: the Deployment's, or a LeaderWorkerSet's leader."""
    e = svc.engine
    image = engine_image(svc)
    mount = engine_model_mount(svc, image, model_cache_host_path)
    command, args = engine_command(svc, mount.model_path)
    lora = lora_pod(svc)
    args += [*mount.extra_args, *lora.args]
    # vLLM's own health check is /health; it has no separate readiness endpoint.
    ready_path = "/health" if e.runtime == "vllm" else "/ready"
    volumes, mounts = engine_volumes(svc, mount)
    volumes, mounts = [*volumes, *lora.volumes], [*mounts, *lora.mounts]
    ports = [{"name": "http", "containerPort": naming.ENGINE_PORT, "protocol": "TCP"}]
    if e.nodes_per_replica > 1:
        ports.append({"name": "dist", "containerPort": naming.MASTER_PORT, "protocol": "TCP"})
    container = {
        "name": ENGINE_CONTAINER,
        "image": image,
        **maybe("imagePullPolicy", e.image_pull_policy),
        "command": command,
        "args": args,
        "env": engine_env(svc, mount.env),
        "ports": ports,
        **maybe("resources", dict(e.resources)),
        "startupProbe": http_probe("/health", period_s=STARTUP_PERIOD_S, failure_threshold=STARTUP_FAILURES),
        # /health checks the engine core's heartbeat, so it stays HTTP, with a loaded node's patience.
        "livenessProbe": liveness_probe("/health"),
        "readinessProbe": readiness_probe(ready_path),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    return engine_pod(svc, container, mount, volumes)


def build_engine_deployment(svc: LLMServiceSpec, secret_version: str = "",
                            model_cache_host_path: str = "") -> dict[str, Any]:
    """secret_version: security.secret_version() of the generated Secret; a new one rolls the pods.
    model_cache_host_path: the operator's --model-cache-host-path (builders/model.py)."""
    # Without spare GPUs a surge pod cannot schedule; replace one at a time instead.
    rolling = {"maxSurge": 0, "maxUnavailable": 1} if svc.engine.num_gpus else {"maxSurge": 1, "maxUnavailable": 0}
    return component_deployment(svc, "engine", naming.engine_name(svc.name), replicas=svc.replicas,
                                rolling_update=rolling, secret_version=secret_version,
                                pod=engine_server_pod(svc, model_cache_host_path))


def build_engine_service(svc: LLMServiceSpec) -> dict[str, Any]:
    """Headless: the gateway reads its EndpointSlices and talks to each pod directly."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.metadata(naming.engine_name(svc.name), svc.namespace, svc.name, svc.uid, "engine"),
        "spec": {
            "clusterIP": "None",
            "selector": naming.selector_labels(svc.name, "engine"),
            "ports": [{"name": "http", "port": naming.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }

"""The gateway Deployment and the user-facing Service (pure).

The gateway finds engines through the EndpointSlices of the headless engine
Service, and (with autoscaling on) writes the LLMService scale subresource;
its ServiceAccount's Role (rbac.py) allows exactly that.
"""
from __future__ import annotations

from typing import Any

from pagedkube.gateway.routing.pending import pending_ttl_for
from pagedkube.operator import naming
from pagedkube.operator.builders.common import (
    HOME_ENV, TMP_MOUNT, TMP_VOLUME, container_security_context, maybe, readiness_probe, tcp_liveness_probe)
from pagedkube.operator.builders.deployment import component_deployment
from pagedkube.operator.builders.security import (
    API_KEYS_FILE_KEY, KEYS_VERSION_ANNOTATION, engine_api_key_env, gateway_keys_secret)
from pagedkube.operator.spec import LLMServiceSpec

GATEWAY_CONTAINER = "gateway"
API_KEYS_VOLUME = "api-keys"
API_KEYS_DIR = "/etc/pagedkube/api-keys"
API_KEYS_KEY = API_KEYS_FILE_KEY


def gateway_args(svc: LLMServiceSpec) -> list[str]:
    g, a = svc.gateway, svc.autoscaling
    args = ["gateway", "--kube-service", naming.engine_name(svc.name), "--namespace", svc.namespace,
            "--llmservice", svc.name,
            "--host", "0.0.0.0", "--port", str(naming.GATEWAY_PORT),
            "--routing", g.routing_policy, "--load-bound", f"{g.load_bound:g}"]
    if pending_ttl_for(g.replicas) == 0:
        args += ["--pending-ttl", "0"]   # several replicas: each would know only its own routes
    if gateway_keys_secret(svc):   # closed by default: the user's keys or the generated one
        args += ["--api-keys", f"{API_KEYS_DIR}/{API_KEYS_KEY}"]
    if g.route_headers:
        args += ["--route-headers"]
    if a.enabled:
        args += ["--autoscale",
                 "--min-replicas", str(a.min_replicas), "--max-replicas", str(a.max_replicas),
                 "--target-queue-depth", f"{a.target_queue_depth:g}",
                 "--engine-capacity", str(svc.engine.max_num_seqs),
                 "--scale-up-window", str(a.scale_up_window_s),
                 "--scale-down-window", str(a.scale_down_window_s)]
    return args


def build_gateway_deployment(svc: LLMServiceSpec, secret_version: str = "", keys_version: str = "",
                             allow_image: bool = False) -> dict[str, Any]:
    """secret_version: as for the engines, so both sides restart onto a re-created key together;
    keys_version: the generated client key's, so the gateway restarts onto a re-created one.
    allow_image: spec.gateway.image is used; otherwise the release's image runs whatever the spec
    says, as the gateway's ServiceAccount holds rights an LLMService author should not pick the
    code for (the operator's --allow-gateway-image)."""
    g = svc.gateway
    volumes = [TMP_VOLUME]
    mounts = [TMP_MOUNT]
    if keys_secret := gateway_keys_secret(svc):
        volumes.append({"name": API_KEYS_VOLUME, "secret": {
            "secretName": keys_secret, "items": [{"key": API_KEYS_KEY, "path": API_KEYS_KEY}]}})
        mounts.append({"name": API_KEYS_VOLUME, "mountPath": API_KEYS_DIR, "readOnly": True})
    env = [*HOME_ENV,
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           *engine_api_key_env(svc, "PAGEDKUBE_ENGINE_API_KEY")]   # the gateway's --engine-api-key
    container = {
        "name": GATEWAY_CONTAINER,
        "image": (g.image if allow_image else "") or naming.GATEWAY_IMAGE,
        **maybe("imagePullPolicy", g.image_pull_policy),
        "command": ["pagedkube"],
        "args": gateway_args(svc),
        "env": env,
        "ports": [{"name": "http", "containerPort": naming.GATEWAY_PORT, "protocol": "TCP"}],
        **maybe("resources", dict(g.resources)),
        # /health only says "ok" from the event loop a burst queues it behind: probe the socket.
        "livenessProbe": tcp_liveness_probe(),
        "readinessProbe": readiness_probe("/ready"),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    return component_deployment(svc, "gateway", naming.gateway_name(svc.name), replicas=g.replicas,
                                rolling_update={"maxSurge": 1, "maxUnavailable": 0}, secret_version=secret_version,
                                annotations=maybe(KEYS_VERSION_ANNOTATION, keys_version),
                                pod={"serviceAccountName": naming.gateway_name(svc.name),
                                     "terminationGracePeriodSeconds": 30,
                                     "containers": [container],
                                     "volumes": volumes})


def build_gateway_service(svc: LLMServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.metadata(naming.gateway_service_name(svc.name), svc.namespace, svc.name, svc.uid,
                                    "gateway"),
        "spec": {
            "type": svc.gateway.service_type,
            "selector": naming.selector_labels(svc.name, "gateway"),
            "ports": [{"name": "http", "port": naming.GATEWAY_SERVICE_PORT, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }

"""Pure builders: one LLMService spec in, its child objects out.

    engine.py      the engine Deployment and its headless Service
    adapters.py    spec.adapters: the ConfigMap the engines follow, their LoRA flags and mounts
    engine_lws.py  a multi-node engine's LeaderWorkerSet (spec.engine.nodesPerReplica > 1)
    gateway.py     the gateway Deployment and the user-facing Service
    deployment.py  the Deployment around either component's pod
    common.py      security contexts, /tmp, probes: what every pod shares
    model.py       model source -> volumes, mounts, init containers
    security.py    the generated Secret and the engines' NetworkPolicy
    rbac.py        the gateway's ServiceAccount, Role and RoleBinding
    pdb.py         the engine PodDisruptionBudget
    monitoring.py  the ServiceMonitor (when its CRD exists)
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator.builders.adapters import build_adapters_config_map
from pagedkube.operator.builders.engine import build_engine_deployment, build_engine_service
from pagedkube.operator.builders.engine_lws import build_engine_leader_worker_set
from pagedkube.operator.builders.gateway import build_gateway_deployment, build_gateway_service
from pagedkube.operator.builders.monitoring import build_service_monitor
from pagedkube.operator.builders.pdb import build_engine_pdb
from pagedkube.operator.builders.security import build_engine_network_policy
from pagedkube.operator.builders.rbac import (
    build_gateway_role, build_gateway_role_binding, build_gateway_service_account)
from pagedkube.operator.spec import LLMServiceSpec


def build_children(svc: LLMServiceSpec, *, with_service_monitor: bool, secret_version: str = "",
                   keys_version: str = "", allow_gateway_image: bool = False,
                   model_cache_host_path: str = "") -> list[dict[str, Any]]:
    """Every applied child, in apply order (RBAC and the NetworkPolicy before the pods).

    The generated Secrets are not among them: they are created once, not applied (reconcile.py);
    secret_version and keys_version are their digests, so the pods roll if one is ever made anew.
    allow_gateway_image: the operator's --allow-gateway-image (spec.gateway.image is used).
    model_cache_host_path: the operator's --model-cache-host-path (the node-local model cache)."""
    children = [
        build_gateway_service_account(svc),
        build_gateway_role(svc),
        build_gateway_role_binding(svc),
        *([build_engine_network_policy(svc)] if svc.network_policy.enabled else []),
        build_engine_service(svc),
        *([build_adapters_config_map(svc)] if svc.lora_enabled else []),
        build_engine_workload(svc, secret_version, model_cache_host_path),
        build_engine_pdb(svc),
        build_gateway_service(svc),
        build_gateway_deployment(svc, secret_version, keys_version, allow_image=allow_gateway_image),
    ]
    if with_service_monitor and svc.monitoring_enabled:
        children.append(build_service_monitor(svc))
    return children


def build_engine_workload(svc: LLMServiceSpec, secret_version: str = "",
                          model_cache_host_path: str = "") -> dict[str, Any]:
    """The engine pods' owner: a Deployment, or a LeaderWorkerSet when one engine spans pods."""
    if svc.engine.nodes_per_replica > 1:
        return build_engine_leader_worker_set(svc, secret_version, model_cache_host_path)
    return build_engine_deployment(svc, secret_version, model_cache_host_path)


__all__ = ["build_children", "build_engine_workload"]

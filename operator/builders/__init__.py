"""Pure builders: one LLMService spec in, its child objects out."""
from __future__ import annotations

from typing import Any

from pagedkube.operator.builders.engine import build_engine_deployment, build_engine_service
from pagedkube.operator.builders.gateway import build_gateway_deployment, build_gateway_service
from pagedkube.operator.builders.monitoring import build_service_monitor
from pagedkube.operator.builders.pdb import build_engine_pdb
from pagedkube.operator.builders.rbac import (
    build_gateway_role, build_gateway_role_binding, build_gateway_service_account)
from pagedkube.operator.spec import LLMServiceSpec


def build_children(svc: LLMServiceSpec, *, with_service_monitor: bool) -> list[dict[str, Any]]:
    """Every child, in apply order (RBAC before the pods that use it)."""
    children = [
        build_gateway_service_account(svc),
        build_gateway_role(svc),
        build_gateway_role_binding(svc),
        build_engine_service(svc),
        build_engine_deployment(svc),
        build_engine_pdb(svc),
        build_gateway_service(svc),
        build_gateway_deployment(svc),
    ]
    if with_service_monitor and svc.monitoring_enabled:
        children.append(build_service_monitor(svc))
    return children


__all__ = ["build_children"]

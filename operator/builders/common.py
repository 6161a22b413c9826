"""Pieces every pod of an LLMService shares: hardened security contexts and /tmp (pure)."""
from __future__ import annotations

from typing import Any

# Non-root with a read-only root filesystem: /tmp is the only writable path
# (an emptyDir), which is where HOME and the caches point. 10001 is the user our
# images create (Dockerfile.engine, Dockerfile.gateway); set explicitly because
# vllm/vllm-openai runs as root by default.
RUN_AS_USER = 10001

TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
HOME_ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/cache"},
]


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def http_probe(path: str, *, period_s: int, failure_threshold: int, timeout_s: int = 2) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failure_threshold,
    }


def maybe(key: str, value: Any) -> dict[str, Any]:
    """{key: value} when value is set, else {} (keeps optional fields out of applied objects)."""
    return {key: value} if value else {}

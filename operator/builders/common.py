"""Pieces every pod of an LLMService shares: hardened security contexts and /tmp (pure)."""
from __future__ import annotations

from typing import Any

# Non-root with a read-only root filesystem: /tmp is the only writable path
# (an emptyDir), which is where HOME and the caches point. 10001 is the user our
# images create (Dockerfile.engine, Dockerfile.gateway); set explicitly because
# vllm/vllm-openai runs as root by default.
RUN_AS_USER = 10001

TMP_VOLUME: dict[str, Any] = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT: dict[str, Any] = {"name": "tmp", "mountPath": "/tmp"}
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


# Probes on a loaded node. Our servers answer an HTTP probe on their event loop, behind
# whatever it has queued (streams, prompts to tokenize); on the e2e node (2 shared cores for
# kubelet, gateway and engines) an answer under a burst took more than the 2 s the probes
# used to allow, and the kubelet restarted a healthy gateway mid-burst (issue 18). So a
# probe waits PROBE_TIMEOUT_S for its answer, and liveness restarts a container only after
# LIVENESS_FAILURES misses in a row, every LIVENESS_PERIOD_S: a minute of silence is a hung
# process, not a busy one (the kubelet's defaults are 1 s and 3).
PROBE_TIMEOUT_S = 10
LIVENESS_PERIOD_S = 10
LIVENESS_FAILURES = 6
# Readiness: 3 misses (15 s) take a pod out of its Service; a shorter trigger would pull
# engines out of routing exactly when a burst needs all of them.
READINESS_PERIOD_S = 5
READINESS_FAILURES = 3


def http_probe(path: str, *, period_s: int, failure_threshold: int,
               timeout_s: int = PROBE_TIMEOUT_S) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failure_threshold,
    }


def liveness_probe(path: str) -> dict[str, Any]:
    return http_probe(path, period_s=LIVENESS_PERIOD_S, failure_threshold=LIVENESS_FAILURES)


def readiness_probe(path: str) -> dict[str, Any]:
    return http_probe(path, period_s=READINESS_PERIOD_S, failure_threshold=READINESS_FAILURES)


def tcp_liveness_probe() -> dict[str, Any]:
    """Liveness that no queued work can delay: the kernel completes the TCP handshake from
    the listen backlog without the event loop. For a server whose /health only says "ok"
    (the gateway): a dead or exited process fails it, a busy one does not."""
    return {
        "tcpSocket": {"port": "http"},
        "periodSeconds": LIVENESS_PERIOD_S,
        "timeoutSeconds": PROBE_TIMEOUT_S,
        "failureThreshold": LIVENESS_FAILURES,
    }


def maybe(key: str, value: Any) -> dict[str, Any]:
    """{key: value} when value is set, else {} (keeps optional fields out of applied objects)."""
    return {key: value} if value else {}

"""LLMService status from the engine Deployment and pods (pure).

Conditions (Kubernetes API conventions: type, status, reason, message,
lastTransitionTime, observedGeneration):

    Ready        True  when at least one engine is ready (or the service is
                       scaled to zero: the gateway holds requests until one is)
    Progressing  True  while the engine Deployment is rolling out or scaling
    Degraded     True  when something needs a user: an image that cannot be
                       pulled, a failing model download, crash-looping pods,
                       a container whose Secret or key is missing, pods that
                       cannot be scheduled, a stalled rollout, or an invalid spec

lastTransitionTime only moves when a condition's status flips.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pagedkube.operator import naming
from pagedkube.operator.builders.model import DOWNLOAD_CONTAINER

IMAGE_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
CONDITION_TYPES = ("Ready", "Progressing", "Degraded")


@dataclass(frozen=True, slots=True)
class Problem:
    reason: str
    message: str


def pod_problem(pod: Mapping[str, Any]) -> Problem | None:
    """The first thing wrong with one engine pod that a user must fix, if any."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return Problem("Unschedulable", f"pod {name} cannot be scheduled: {cond.get('message', '')}".strip())
    init = [(c, True) for c in status.get("initContainerStatuses") or []]
    main = [(c, False) for c in status.get("containerStatuses") or []]
    for cs, is_init in init + main:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in IMAGE_PULL_REASONS:
            return Problem("ImagePullFailing",
                           f"pod {name}: image {cs.get('image', '?')} cannot be pulled ({reason}): "
                           f"{waiting.get('message', '')}".rstrip(": "))
        if reason == "CreateContainerConfigError":   # e.g. engine.apiKeySecretRef names no Secret
            return Problem("ContainerConfigError",
                           f"pod {name}: container {cs.get('name')} cannot start: {waiting.get('message', '')}; "
                           f"check the Secrets the LLMService names (docs/operator.md, Security model)")
        last = (cs.get("lastState") or {}).get("terminated") or (state.get("terminated") or {})
        failed = last.get("exitCode", 0) != 0
        if is_init and cs.get("name") == DOWNLOAD_CONTAINER and (reason == "CrashLoopBackOff" or failed):
            return Problem("ModelDownloadFailing",
                           f"pod {name}: the model download failed (exit code {last.get('exitCode', '?')}): "
                           f"{last.get('message') or last.get('reason') or reason}; "
                           f"check spec.model.source and the HF token; logs: "
                           f"kubectl logs {name} -c {DOWNLOAD_CONTAINER}")
        if reason == "CrashLoopBackOff":
            return Problem("CrashLooping",
                           f"pod {name}: container {cs.get('name')} is crash-looping "
                           f"(restarts {cs.get('restartCount', 0)}, last exit code {last.get('exitCode', '?')}, "
                           f"{last.get('reason', 'unknown')}); logs: kubectl logs {name} -c {cs.get('name')} --previous")
    return None


def downloading(pod: Mapping[str, Any]) -> str | None:
    """What a pod whose model-download init container runs is doing, for the Ready message (the
    container logs the bytes so far; the operator reads no logs, it points at them)."""
    name = pod.get("metadata", {}).get("name", "?")
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        running = (cs.get("state") or {}).get("running")
        if cs.get("name") == DOWNLOAD_CONTAINER and running:
            return (f"pod {name} is downloading the model (since {running.get('startedAt', '?')}); progress: "
                    f"kubectl logs {name} -c {DOWNLOAD_CONTAINER}")
    return None


def deployment_problem(deployment: Mapping[str, Any]) -> Problem | None:
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return Problem("ProgressDeadlineExceeded", f"engine rollout stalled: {cond.get('message', '')}")
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return Problem("ReplicaFailure", f"engine pods cannot be created: {cond.get('message', '')}")
    return None


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def _keep_transition_times(new: list[dict[str, Any]], old: Iterable[Mapping[str, Any]], now: str) -> None:
    previous = {c.get("type"): c for c in old}
    for cond in new:
        prev = previous.get(cond["type"])
        same = prev is not None and prev.get("status") == cond["status"] and prev.get("lastTransitionTime")
        cond["lastTransitionTime"] = prev["lastTransitionTime"] if prev is not None and same else now


def compute_status(*, name: str, namespace: str, generation: int, desired_replicas: int,
                   deployment: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
                   old_conditions: Iterable[Mapping[str, Any]] = (), now: str,
                   invalid_spec: str | None = None, blocked: Problem | None = None) -> dict[str, Any]:
    """The whole `status` of an LLMService (replaces the old one). `deployment`: the engine
    Deployment, or a LeaderWorkerSet in its shape (reconcile.py); `blocked`: why the engines
    cannot be created at all (an API the spec needs is not installed)."""
    pods = list(pods)
    dstatus = (deployment or {}).get("status") or {}
    replicas = int(dstatus.get("replicas") or 0)
    ready = int(dstatus.get("readyReplicas") or 0)
    updated = int(dstatus.get("updatedReplicas") or 0)
    dgen_seen = int(dstatus.get("observedGeneration") or 0)
    dgen = int(((deployment or {}).get("metadata") or {}).get("generation") or 0)

    blocker = Problem("InvalidSpec", invalid_spec) if invalid_spec else blocked
    problem: Problem | None = blocker
    if blocker is None and deployment is not None:
        problem = deployment_problem(deployment)
        for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
            problem = problem or pod_problem(pod)

    summary = f"{ready}/{desired_replicas} engines ready"
    if blocker:
        ready_cond = _condition("Ready", False, blocker.reason, blocker.message, generation)
    elif deployment is None:
        ready_cond = _condition("Ready", False, "EnginesNotCreated", "the engine Deployment does not exist yet",
                                generation)
    elif desired_replicas == 0:
        ready_cond = _condition("Ready", True, "ScaledToZero",
                                "no engines; the gateway holds requests until one is ready", generation)
    elif ready > 0:
        ready_cond = _condition("Ready", True, "EnginesReady", summary, generation)
    else:
        fetching = [m for p in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", ""))
                    if (m := downloading(p))]
        if problem:
            reason, message = problem.reason, problem.message
        elif fetching:
            reason, message = "ModelDownloading", f"{summary}; " + "; ".join(fetching)
        else:
            reason, message = "EnginesStarting", summary
        ready_cond = _condition("Ready", False, reason, message, generation)

    rolled_out = (deployment is not None and dgen_seen >= dgen and updated == desired_replicas
                  and replicas == desired_replicas and ready == desired_replicas)
    if blocker:
        progressing = _condition("Progressing", False, blocker.reason,
                                 "nothing is rolled out until " + ("the spec is fixed" if invalid_spec
                                                                   else "this is resolved"), generation)
    elif deployment is None or rolled_out:
        progressing = _condition("Progressing", False, "Complete" if rolled_out else "NotStarted",
                                 summary if rolled_out else "no engine rollout in progress", generation)
    else:
        progressing = _condition("Progressing", True, "RollingOut",
                                 f"{summary}, {updated} up to date, {replicas} running", generation)

    degraded = (_condition("Degraded", True, problem.reason, problem.message, generation) if problem
                else _condition("Degraded", False, "AsExpected", "no problems seen", generation))
    conditions = [ready_cond, progressing, degraded]
    _keep_transition_times(conditions, old_conditions, now)
    return {
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": naming.engine_selector(name),
        "url": naming.service_url(name, namespace),
        "observedGeneration": generation,
        "conditions": conditions,
    }

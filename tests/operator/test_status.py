"""LLMService status and conditions from Deployment and pod status (pure)."""
from __future__ import annotations

from pagedkube.operator.status import compute_status

NOW = "2026-01-02T03:04:05Z"
EARLIER = "2026-01-01T00:00:00Z"


def deployment(replicas: int = 2, ready: int = 2, updated: int = 2, generation: int = 1, seen: int = 1,
               conditions: list | None = None) -> dict:
    return {"metadata": {"generation": generation},
            "status": {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": updated,
                       "observedGeneration": seen, "conditions": conditions or []}}


def pod(name: str, *, init: list | None = None, containers: list | None = None, conditions: list | None = None) -> dict:
    return {"metadata": {"name": name}, "status": {"initContainerStatuses": init or [],
                                                   "containerStatuses": containers or [],
                                                   "conditions": conditions or []}}


def status(desired: int = 2, dep: dict | None = None, pods: list | None = None, old: list | None = None,
           invalid: str | None = None) -> dict:
    return compute_status(name="demo", namespace="ns", generation=7, desired_replicas=desired, deployment=dep,
                          pods=pods or [], old_conditions=old or [], now=NOW, invalid_spec=invalid)


def conds(s: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]}


def message(s: dict, type_: str) -> str:
    return next(c["message"] for c in s["conditions"] if c["type"] == type_)


def test_all_ready() -> None:
    s = status(dep=deployment())
    assert conds(s) == {"Ready": ("True", "EnginesReady"), "Progressing": ("False", "Complete"),
                        "Degraded": ("False", "AsExpected")}
    assert (s["replicas"], s["readyReplicas"], s["observedGeneration"]) == (2, 2, 7)
    assert s["selector"] == "app.kubernetes.io/component=engine,app.kubernetes.io/instance=demo,app.kubernetes.io/name=pagedkube"
    assert s["url"] == "http://demo.ns.svc.cluster.local"
    assert all(c["lastTransitionTime"] == NOW and c["observedGeneration"] == 7 for c in s["conditions"])


def test_rolling_out_and_not_yet_created() -> None:
    assert conds(status(dep=deployment(replicas=3, ready=1, updated=1)))["Progressing"] == ("True", "RollingOut")
    assert conds(status(dep=deployment(generation=2, seen=1)))["Progressing"] == ("True", "RollingOut")
    assert conds(status(dep=None)) == {"Ready": ("False", "EnginesNotCreated"),
                                       "Progressing": ("False", "NotStarted"), "Degraded": ("False", "AsExpected")}


def test_scaled_to_zero_is_ready() -> None:
    s = status(desired=0, dep=deployment(replicas=0, ready=0, updated=0))
    assert conds(s)["Ready"] == ("True", "ScaledToZero")
    assert conds(s)["Progressing"] == ("False", "Complete")


def test_image_pull_failure_names_the_pod_and_image() -> None:
    p = pod("demo-engine-1", containers=[{"name": "engine", "image": "ghcr.io/x/engine:nope", "state": {
        "waiting": {"reason": "ImagePullBackOff", "message": "manifest unknown"}}}])
    s = status(dep=deployment(ready=0), pods=[p])
    assert conds(s)["Degraded"] == ("True", "ImagePullFailing")
    assert conds(s)["Ready"] == ("False", "ImagePullFailing")
    assert message(s, "Degraded") == ("pod demo-engine-1: image ghcr.io/x/engine:nope cannot be pulled "
                                      "(ImagePullBackOff): manifest unknown")


def test_model_download_failure_points_at_the_init_container_logs() -> None:
    p = pod("demo-engine-2", init=[{"name": "model-download", "restartCount": 2,
                                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                                                 "message": "401 Client Error: gated repo"}}}])
    s = status(dep=deployment(ready=0), pods=[p])
    assert conds(s)["Degraded"] == ("True", "ModelDownloadFailing")
    assert message(s, "Degraded") == (
        "pod demo-engine-2: the model download failed (exit code 1): 401 Client Error: gated repo; "
        "check spec.model.source and the HF token; logs: kubectl logs demo-engine-2 -c model-download")


def test_crash_loop_and_unschedulable() -> None:
    crash = pod("demo-engine-3", containers=[{"name": "engine", "restartCount": 5,
                                              "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                              "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    s = status(dep=deployment(ready=1), pods=[crash])
    assert conds(s)["Ready"] == ("True", "EnginesReady")      # one engine still serves
    assert conds(s)["Degraded"] == ("True", "CrashLooping")
    assert "restarts 5, last exit code 137, OOMKilled" in message(s, "Degraded")
    pending = pod("demo-engine-4", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": "0/3 nodes have nvidia.com/gpu"}])
    s = status(dep=deployment(ready=0), pods=[pending])
    assert conds(s)["Degraded"] == ("True", "Unschedulable")
    assert message(s, "Degraded") == "pod demo-engine-4 cannot be scheduled: 0/3 nodes have nvidia.com/gpu"


def test_a_missing_secret_is_named() -> None:
    stuck = pod("demo-engine-5", containers=[{"name": "engine", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "mine" not found'}}}])
    s = status(dep=deployment(ready=0), pods=[stuck])
    assert conds(s)["Ready"] == ("False", "ContainerConfigError")
    assert conds(s)["Degraded"] == ("True", "ContainerConfigError")
    assert message(s, "Degraded") == ('pod demo-engine-5: container engine cannot start: secret "mine" not found; '
                                      "check the Secrets the LLMService names (docs/operator.md, Security model)")


def test_stalled_rollout_and_invalid_spec() -> None:
    stalled = deployment(ready=0, conditions=[{"type": "Progressing", "status": "False",
                                               "reason": "ProgressDeadlineExceeded", "message": "timed out"}])
    assert conds(status(dep=stalled))["Degraded"] == ("True", "ProgressDeadlineExceeded")
    s = status(dep=deployment(), invalid="spec.engine.blockSize must be one of (8, 16, 32, 64, 128), got 12")
    assert conds(s) == {"Ready": ("False", "InvalidSpec"), "Progressing": ("False", "InvalidSpec"),
                        "Degraded": ("True", "InvalidSpec")}


def test_transition_time_moves_only_when_the_status_flips() -> None:
    old = [{"type": "Ready", "status": "True", "reason": "EnginesReady", "lastTransitionTime": EARLIER},
           {"type": "Degraded", "status": "True", "reason": "CrashLooping", "lastTransitionTime": EARLIER}]
    s = status(dep=deployment(), old=old)
    times = {c["type"]: c["lastTransitionTime"] for c in s["conditions"]}
    assert times == {"Ready": EARLIER, "Progressing": NOW, "Degraded": NOW}

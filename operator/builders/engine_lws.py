"""A multi-node engine as a LeaderWorkerSet (sigs.k8s.io/lws), for spec.engine.nodesPerReplica > 1 (pure).

One replica of the LLMService is one LWS group of nodesPerReplica pods, each running
tensorParallelSize ranks of one engine:

    group i (replica i)
    leader  <name>-engine-i     pagedkube serve --nnodes K --master-port 29500 ...   HTTP :8000, rank 0
    worker  <name>-engine-i-1   pagedkube serve-worker --master-addr $(LWS_LEADER_ADDRESS)
    ...                                            --node-rank $(LWS_WORKER_INDEX)
    worker  <name>-engine-i-K-1

LWS sets LWS_LEADER_ADDRESS (the leader's name in the group's headless Service) and
LWS_WORKER_INDEX (0 for the leader, 1..K-1 for the workers) in every container; Kubernetes
expands the $(...) in args from them. The worker reads the model and every engine setting from
the leader (engine/distributed/node.py), so only the model's files must be the same in both,
which the shared model mount gives.

The gateway must send requests to leaders only: leader pods carry the engine component label,
worker pods `engine-worker`, so the engine's headless Service, its PodDisruptionBudget, the
status and the HPA's selector (all on component=engine) see one pod per group. A worker that
dies takes its group with it (RecreateGroupOnPodRestart): a tensor-parallel engine cannot step
without every rank, and the leader exits non-zero anyway. spec.replicas is the number of groups,
so the LLMService's scale subresource and the gateway's autoscaler scale groups.
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.builders.common import container_security_context, maybe, pod_security_context
from pagedkube.operator.builders.engine import (
    ENGINE_CONTAINER, engine_env, engine_image, engine_model_mount, engine_pod, engine_server_pod, engine_volumes)
from pagedkube.operator.builders.security import SECRET_VERSION_ANNOTATION
from pagedkube.operator.spec import LLMServiceSpec

# A group's pods start together: the leader's store waits for the workers (engine
# --distributed-timeout), so the workers need not wait for the leader to be ready.
STARTUP_POLICY = "LeaderCreated"
# A headless Service per group, named after its leader pod (NAME-engine-i), in which the workers find
# their leader: LWS_LEADER_ADDRESS is NAME-engine-i.NAME-engine-i.NAMESPACE. Not LWS's default, Shared:
# its one Service would be named after the LWS, NAME-engine, which is our engine Service; LWS then
# creates none, and ours publishes ready leaders only, while a leader is ready only once its workers
# have joined, which they cannot do without its address (seen on the e2e node: they never resolve it).
SUBDOMAIN_POLICY = "UniquePerReplica"


def engine_worker_pod(svc: LLMServiceSpec, model_cache_host_path: str = "") -> dict[str, Any]:
    """A worker node's pod: `pagedkube serve-worker`, no HTTP (so no probes; its leader's are the group's)."""
    e = svc.engine
    image = engine_image(svc)
    mount = engine_model_mount(svc, image, model_cache_host_path)
    volumes, mounts = engine_volumes(svc, mount)
    container = {
        "name": ENGINE_CONTAINER,
        "image": image,
        **maybe("imagePullPolicy", e.image_pull_policy),
        "command": ["pagedkube"],
        "args": ["serve-worker", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", str(naming.MASTER_PORT),
                 "--node-rank", "$(LWS_WORKER_INDEX)"],
        "env": engine_env(svc, mount.env),
        **maybe("resources", dict(e.resources)),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    return engine_pod(svc, container, mount, volumes)


def _template(svc: LLMServiceSpec, component: str, secret_version: str, pod: dict[str, Any]) -> dict[str, Any]:
    annotations = {SECRET_VERSION_ANNOTATION: secret_version} if secret_version else {}
    return {
        "metadata": {"labels": naming.labels(svc.name, component), **maybe("annotations", annotations)},
        "spec": {"enableServiceLinks": False, "securityContext": pod_security_context(), **pod},
    }


def build_engine_leader_worker_set(svc: LLMServiceSpec, secret_version: str = "",
                                   model_cache_host_path: str = "") -> dict[str, Any]:
    """The engine's LeaderWorkerSet: spec.replicas groups of spec.engine.nodesPerReplica pods."""
    assert svc.engine.nodes_per_replica > 1, "a single-node engine is a Deployment (engine.py)"
    # Without spare GPUs a surge group cannot schedule; replace one group at a time instead.
    rolling = {"maxSurge": 0, "maxUnavailable": 1} if svc.engine.num_gpus else {"maxSurge": 1, "maxUnavailable": 0}
    return {
        "apiVersion": naming.LWS_API_VERSION,
        "kind": naming.LWS_KIND,
        "metadata": naming.metadata(naming.engine_name(svc.name), svc.namespace, svc.name, svc.uid, "engine"),
        "spec": {
            "replicas": svc.replicas,
            "startupPolicy": STARTUP_POLICY,
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling},
            "networkConfig": {"subdomainPolicy": SUBDOMAIN_POLICY},
            "leaderWorkerTemplate": {
                "size": svc.engine.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _template(svc, "engine", secret_version,
                                            engine_server_pod(svc, model_cache_host_path)),
                "workerTemplate": _template(svc, naming.ENGINE_WORKER, secret_version,
                                            engine_worker_pod(svc, model_cache_host_path)),
            },
        },
    }

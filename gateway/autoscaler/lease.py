"""One acting autoscaler among the gateway replicas: a coordination.k8s.io/v1 Lease.

client-go's leader election, reduced to the verbs the gateway's Role grants
(get and update of the one Lease the operator made for it; create where it may, as
a gateway run by hand with wider rights does):

    GET lease        404        -> POST a new one naming us              -> leader
                     ours       -> PUT renewTime = now                   -> leader
                     free or    -> PUT holderIdentity = us, acquireTime,
                     expired       leaseTransitions + 1                  -> leader
                     someone's, fresh                                    -> follower
    PUT/POST answer 409 (someone else wrote first: resourceVersion) -> follower

Expired = renewTime + leaseDurationSeconds is in the past, by this gateway's wall
clock (client-go compares against its own observation time instead; the
gateway replicas of one cluster share NTP time). Release on shutdown empties
holderIdentity so the next replica takes over at once.
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
import uuid
from typing import Any, Callable

log = logging.getLogger("pagedkube.autoscaler")

DEFAULT_LEASE_DURATION_S = 15   # client-go's LeaseDuration default


def lease_name(llmservice: str) -> str:
    """The autoscaler Lease of an LLMService: the operator creates it empty, so the gateway's
    Role needs only get and update on this one name (operator/builders/rbac.py)."""
    return f"{llmservice}-autoscaler"


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def format_micro_time(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class LeaseElector:
    def __init__(self, api: Any, namespace: str, name: str, identity: str,
                 duration_s: int = DEFAULT_LEASE_DURATION_S, now: Callable[[], datetime.datetime] = _utcnow):
        self.api = api   # KubeApi
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration_s = int(duration_s)
        self.now = now
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.is_leader = False

    def try_acquire_or_renew(self) -> bool:
        leader = self._try()
        if leader != self.is_leader:
            log.info("%s %s the autoscaler lease %s/%s", self.identity, "holds" if leader else "lost",
                     self.namespace, self.name)
        self.is_leader = leader
        return leader

    def _try(self) -> bool:
        now = self.now()
        status, lease = self.api.call("GET", f"{self.path}/{self.name}")
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, acquired=now, transitions=0)}
            status, _ = self.api.call("POST", self.path, body=body)
            return status < 300
        if status >= 400:
            raise RuntimeError(f"GET lease {self.namespace}/{self.name}: HTTP {status}: {lease}")
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            new_spec = self._spec(now, acquired=parse_micro_time(spec.get("acquireTime")) or now,
                                  transitions=transitions)
        elif not holder or self._expired(spec, now):
            new_spec = self._spec(now, acquired=now, transitions=transitions + 1)
        else:
            return False
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {**lease.get("metadata", {}), "name": self.name, "namespace": self.namespace},
                "spec": new_spec}
        status, _ = self.api.call("PUT", f"{self.path}/{self.name}", body=body)
        return status < 300

    def _expired(self, spec: dict, now: datetime.datetime) -> bool:
        renewed = parse_micro_time(spec.get("renewTime")) or parse_micro_time(spec.get("acquireTime"))
        duration = int(spec.get("leaseDurationSeconds") or self.duration_s)
        return renewed is None or renewed + datetime.timedelta(seconds=duration) < now

    def _spec(self, now: datetime.datetime, acquired: datetime.datetime, transitions: int) -> dict:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_s,
                "acquireTime": format_micro_time(acquired), "renewTime": format_micro_time(now),
                "leaseTransitions": transitions}

    def release(self) -> None:
        if not self.is_leader:
            return
        try:
            status, lease = self.api.call("GET", f"{self.path}/{self.name}")
            if status == 200 and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["leaseDurationSeconds"] = 1
                self.api.call("PUT", f"{self.path}/{self.name}", body=lease)
        except Exception as e:  # noqa: BLE001  shutting down: the lease expires on its own
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, e)
        self.is_leader = False

"""Drift detection between what the operator applies and what is live (pure)."""
from __future__ import annotations

import copy

from pagedkube.operator.drift import applied_hash, is_subset, needs_apply, with_hash
from pagedkube.operator.naming import HASH_ANNOTATION

DESIRED = with_hash({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "labels": {"a": "1"}},
                     "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"a": "1"}}})


def live_copy() -> dict:
    live = copy.deepcopy(DESIRED)
    # What the API server adds: server metadata, defaults, status.
    live["metadata"].update(uid="u", resourceVersion="7")
    live["spec"]["ports"][0]["protocol"] = "TCP"
    live["spec"]["clusterIP"] = "10.0.0.1"
    live["status"] = {"loadBalancer": {}}
    return live


def test_hash_is_stable_and_excludes_itself() -> None:
    plain = copy.deepcopy(DESIRED)
    del plain["metadata"]["annotations"]
    assert DESIRED["metadata"]["annotations"][HASH_ANNOTATION] == applied_hash(plain)
    assert len(applied_hash(plain)) == 16


def test_server_additions_are_not_drift() -> None:
    assert not needs_apply(DESIRED, live_copy())


def test_missing_edited_or_stale_objects_are_drift() -> None:
    assert needs_apply(DESIRED, None)
    edited = live_copy()
    edited["spec"]["selector"]["a"] = "2"
    assert needs_apply(DESIRED, edited)
    extra_port = live_copy()
    extra_port["spec"]["ports"].append({"name": "debug", "port": 9000})
    assert needs_apply(DESIRED, extra_port)
    stale = live_copy()  # applied by an older operator version: another hash
    stale["metadata"]["annotations"][HASH_ANNOTATION] = "0" * 16
    assert needs_apply(DESIRED, stale)


def test_quantities_written_back_as_strings_match() -> None:
    assert is_subset({"limits": {"nvidia.com/gpu": 1}}, {"limits": {"nvidia.com/gpu": "1"}})
    assert not is_subset({"limits": {"nvidia.com/gpu": 2}}, {"limits": {"nvidia.com/gpu": "1"}})
    assert not is_subset({"flag": True}, {"flag": "True"})

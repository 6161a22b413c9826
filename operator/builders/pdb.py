"""The engine PodDisruptionBudget (pure).

maxUnavailable 1 (not minAvailable) so a single-replica service can still be
drained off a node, while a voluntary disruption never takes more than one
engine and its prefix cache away at once.
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.spec import LLMServiceSpec


def build_engine_pdb(svc: LLMServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": naming.metadata(naming.engine_name(svc.name), svc.namespace, svc.name, svc.uid, "engine"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": naming.selector_labels(svc.name, "engine")},
        },
    }

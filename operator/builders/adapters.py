"""spec.adapters -> the ConfigMap the engines read, and the engine pod's LoRA flags and mounts (pure).

How an edit of spec.adapters reaches running engines without restarting them:

    operator   applies ConfigMap <name>-adapters: lora-modules.json, the adapters as vLLM's JSON
               --lora-modules objects ([{"name", "path"}], path = a Hub name or a mounted folder)
    kubelet    refreshes the file in every engine pod that mounts it (its sync period, about a
               minute; a ConfigMap volume, not a subPath, so the file does change in place)
    init       the model-download init container of a Hub model fetches the listed Hub adapters
               into the model cache too (`pagedkube download MODEL --lora-modules-file FILE`)
    engine     `pagedkube serve --lora-modules-file FILE` serves the listed adapters from start-up
               and, while it runs, loads what the file adds and unloads what it drops
               (engine/server/lora_file.py), as /v1/load_lora_adapter and /unload do

The pod template holds only what does not change with the list: --enable-lora, --max-loras (a
fixed number, spec.DEFAULT_MAX_LORAS, not the count), --max-lora-rank, the file's path, and one
read-only volume per PVC the adapters name. So the template changes (and the engines roll) only
when LoRA is switched on or off, or the first adapter of a new claim comes or the last goes.

Why the engines follow a file rather than the operator calling each pod's load endpoint: the
operator holds no read on Secrets (reconcile.py), so it has no engine key, and the engines'
NetworkPolicy admits only the gateway and the scraper; and a file is what a pod that starts
later (a scale-up, a restart) reads too, with nobody to call it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.adapters import ADAPTERS_MOUNT, adapter_claims
from pagedkube.operator.spec import LLMServiceSpec

MODULES_KEY = "lora-modules.json"
MODULES_VOLUME = "lora-modules"
MODULES_MOUNT = "/etc/pagedkube/adapters"
MODULES_FILE = f"{MODULES_MOUNT}/{MODULES_KEY}"


def lora_modules(svc: LLMServiceSpec) -> list[dict[str, str]]:
    """The file's content: vLLM's JSON --lora-modules objects, in spec order."""
    return [{"name": a.name, "path": a.engine_path} for a in svc.adapters]


def build_adapters_config_map(svc: LLMServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": naming.metadata(naming.adapters_config_map_name(svc.name), svc.namespace, svc.name, svc.uid,
                                    "engine"),
        "data": {MODULES_KEY: json.dumps(lora_modules(svc), indent=1) + "\n"},
    }


@dataclass(slots=True)
class LoRAPod:
    args: list[str] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)


def fetch_adapters_too(download: dict[str, Any]) -> None:
    """The model-download init container (builders/model.py) also fetches the Hub adapters the
    ConfigMap lists at pod creation into the same cache, so engines start with them on disk;
    one it cannot fetch is the engine's to retry (engine/download_cli.py), never a failed pod."""
    download["args"] = [*download["args"], "--lora-modules-file", MODULES_FILE]
    download["volumeMounts"] = [*download["volumeMounts"],
                                {"name": MODULES_VOLUME, "mountPath": MODULES_MOUNT, "readOnly": True}]


def claim_volume_name(claim: str) -> str:
    """A volume name for any claim name (a DNS label; a claim's own name may be up to 253 long)."""
    return f"adapters-{hashlib.sha256(claim.encode()).hexdigest()[:12]}"


def lora_pod(svc: LLMServiceSpec) -> LoRAPod:
    """The engine's flags, volumes and mounts for spec.adapters; empty when LoRA is off."""
    if not svc.lora_enabled:
        return LoRAPod()
    pod = LoRAPod(
        args=["--enable-lora", "--max-loras", str(svc.max_loras), "--max-lora-rank", str(svc.engine.max_lora_rank),
              "--lora-modules-file", MODULES_FILE],
        volumes=[{"name": MODULES_VOLUME, "configMap": {"name": naming.adapters_config_map_name(svc.name)}}],
        mounts=[{"name": MODULES_VOLUME, "mountPath": MODULES_MOUNT, "readOnly": True}],
    )
    for claim in adapter_claims(svc.adapters):
        volume = claim_volume_name(claim)
        pod.volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        pod.mounts.append({"name": volume, "mountPath": f"{ADAPTERS_MOUNT}/{claim}", "readOnly": True})
    return pod

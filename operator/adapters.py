"""spec.adapters: the LoRA adapters an LLMService serves beside its model (pure, torch-free).

    adapters:
      - {name: vet-notes, source: hf://clinic/vet-notes-lora}      a PEFT adapter repo on the Hub
      - {name: cat-care,  source: pvc://adapters/cat-care}          a PEFT folder inside a PVC

Each adapter is a `model` name in requests (docs/server.md "LoRA adapters"). How an edit
reaches running engines without restarting them: builders/adapters.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from pagedkube import model_source as ms
from pagedkube.hub_model import parse_hub_model

# One engine serves up to this many: each is a `model` in /v1/models and a label value of
# vllm:lora_requests_info; the ConfigMap that lists them stays far below its 1 MiB limit.
MAX_ADAPTERS = 64
# DNS-1123 label, as vLLM's docs name adapters (sql-lora): a name that is safe in a URL, a metric
# label and a file name, and cannot be mistaken for a Hub repo or a path.
ADAPTER_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
MAX_ADAPTER_NAME = 63
# A PEFT adapter is a folder (adapter_config.json + adapter_model.safetensors), never a GGUF: the
# Hub form is ORG/NAME[@REV] only.
HUB_ADAPTER = rf"(hf://)?{ms.HF_REPO}(@{ms.HF_REVISION})?"
ADAPTER_SOURCE_PATTERN = rf"^({HUB_ADAPTER}|pvc://{ms.PVC_CLAIM}{ms.PVC_PATH})$"
ADAPTERS_MOUNT = "/adapters"         # pvc://CLAIM/PATH is ADAPTERS_MOUNT/CLAIM/PATH in the engine pod


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    name: str
    source: str           # as written in the spec
    hub_name: str = ""    # hf: ORG/NAME[@REV], as the engine's load takes it
    claim: str = ""       # pvc
    path: str = ""        # pvc: path inside the claim, no leading slash

    @property
    def engine_path(self) -> str:
        """The lora_path an engine is given: a Hub name (the engine fetches it into its Hub
        cache) or the folder where the claim is mounted."""
        return self.hub_name or f"{ADAPTERS_MOUNT}/{self.claim}/{self.path}"


def parse_adapter(item: Any, where: str) -> AdapterSpec:
    if not isinstance(item, Mapping) or set(item) - {"name", "source"}:
        raise ValueError(f"{where} must be an object with name and source, got {item!r}")
    name, source = item.get("name"), item.get("source")
    if not isinstance(name, str) or len(name) > MAX_ADAPTER_NAME or not re.fullmatch(ADAPTER_NAME, name):
        raise ValueError(f"{where}.name {name!r} must be a DNS label: 1-{MAX_ADAPTER_NAME} lower-case letters, "
                         f"digits and '-', starting and ending with a letter or digit")
    if not isinstance(source, str) or not re.fullmatch(ADAPTER_SOURCE_PATTERN, source) \
            or ms.has_dot_dot_segment(source):
        raise ValueError(f"{where}.source {source!r} must be a PEFT adapter on the Hub, [hf://]ORG/NAME[@REVISION], "
                         f"or a folder in a PersistentVolumeClaim, pvc://CLAIM/PATH (no '..' segment)")
    if source.startswith("pvc://"):
        claim, _, path = source[len("pvc://"):].partition("/")
        if not path.strip("/"):
            raise ValueError(f"{where}.source {source!r} names no folder inside the claim")
        return AdapterSpec(name, source, claim=claim, path=path.strip("/"))
    hub = parse_hub_model(source)
    assert hub is not None and not hub.quant and not hub.filename, source   # ADAPTER_SOURCE_PATTERN's shape
    return AdapterSpec(name, source, hub_name=hub.repo_id + (f"@{hub.revision}" if hub.revision else ""))


def parse_adapters(value: Any, model_name: str) -> tuple[AdapterSpec, ...]:
    """spec.adapters (None or absent: none); ValueError for a bad entry, a repeated name or one
    that is the served model's own name."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"spec.adapters must be a list of {{name, source}}, got {value!r}")
    if len(value) > MAX_ADAPTERS:
        raise ValueError(f"spec.adapters lists {len(value)} adapters; at most {MAX_ADAPTERS}")
    adapters = tuple(parse_adapter(item, f"spec.adapters[{i}]") for i, item in enumerate(value))
    seen: set[str] = set()
    for a in adapters:
        if a.name in seen:
            raise ValueError(f"spec.adapters names {a.name!r} twice")
        if a.name == model_name:
            raise ValueError(f"spec.adapters: {a.name!r} is the served model's name; an adapter needs its own")
        seen.add(a.name)
    return adapters


def adapter_claims(adapters: tuple[AdapterSpec, ...]) -> tuple[str, ...]:
    """The PVCs the engine pods mount for pvc:// adapters, sorted (a stable pod template)."""
    return tuple(sorted({a.claim for a in adapters if a.claim}))

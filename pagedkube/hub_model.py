"""A Hugging Face Hub model by name, and which of its files the engine reads (no network here).

    ORG/NAME                  a safetensors checkpoint (config.json, model*.safetensors, tokenizer
                              files); a repo of GGUF files only: its one GGUF, else its Q4_K_M
    ORG/NAME:QUANT            the GGUF whose file name carries QUANT (case-insensitive), as
                              llama.cpp's `-hf org/repo:Q4_K_M` and Ollama's `hf.co/org/repo:Q4_K_M` pick
    ORG/NAME/FILE.gguf        that GGUF file
    ...@REVISION              a branch, tag or commit (default: main)

each optionally prefixed `hf://`, `hf.co/` or `huggingface.co/`. A local path that exists wins
over a repo id that reads the same (vLLM does the same), so pagedkube.model_source asks here only
after the path test fails.

Only the files the engine reads are downloaded: a Mistral repo's consolidated.safetensors, an
ONNX export or the other quants of a GGUF repo are left on the Hub.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

GGUF_SUFFIX = ".gguf"
# llama.cpp's default tag when `-hf org/repo` names no quant (common/arg.cpp), which we follow
# when a repo holds several GGUF files.
DEFAULT_QUANT = "Q4_K_M"
# What a safetensors checkpoint's engine reads (pagedkube.tokenizer.TOKENIZER_FILES, the loader's
# index and shards), as snapshot_download allow_patterns (fnmatch).
CHECKPOINT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                    "model.safetensors", "model.safetensors.index.json")
SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")   # transformers' shard names
# A LoRA adapter repo as peft's save_pretrained writes it (the engine reads no pickled .bin).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")

_PREFIX = r"(?:hf://|hf\.co/|huggingface\.co/)?"
_REPO = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME = re.compile(rf"^{_PREFIX}(?P<repo>{_REPO})(?:/(?P<file>[^@:\s]+\.gguf)|:(?P<quant>[A-Za-z0-9._-]+))?"
                   rf"(?:@(?P<revision>[A-Za-z0-9._/-]+))?$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class HubModel:
    repo_id: str
    revision: str | None = None    # None = the repo's default branch
    quant: str | None = None       # ORG/NAME:QUANT
    filename: str | None = None    # ORG/NAME/FILE.gguf

    @property
    def name(self) -> str:
        """The served model name: the repo id, with the quant or file when one was named."""
        if self.quant:
            return f"{self.repo_id}:{self.quant}"
        return f"{self.repo_id}/{self.filename}" if self.filename else self.repo_id


def parse_hub_model(model: str) -> HubModel | None:
    """The Hub model `model` names, or None when it is not shaped like one."""
    m = _NAME.match(model)
    if m is None or ".." in model:
        return None
    return HubModel(m["repo"], m["revision"], m["quant"], m["file"])


@dataclass(frozen=True, slots=True)
class HubFiles:
    """The files of one repo revision the engine reads: gguf names the weights when it is a GGUF."""
    paths: tuple[str, ...]
    gguf: str | None = None


def quant_matches(filename: str, quant: str) -> bool:
    """Whether a GGUF's file name carries `quant` as a whole tag: Q4_K matches model.Q4_K.gguf,
    not model-Q4_K_M.gguf; case-insensitive (q4_k_m.gguf is Q4_K_M)."""
    stem = filename.rsplit("/", 1)[-1].lower().removesuffix(GGUF_SUFFIX)
    return re.search(rf"(?<![a-z0-9]){re.escape(quant.lower())}(?![a-z0-9_])", stem) is not None


def choose_files(model: HubModel, repo_files: Iterable[str]) -> HubFiles:
    """The files to fetch out of a revision's listing; ValueError naming what the repo offers
    when the name asks for something it lacks."""
    files = sorted(repo_files)
    ggufs = [f for f in files if f.endswith(GGUF_SUFFIX) and "/" not in f]
    if model.filename:
        if model.filename not in files:
            raise ValueError(f"{model.repo_id} has no file {model.filename!r}; its GGUF files: {_listing(ggufs)}")
        return HubFiles((model.filename,), model.filename)
    if model.quant:
        return _gguf(model, [f for f in ggufs if quant_matches(f, model.quant)], ggufs, model.quant)
    checkpoint = tuple(f for f in files if f in CHECKPOINT_FILES or SHARD.fullmatch(f))
    has_weights = any(f.endswith(".safetensors") for f in checkpoint)
    if "config.json" in checkpoint and has_weights:
        return HubFiles(checkpoint)
    if len(ggufs) == 1:
        return HubFiles((ggufs[0],), ggufs[0])
    if ggufs:
        return _gguf(model, [f for f in ggufs if quant_matches(f, DEFAULT_QUANT)], ggufs, DEFAULT_QUANT)
    raise ValueError(f"{model.repo_id} holds neither a safetensors checkpoint (config.json and "
                     f"model*.safetensors) nor a GGUF file; the engine reads one of those")


def choose_adapter_files(model: HubModel, repo_files: Iterable[str]) -> HubFiles:
    """A PEFT adapter's files (choose_files' counterpart for a --lora-modules or load_lora_adapter
    path that names a Hub repo); ValueError naming what is missing."""
    files = set(repo_files)
    missing = [f for f in ADAPTER_FILES if f not in files]
    if model.quant or model.filename or missing:
        raise ValueError(f"{model.repo_id} is not a PEFT LoRA adapter repo: it has no {' or '.join(missing)}"
                         if missing else f"{model.name} names a file in a repo; an adapter is a whole repo")
    return HubFiles(ADAPTER_FILES)


def _gguf(model: HubModel, matching: list[str], ggufs: list[str], quant: str) -> HubFiles:
    if len(matching) == 1:
        return HubFiles((matching[0],), matching[0])
    if not ggufs:
        raise ValueError(f"{model.repo_id} has no GGUF files (a GGUF name, ORG/NAME:QUANT, needs one)")
    if not matching:
        raise ValueError(f"{model.repo_id} has no GGUF file for {quant}; name one of {_listing(ggufs)} "
                         f"as {model.repo_id}:QUANT or {model.repo_id}/FILE.gguf")
    raise ValueError(f"{len(matching)} GGUF files of {model.repo_id} match {quant}: {_listing(matching)}; "
                     f"name one as {model.repo_id}/FILE.gguf")


def _listing(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


# GGUF value types (ggml's gguf.h) and the byte sizes of the fixed-size ones.
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_architecture(head: bytes) -> str | None:
    """`general.architecture` read from the first bytes of a GGUF file, None when they end
    before it. The `gguf` package reads whole files (a memory map); this reads a prefix, so a
    Hub GGUF's architecture is checked from one range request before gigabytes are downloaded.
    llama.cpp's converters write general.architecture first."""
    import struct

    if head[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", head, at)
        if at + 8 + n > len(head):
            raise struct.error("truncated")
        return head[at + 8:at + 8 + n].decode("utf-8", "replace"), at + 8 + n

    def skip(kind: int, at: int) -> int:
        if kind == _GGUF_STRING:
            return string(at)[1]
        if kind == _GGUF_ARRAY:
            item, count = struct.unpack_from("<IQ", head, at)
            at += 12
            for _ in range(count):
                at = skip(item, at)
                if at > len(head):
                    raise struct.error("truncated")
            return at
        return at + _GGUF_SIZES[kind]

    try:
        (num_kv,) = struct.unpack_from("<Q", head, 16)   # magic, u32 version, u64 tensors, u64 kv
        at = 24
        for _ in range(num_kv):
            key, at = string(at)
            (kind,) = struct.unpack_from("<I", head, at)
            if key == "general.architecture" and kind == _GGUF_STRING:
                return string(at + 4)[0]
            at = skip(kind, at + 4)
    except (struct.error, KeyError):
        return None
    return None

"""GGUF tensors -> Hugging Face names and layouts, one tensor at a time.

llama.cpp renames every tensor and, for the llama architecture only, permutes the rows
of attn_q / attn_k so that its rope can rotate adjacent pairs (convert_hf_to_gguf.py's
LlamaModel.permute). transformers undoes it on load (LlamaTensorProcessor); so do we:

    gguf rows, per head:  [x0 y0 x1 y1 ...]   (pairs interleaved)
    HF rows,   per head:  [x0 x1 ... | y0 y1 ...]   (rotate_half halves)

Qwen2 is converted without that permutation. `hf_tensors` yields an HFTensor (HF name,
value, the file's type) for engine/loader.py, which places them (fused q|k|v, gate|up)
exactly once. With `packed=True` (--quantization auto) a projection weight stored as
Q8_0/Q4_0/Q4_1/Q4_K comes as the file's blocks repacked (engine/gguf/packing.py, no
float pass) and its rows are un-permuted as packed rows: a row is one output channel,
with its own codes and group scales, so moving rows is exact. Everything else
(embeddings, norms, other types) comes dequantized to float32.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from pagedkube.engine.gguf.packing import PACKED_TYPES, pack_gguf
from pagedkube.engine.gguf.reader import GGUFFile, GGUFTensor, dequantize
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight

TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# the linear layers' weights, which may stay packed (embeddings and norms never do)
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(name: str) -> str:
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    m = LAYER_NAME.match(name)
    if m is None or m.group(2) not in LAYER:
        if name == "rope_freqs.weight":
            raise ValueError("this GGUF carries rope_freqs (Llama 3.1-style rope scaling), which is not supported")
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    layer, kind, part = m.groups()
    return f"model.layers.{layer}.{LAYER[kind]}.{part}"


def unpermute_rows(values: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (transformers' _reverse_permute_weights)."""
    dim = values.shape[0] // num_heads // 2
    return values.reshape(num_heads, dim, 2, *values.shape[1:]).swapaxes(2, 1).reshape(values.shape)


@dataclass(frozen=True)
class HFTensor:
    name: str                                   # Hugging Face name
    value: torch.Tensor | QuantizedWeight       # float32, or the file's blocks repacked
    ggml_type: str                              # what the file stored it as


def is_projection(name: str) -> bool:
    m = LAYER_NAME.match(name)
    return m is not None and m.group(2) in PROJECTIONS and m.group(3) == "weight"


def _unpermute_packed(w: QuantizedWeight, num_heads: int) -> QuantizedWeight:
    def rows(t: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(unpermute_rows(t.numpy(), num_heads)))
    if isinstance(w, Int8Weight):
        return Int8Weight(rows(w.qweight), rows(w.scales), w.group_size)
    return Int4Weight(rows(w.qweight), rows(w.scales), rows(w.mins), w.group_size)


def to_hf(tensor: GGUFTensor, cfg: ModelConfig, arch: str, packed: bool = False) -> HFTensor:
    name = hf_name(tensor.name)
    heads = None
    if arch == "llama" and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
        heads = cfg.num_attention_heads if ".attn_q." in tensor.name else cfg.num_key_value_heads
    if packed and tensor.ggml_type in PACKED_TYPES and is_projection(tensor.name):
        w = pack_gguf(tensor.raw, tensor.ggml_type, tensor.shape)
        return HFTensor(name, w if heads is None else _unpermute_packed(w, heads), tensor.ggml_type)
    values = dequantize(tensor)
    if heads is not None:
        values = unpermute_rows(values, heads)
    if not values.flags.writeable:      # F32 tensors come back as views of the read-only memory map
        values = values.copy()
    return HFTensor(name, torch.from_numpy(np.ascontiguousarray(values)), tensor.ggml_type)


def hf_tensors(f: GGUFFile, cfg: ModelConfig, packed: bool = False,
               skip: frozenset[str] = frozenset()) -> Iterator[HFTensor]:
    """skip: GGUF tensor names the caller placed itself (the vocabulary kept packed)."""
    f.check_types()
    for tensor in f.tensors():
        if tensor.name not in skip:
            yield to_hf(tensor, cfg, f.architecture, packed)

"""GGUF tensors -> Hugging Face names and layouts, one tensor at a time.

llama.cpp renames every tensor and, for the llama architecture only, permutes the rows
of attn_q / attn_k so that its rope can rotate adjacent pairs (convert_hf_to_gguf.py's
LlamaModel.permute). transformers undoes it on load (LlamaTensorProcessor); so do we:

    gguf rows, per head:  [x0 y0 x1 y1 ...]   (pairs interleaved)
    HF rows,   per head:  [x0 x1 ... | y0 y1 ...]   (rotate_half halves)

Qwen2 is converted without that permutation. `hf_tensors` yields (HF name, float32
tensor) for engine/loader.py, which places them (fused q|k|v, gate|up) exactly once.
"""
from __future__ import annotations

import re
from typing import Iterator

import numpy as np
import torch

from pagedkube.engine.gguf.reader import GGUFFile, GGUFTensor, dequantize
from pagedkube.engine.model_config import ModelConfig

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


def to_hf(tensor: GGUFTensor, cfg: ModelConfig, arch: str) -> tuple[str, torch.Tensor]:
    name = hf_name(tensor.name)
    values = dequantize(tensor)
    if arch == "llama" and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
        heads = cfg.num_attention_heads if ".attn_q." in tensor.name else cfg.num_key_value_heads
        values = unpermute_rows(values, heads)
    if not values.flags.writeable:      # F32 tensors come back as views of the read-only memory map
        values = values.copy()
    return name, torch.from_numpy(np.ascontiguousarray(values))


def hf_tensors(f: GGUFFile, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    f.check_types()
    for tensor in f.tensors():
        yield to_hf(tensor, cfg, f.architecture)

"""One decoder-only transformer for the Llama, Qwen2, Qwen3 and Mistral families.

The families differ only in flags that ModelConfig sets (biases, q/k RMSNorm,
head_dim); vLLM's llama.py covers them the same way. Module names follow the
Hugging Face checkpoints (model.layers.N.self_attn...), except two fused
projections that the loader fills from the checkpoint's pieces:

    qkv_proj.weight     = cat(q_proj, k_proj, v_proj)     [(Hq + 2 Hkv) D, hidden]
    gate_up_proj.weight = cat(gate_proj, up_proj)          [2 I, hidden]

A step is one flat batch of T tokens from many sequences, no padding:
input_ids [T], positions [T]; hidden states are [T, hidden]. Attention writes
this step's K/V into the paged pool first, then attends through the block
tables (engine/attention/metadata.py has the layout).

`linear` builds the four projections (qkv, o, gate_up, down): nn.Linear, or
engine/quant/linear.py's QuantLinear when the weights stay packed (--quantization).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from pagedkube.engine.attention.backend import AttentionBackend
from pagedkube.engine.attention.metadata import AttentionMetadata
from pagedkube.engine.layers.activation import SiluAndMul
from pagedkube.engine.layers.rms_norm import RMSNorm
from pagedkube.engine.layers.rotary import RotaryEmbedding, apply_rotary
from pagedkube.engine.model_config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # k, v: [num_blocks, block_size, Hkv, D]
LinearFactory = Callable[..., nn.Module]     # (in_features, out_features, bias=) like nn.Linear


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, linear: LinearFactory = nn.Linear):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.backend = backend
        self.qkv_proj = linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.backend.paged_attention(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, linear: LinearFactory = nn.Linear):
        super().__init__()
        self.gate_up_proj = linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, linear: LinearFactory = nn.Linear):
        super().__init__()
        self.self_attn = Attention(cfg, backend, linear)
        self.mlp = MLP(cfg, linear)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, linear: LinearFactory = nn.Linear):
        super().__init__()
        # An explicit weight skips Embedding's random init: on the meta device its normal_ runs
        # torch's Python reference kernels, whose import (torch._dynamo) costs ~2 s of a start.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, linear) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """forward(input_ids, positions, kv_caches, meta) -> hidden [T, hidden];
    compute_logits(hidden rows to sample) -> float32 logits [N, vocab]."""

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int,
                 device: torch.device | str = "cpu", linear: LinearFactory = nn.Linear):
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, backend, linear)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Not a buffer: the table is built on the target device and survives to_empty().
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_type,
                                      cfg.rope_scaling, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVCache], meta: AttentionMetadata) -> torch.Tensor:
        assert len(kv_caches) == len(self.model.layers), (len(kv_caches), len(self.model.layers))
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            hidden = layer(hidden, cos, sin, kv_cache, meta)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

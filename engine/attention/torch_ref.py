"""Reference paged attention in plain torch: the CPU path and the oracle for the
Triton kernels. Clear rather than fast: gathers each sequence's context from the
pool through its block table and runs causal attention in float32."""
from __future__ import annotations

import torch

from pagedkube.engine.attention.metadata import AttentionMetadata


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key/value [T, Hkv, D] -> caches [num_blocks, block_size, Hkv, D] at slot_mapping[t] (< 0 = skip)."""
    num_blocks, block_size = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[seq_len, Hkv, D] view of one sequence's context in the pool."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]            # [nb, bs, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """query [T, Hq, D] -> out [T, Hq, D]; Hq must be a multiple of Hkv (GQA)."""
    num_q_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    for b, seq_len in enumerate(seq_lens):
        q = query[starts[b]:starts[b + 1]].float()             # [q_len, Hq, D]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        k = gather_context(k_cache, meta.block_tables[b], seq_len).float()
        v = gather_context(v_cache, meta.block_tables[b], seq_len).float()
        k = k.repeat_interleave(group, dim=1)                  # [S, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale    # [Hq, q_len, S]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        scores.masked_fill_(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[b]:starts[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out

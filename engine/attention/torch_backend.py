"""The torch attention backend: torch_ref's math with the decode rows batched.

torch_ref.paged_attention loops over sequences in Python, a dozen small ops
each; in a decode step of 64 sequences on a CPU that loop is most of the step.
Here every sequence with exactly one query token (a decode) is computed in one
batched pass (also a lone decode: one SDPA call costs 40-50% of torch_ref's dozen ops per
sequence, docs/benchmarks.md "Decode step (CPU)") over a padded gather of the pool; sequences with more query tokens
(prefill chunks, few per step) go through torch_ref itself. The results equal
torch_ref's up to float summation order (tests/engine/test_torch_backend.py).

Decode pass, B decoding sequences, W = block_tables width, S = W * block_size:

    k = k_cache[block_tables]          [B, W, block_size, Hkv, D] -> [B, S, Hkv, D]
    q                                  [B, Hkv, group, D]   (query heads grouped by KV head)
    out = softmax(q . k, masked to s < seq_len) . v      [B, Hkv, group, D] -> [B, Hq, D]
    (torch's scaled_dot_product_attention on strided views: no layout copies)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedkube.engine.attention import torch_ref
from pagedkube.engine.attention.metadata import AttentionMetadata

write_kv = torch_ref.write_kv


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """query [B, Hq, D], one token per sequence at position seq_lens[b] - 1 -> out [B, Hq, D]."""
    num_seqs, num_q_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    group = num_q_heads // num_kv_heads
    width = block_tables.shape[1]
    max_len = width * k_cache.shape[1]
    tables = block_tables.reshape(-1).long()
    # One gather of whole blocks, then views: [B, S, Hkv, D] seen as [B, Hkv, S, D].
    # Positions past seq_len are masked out of the softmax; they hold finite values (the
    # pool starts zeroed and only write_kv writes to it), so they add exact zeros.
    k = k_cache.flatten(1).index_select(0, tables).view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache.flatten(1).index_select(0, tables).view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    q = query.view(num_seqs, num_kv_heads, group, head_dim)
    valid = torch.arange(max_len, device=query.device)[None, :] < seq_lens.long()[:, None]   # [B, S]
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=valid[:, None, None, :],
                                         scale=scale)
    return out.reshape(num_seqs, num_q_heads, head_dim).to(query.dtype)


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Same contract as torch_ref.paged_attention: query [T, Hq, D] -> out [T, Hq, D]."""
    starts = meta.query_start_loc.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(meta.num_seqs)]
    decode = [b for b, n in enumerate(q_lens) if n == 1]
    if not decode:                           # prefill chunks only
        return torch_ref.paged_attention(query, k_cache, v_cache, meta, scale)
    out = torch.empty_like(query)
    rows = torch.tensor([starts[b] for b in decode], device=query.device)
    index = torch.tensor(decode, device=query.device)
    seq_lens = meta.seq_lens[index]
    all_lens = meta.seq_lens.tolist()
    width = -(-max(all_lens[b] for b in decode) // k_cache.shape[1])   # blocks the longest decode needs
    out[rows] = decode_attention(query[rows], k_cache, v_cache, meta.block_tables[index, :width],
                                 seq_lens, scale)
    others = [b for b, n in enumerate(q_lens) if n > 1]
    if others:
        token_index = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in others]).to(query.device)
        lens = torch.tensor([0] + [q_lens[b] for b in others])
        sub = AttentionMetadata(
            slot_mapping=meta.slot_mapping[token_index],
            query_start_loc=torch.cumsum(lens, 0).to(meta.query_start_loc),
            seq_lens=meta.seq_lens[others],
            block_tables=meta.block_tables[others],
            max_query_len=max(q_lens[b] for b in others),
            max_seq_len=max(all_lens[b] for b in others),
        )
        out[token_index] = torch_ref.paged_attention(query[token_index], k_cache, v_cache, sub, scale)
    return out

"""The torch attention backend: torch_ref's math with the decode rows batched.

torch_ref.paged_attention loops over sequences in Python, a dozen small ops
each; in a decode step of 64 sequences on a CPU that loop is most of the step.
Here every sequence with exactly one query token (a decode) is computed in one
batched pass (also a lone decode: one SDPA call costs 40-50% of torch_ref's dozen ops per
sequence, docs/benchmarks.md "Decode step (CPU)") over a padded gather of the pool; sequences with more query tokens
(prefill chunks, few per step) go through torch_ref itself. The results equal
torch_ref's up to float summation order (tests/engine/test_torch_backend.py).

Which rows decode, their block ids and their context mask are the same in every layer of
a step: the first layer derives them (the step's only host syncs here) into a DecodePlan
kept in meta.derived, and the other layers reuse it; a step where every sequence decodes
(most steps) writes its output without a scatter.

Decode pass, B decoding sequences, W = block_tables width, S = W * block_size:

    k = k_cache[block_tables]          [B, W, block_size, Hkv, D] -> [B, S, Hkv, D]
    q                                  [B, Hkv, group, D]   (query heads grouped by KV head)
    out = softmax(q . k, masked to s < seq_len) . v      [B, Hkv, group, D] -> [B, Hq, D]
    (torch's scaled_dot_product_attention on strided views: no layout copies)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from pagedkube.engine.attention import torch_ref
from pagedkube.engine.attention.metadata import AttentionMetadata


# Under torch.compile (engine/decode_capture.py) the cache write goes through this operator, which
# declares that it mutates the caches: traced as plain index_copy_ on a view of a graph input,
# Inductor functionalized it into a copy of the whole cache, a scatter and a copy back, every
# layer of every step (1.3 s a token with an 8,192-block pool; 9 ms with the operator).
def _write_kv_slots(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    num_blocks, block_size = k_cache.shape[:2]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)


@torch.library.custom_op("pagedkube::write_kv", mutates_args=("k_cache", "v_cache"))
def _write_kv_op(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    _write_kv_slots(key, value, k_cache, v_cache, slot_mapping)


@_write_kv_op.register_fake
def _(key, value, k_cache, v_cache, slot_mapping) -> None:
    return None


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key/value [T, Hkv, D] -> caches at slot_mapping[t]. Unlike torch_ref, every slot must be a
    real one (>= 0): the runner never makes a negative slot (a captured step's padding rows write
    the pad block, engine/decode_capture.py), and skipping would need a boolean mask, i.e. a
    nonzero(), a host sync that neither a torch.compile full graph nor a CUDA graph can hold."""
    if key.dtype != k_cache.dtype:                # (an equal dtype's .to() is still a call per layer)
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    write = _write_kv_op if torch.compiler.is_compiling() else _write_kv_slots
    write(key, value, k_cache, v_cache, slot_mapping)


@dataclass(frozen=True)
class DecodePlan:
    """One step's decode layout, derived once (host syncs included) and reused by every layer."""
    rows: torch.Tensor | None        # token rows of the decodes; None: every sequence decodes, in order
    tables: torch.Tensor             # [B * W] int64 block ids of the decoding sequences, row-major
    valid: torch.Tensor              # [B, 1, 1, S] bool: position s < seq_len
    seq_lens: torch.Tensor           # [B] int64: the decoding sequences' lengths
    others: AttentionMetadata | None # the sequences with more query tokens, as their own batch
    token_index: torch.Tensor | None # their token rows


def plan_all_decodes(meta: AttentionMetadata, block_size: int) -> DecodePlan:
    """A step where every sequence decodes (max_query_len == 1), from tensor shapes alone: no host
    sync, so a captured decode step (engine/decode_capture.py) holds it. The block tables' width
    is the runner's (prepare: the longest sequence's blocks; a captured step: its padded width)."""
    width = meta.block_tables.shape[1]
    seq_lens = meta.seq_lens.long()
    valid = torch.arange(width * block_size, device=seq_lens.device)[None, :] < seq_lens[:, None]
    return DecodePlan(None, meta.block_tables.reshape(-1).long(), valid[:, None, None, :], seq_lens, None, None)


def plan_decodes(meta: AttentionMetadata, block_size: int) -> DecodePlan | None:
    """None when no sequence decodes (prefill chunks only)."""
    if meta.max_query_len == 1:
        return plan_all_decodes(meta, block_size)
    starts = meta.query_start_loc.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(meta.num_seqs)]
    decode = [b for b, n in enumerate(q_lens) if n == 1]
    if not decode:
        return None
    device = meta.seq_lens.device
    all_lens = meta.seq_lens.tolist()
    width = -(-max(all_lens[b] for b in decode) // block_size)   # blocks the longest decode needs
    every = len(decode) == meta.num_seqs
    index = None if every else torch.tensor(decode, device=device)
    tables = meta.block_tables[:, :width] if every else meta.block_tables[index, :width]
    seq_lens = meta.seq_lens if every else meta.seq_lens[index]
    valid = torch.arange(width * block_size, device=device)[None, :] < seq_lens.long()[:, None]
    rows = None if every else torch.tensor([starts[b] for b in decode], device=device)
    others = token_index = None
    rest = [b for b, n in enumerate(q_lens) if n > 1]
    if rest:
        token_index = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in rest]).to(device)
        lens = torch.tensor([0] + [q_lens[b] for b in rest])
        others = AttentionMetadata(
            slot_mapping=meta.slot_mapping[token_index],
            query_start_loc=torch.cumsum(lens, 0).to(meta.query_start_loc),
            seq_lens=meta.seq_lens[rest],
            block_tables=meta.block_tables[rest],
            max_query_len=max(q_lens[b] for b in rest),
            max_seq_len=max(all_lens[b] for b in rest),
        )
    return DecodePlan(rows, tables.reshape(-1).long(), valid[:, None, None, :], seq_lens.long(), others, token_index)


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     tables: torch.Tensor, valid: torch.Tensor, scale: float) -> torch.Tensor:
    """query [B, Hq, D], one token per sequence; tables [B * W] their blocks; valid
    [B, 1, 1, W * block_size] which positions are context -> out [B, Hq, D]."""
    num_seqs, num_q_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    group = num_q_heads // num_kv_heads
    max_len = valid.shape[-1]
    # One gather of whole blocks, then views: [B, S, Hkv, D] seen as [B, Hkv, S, D].
    # Positions past seq_len are masked out of the softmax; they hold finite values (the
    # pool starts zeroed and only write_kv writes to it), so they add exact zeros.
    k = k_cache.flatten(1).index_select(0, tables).view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache.flatten(1).index_select(0, tables).view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    q = query.view(num_seqs, num_kv_heads, group, head_dim)
    if query.dtype == torch.float32 and k_cache.dtype == torch.float32:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=valid, scale=scale)
        return out.reshape(num_seqs, num_q_heads, head_dim)
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=valid, scale=scale)
    return out.reshape(num_seqs, num_q_heads, head_dim).to(query.dtype)


DecodePass = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DecodePlan, float], torch.Tensor]


def torch_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan,
                 scale: float) -> torch.Tensor:
    return decode_attention(query, k_cache, v_cache, plan.tables, plan.valid, scale)


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, decode: DecodePass = torch_decode) -> torch.Tensor:
    """Same contract as torch_ref.paged_attention: query [T, Hq, D] -> out [T, Hq, D]. `decode`: the
    decode rows' pass (engine/attention/cpu_backend.py passes our C++ kernel's)."""
    if "torch" not in meta.derived:          # the first layer of the step plans for all
        meta.derived["torch"] = plan_decodes(meta, k_cache.shape[1])
    plan: DecodePlan | None = meta.derived["torch"]
    if plan is None:                         # prefill chunks only
        return torch_ref.paged_attention(query, k_cache, v_cache, meta, scale)
    if plan.rows is None:                    # decodes only (most steps): no scatter
        return decode(query, k_cache, v_cache, plan, scale)
    out = torch.empty_like(query)
    out[plan.rows] = decode(query[plan.rows], k_cache, v_cache, plan, scale)
    if plan.others is not None:
        out[plan.token_index] = torch_ref.paged_attention(query[plan.token_index], k_cache, v_cache,
                                                          plan.others, scale)
    return out

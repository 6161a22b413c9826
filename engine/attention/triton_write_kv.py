"""Triton reshape-and-cache: store this step's K/V into the paged pool by slot
mapping (torch reference: torch_ref.write_kv).

One program per token t writes all KV heads of that token:

    slot = slot_mapping[t]          (< 0: padding token, skipped)
    k_cache[slot // block_size, slot % block_size, :, :] = key[t, :, :]

Heads and head dims are padded to powers of two (tl.arange needs them) and
masked; values are cast to the cache's dtype on store.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    NUM_KV_HEADS: tl.constexpr, NUM_KV_HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, NUM_KV_HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]

    k = tl.load(key_ptr + tok * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    kc_offs = block_id * stride_kcb + offset * stride_kcs + heads[:, None] * stride_kch + dims[None, :]
    vc_offs = block_id * stride_vcb + offset * stride_vcs + heads[:, None] * stride_vch + dims[None, :]
    tl.store(k_cache_ptr + kc_offs, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + vc_offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)

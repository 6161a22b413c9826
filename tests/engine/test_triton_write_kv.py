"""Triton write_kv (reshape-and-cache) against torch_ref.write_kv: the pools must be
bit-identical afterwards (a copy, plus a cast when the cache dtype differs).

Runs on CPU under TRITON_INTERPRET=1 (set by tests/conftest.py before triton is
imported), or compiled on CUDA when a GPU is present.
"""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.attention import torch_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 7.0          # every slot not written must keep it


def _backend():
    from pagedkube.engine.attention import triton_backend
    return triton_backend


def make_inputs(num_tokens, num_blocks, block_size, num_kv_heads, head_dim, *, dtype, cache_dtype, seed,
                num_skipped=2):
    gen = torch.Generator().manual_seed(seed)
    # key/value as the runner makes them: views into one fused qkv projection (token stride > Hkv * D)
    qkv = torch.randn(num_tokens, 3 + 2 * num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    key = qkv[:, 3:3 + num_kv_heads]
    value = qkv[:, 3 + num_kv_heads:]
    # distinct slots scattered over the whole pool; a few tokens are padding (slot -1)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:num_skipped]] = -1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, SENTINEL, dtype=cache_dtype, device=DEVICE)
    v_cache = torch.full(shape, SENTINEL, dtype=cache_dtype, device=DEVICE)
    return key, value, k_cache, v_cache, slots.to(DEVICE)


CASES = [
    # tokens, blocks, block_size, kv_heads, head_dim, dtype, cache dtype
    (37, 9, 8, 2, 64, torch.float32, torch.float32),
    (50, 5, 16, 1, 80, torch.float16, torch.float16),
    (20, 3, 32, 4, 96, torch.bfloat16, torch.bfloat16),
    (70, 2, 64, 3, 128, torch.float32, torch.bfloat16),     # 3 heads: padded to 4 and masked
    (9, 2, 128, 8, 16, torch.float32, torch.float16),
]


@pytest.mark.parametrize("case", CASES, ids=[f"t{c[0]}-bs{c[2]}-h{c[3]}-d{c[4]}-{str(c[5])[6:]}-{str(c[6])[6:]}"
                                             for c in CASES])
def test_triton_write_kv_matches_reference(case):
    num_tokens, num_blocks, block_size, num_kv_heads, head_dim, dtype, cache_dtype = case
    key, value, k_cache, v_cache, slots = make_inputs(num_tokens, num_blocks, block_size, num_kv_heads, head_dim,
                                                      dtype=dtype, cache_dtype=cache_dtype, seed=num_tokens)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    torch_ref.write_kv(key, value, k_ref, v_ref, slots)
    _backend().write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)
    # the skipped tokens wrote nothing: exactly num_tokens - 2 slots changed
    changed = (k_cache != SENTINEL).all(dim=-1).all(dim=-1).sum().item()
    assert changed == num_tokens - 2


def test_triton_write_kv_all_skipped_and_empty():
    key, value, k_cache, v_cache, slots = make_inputs(4, 2, 8, 1, 64, dtype=torch.float32,
                                                      cache_dtype=torch.float32, seed=1, num_skipped=4)
    _backend().write_kv(key, value, k_cache, v_cache, slots)
    assert (k_cache == SENTINEL).all() and (v_cache == SENTINEL).all()
    _backend().write_kv(key[:0], value[:0], k_cache, v_cache, slots[:0])
    assert (k_cache == SENTINEL).all()


def _bad_inputs():
    key, value, k_cache, v_cache, slots = make_inputs(6, 2, 8, 2, 64, dtype=torch.float32,
                                                      cache_dtype=torch.float32, seed=2)
    return {
        "heads": ((key[:, :1], value, k_cache, v_cache, slots), "key must be"),
        "value shape": ((key, value[:3], k_cache, v_cache, slots), "value must be"),
        "slots length": ((key, value, k_cache, v_cache, slots[:5]), "5 entries for 6 tokens"),
        "slots dtype": ((key, value, k_cache, v_cache, slots.float()), "int32/int64"),
        "cache dtype": ((key, value, k_cache.double(), v_cache.double(), slots), "dtype must be one of"),
        "k/v caches": ((key, value, k_cache, v_cache.half(), slots), "differ"),
        "strided": ((key.transpose(0, 2).contiguous().transpose(0, 2), value, k_cache, v_cache, slots),
                    "contiguous in head_dim"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_triton_write_kv_rejects_bad_input(case):
    args, message = _bad_inputs()[case]
    with pytest.raises(ValueError, match=message):
        _backend().write_kv(*args)

"""Triton attention backend: `write_kv` and `paged_attention` with the
signatures of torch_ref (the oracle they are tested against).

The wrappers check shapes, strides, dtypes and devices and raise ValueError
before any launch; they never read tensor values (that would cost a device
sync per layer), so the metadata's contents are trusted as the runner built
them. They run on CUDA tensors, or on CPU tensors when the kernels were
imported with TRITON_INTERPRET=1 (how the tests run them).

Launch heuristics (all from metadata.py's host-side ints, no sync):
- Query tile rows BLOCK_M = group * query tokens per program, a power of two
  in [16, 64] (16: tl.dot's minimum; 64: 64 x 128 fp32 accumulator is 64
  registers/thread at 4 warps), or next_pow2(group) when a group alone is
  bigger. Decode-only batches get the smallest tile that holds one group.
- KV tiles of TILE_N = 64 positions (32 in fp32, whose tiles are twice the
  bytes: keeps shared memory under the 99 KB of the smallest sm_80+ parts).
- Split-K only for decode-only batches (max_query_len == 1), where one program
  per (sequence, KV head) can leave SMs idle on long contexts:
      splits = next_pow2(ceil(2 * num_SMs / (num_seqs * num_kv_heads)))
  capped at MAX_SPLITS and at max_seq_len // MIN_SPLIT_TOKENS (each split
  still streams enough KV to amortise the extra reduction pass). Prefill and
  mixed batches already have query blocks enough to fill the GPU.
"""
from __future__ import annotations

import torch

try:
    import triton  # noqa: F401  (fail here, with the message below, when triton is missing)
    from triton.runtime.interpreter import InterpretedFunction
except ImportError as exc:  # pragma: no cover - exercised only where triton is absent
    raise ImportError("the triton attention backend needs the `triton` package "
                      "(installed with torch on Linux x86_64 CUDA wheels); use attention_backend='torch'") from exc

from pagedkube.engine.attention import triton_attention as _attn
from pagedkube.engine.attention import triton_write_kv as _wkv
from pagedkube.engine.attention.metadata import AttentionMetadata

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256            # the Q tile and accumulator are BLOCK_M x next_pow2(head_dim)
MAX_SPLITS = 16               # vLLM's unified Triton attention also cuts a decode into at most 16 segments
MIN_SPLIT_TOKENS = 256        # below ~256 KV positions per split the reduction pass costs more than it wins
PREFILL_BLOCK_M = 64
DECODE_TILE_N = 64            # KV positions per inner-loop tile
PREFILL_TILE_N = 64
CPU_SM_COUNT = 16             # stand-in for the SM count under the interpreter


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _floor_pow2(n: int) -> int:
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 0


def _check_runnable(kernel, *tensors: torch.Tensor) -> None:
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device, got {device} and {t.device}")
    if device.type != "cuda" and not isinstance(kernel, InterpretedFunction):
        raise ValueError(f"Triton kernels need CUDA tensors, got {device}; "
                         "on CPU set TRITON_INTERPRET=1 before importing triton, or use the torch backend")


def _check_cache(name: str, cache: torch.Tensor) -> None:
    if cache.dim() != 4:
        raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], got shape {tuple(cache.shape)}")
    if cache.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {cache.dtype}")
    if cache.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in head_dim, got strides {cache.stride()}")


def _check_index(name: str, t: torch.Tensor, dim: int) -> None:
    if t.dim() != dim or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a {dim}-d int32/int64 tensor, got {t.dtype} shape {tuple(t.shape)}")


def _check_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    _check_cache("k_cache", k_cache)
    _check_cache("v_cache", v_cache)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache differ: {k_cache.dtype} {tuple(k_cache.shape)} "
                         f"vs {v_cache.dtype} {tuple(v_cache.shape)}")
    if k_cache.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be <= {MAX_HEAD_DIM}, got {k_cache.shape[3]}")


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key/value [T, Hkv, D] -> caches [num_blocks, block_size, Hkv, D] at slot_mapping[t] (< 0 = skip)."""
    _check_caches(k_cache, v_cache)
    kv_shape = (key.shape[0],) + tuple(k_cache.shape[2:])
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or tuple(t.shape) != kv_shape:
            raise ValueError(f"{name} must be [T, num_kv_heads, head_dim] = {kv_shape}, got {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim, got strides {t.stride()}")
    _check_index("slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    _check_runnable(_wkv._write_kv_kernel, key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.dtype != k_cache.dtype:
        # Cast in torch (round-to-nearest-even, as torch_ref does): the interpreter truncates
        # fp32 -> bf16, and the engine never hits this path (K/V come out in the cache dtype).
        key, value = key.to(k_cache.dtype), value.to(k_cache.dtype)
    _wkv._write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, NUM_KV_HEADS_PAD=_next_pow2(num_kv_heads),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=_next_pow2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )


def _check_meta(meta: AttentionMetadata, num_seqs: int) -> None:
    _check_index("query_start_loc", meta.query_start_loc, 1)
    _check_index("seq_lens", meta.seq_lens, 1)
    _check_index("block_tables", meta.block_tables, 2)
    if meta.query_start_loc.shape[0] != num_seqs + 1 or meta.block_tables.shape[0] != num_seqs:
        raise ValueError(f"metadata disagrees on the number of sequences: seq_lens {num_seqs}, "
                         f"query_start_loc {meta.query_start_loc.shape[0]} (want B + 1), "
                         f"block_tables {meta.block_tables.shape[0]}")
    if meta.block_tables.stride(1) != 1 and meta.block_tables.shape[1] > 1:
        raise ValueError(f"block_tables must be contiguous along blocks, got strides {meta.block_tables.stride()}")
    if meta.max_query_len < 0 or meta.max_seq_len < 0:
        raise ValueError(f"max_query_len/max_seq_len must be >= 0, got {meta.max_query_len}/{meta.max_seq_len}")


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SM_COUNT


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int,
                      sm_count: int) -> int:
    """Split-K factor (a power of two) by the heuristic in the module docstring."""
    if max_query_len != 1 or num_seqs == 0:
        return 1
    programs = num_seqs * num_kv_heads
    wanted = _next_pow2(-(-2 * sm_count // programs))
    cap = min(MAX_SPLITS, _floor_pow2(max_seq_len // MIN_SPLIT_TOKENS))
    return max(1, min(wanted, cap))


def _tile_shape(group: int, max_query_len: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_M, TILE_N) for a batch: see the module docstring."""
    block_m = min(max(16, _next_pow2(group * max(1, max_query_len))), PREFILL_BLOCK_M)
    block_m = max(block_m, _next_pow2(group))
    tile_n = DECODE_TILE_N if max_query_len <= 1 else PREFILL_TILE_N
    if dtype == torch.float32:
        tile_n //= 2      # fp32 K/V tiles are twice the bytes: 64 x 128 x 4 B x 2 x 2 stages would pass 99 KB smem
    return block_m, tile_n


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, *, num_splits: int | None = None,
                    tile_n: int | None = None) -> torch.Tensor:
    """query [T, Hq, D] -> out [T, Hq, D]; Hq must be a multiple of Hkv (GQA).

    `num_splits` (a power of two) overrides the split-K heuristic and `tile_n`
    the KV tile; both exist for tests and benchmarks.
    """
    _check_caches(k_cache, v_cache)
    if query.dim() != 3 or query.shape[2] != k_cache.shape[3]:
        raise ValueError(f"query must be [T, num_q_heads, {k_cache.shape[3]}], got {tuple(query.shape)}")
    if query.dtype != k_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} differs from the cache dtype {k_cache.dtype}")
    if query.stride(-1) != 1:
        raise ValueError(f"query must be contiguous in head_dim, got strides {query.stride()}")
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    num_seqs = meta.seq_lens.shape[0]
    _check_meta(meta, num_seqs)
    for name, n in (("num_splits", num_splits), ("tile_n", tile_n)):
        if n is not None and (n < 1 or n & (n - 1)):
            raise ValueError(f"{name} must be a power of two, got {n}")
    _check_runnable(_attn._paged_attention_kernel, query, k_cache, v_cache,
                    meta.query_start_loc, meta.seq_lens, meta.block_tables)

    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=query.dtype, device=query.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_q_heads // num_kv_heads
    block_m, default_tile_n = _tile_shape(group, meta.max_query_len, query.dtype)
    tile_n = tile_n or default_tile_n
    block_q = block_m // group
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, meta.max_query_len, meta.max_seq_len,
                                       _sm_count(query.device))
    head_dim_pad = max(16, _next_pow2(head_dim))
    if num_splits > 1:
        part_acc = torch.empty((num_tokens, num_q_heads, num_splits, head_dim_pad), dtype=torch.float32,
                               device=query.device)
        part_m = torch.empty((num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=query.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out            # unused when NUM_SPLITS == 1

    upcast_dot = query.dtype == torch.bfloat16 and isinstance(_attn._paged_attention_kernel, InterpretedFunction)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_splits)
    _attn._paged_attention_kernel[grid](
        out, query, k_cache, v_cache,
        meta.block_tables, meta.seq_lens, meta.query_start_loc,
        part_acc, part_m, part_l,
        num_seqs, float(scale) * 1.4426950408889634,          # log2(e): softmax runs in exp2
        query.stride(0), query.stride(1),
        out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_q,
        TILE_N=tile_n, BLOCK_SIZE=k_cache.shape[1],
        NUM_SPLITS=num_splits, UPCAST_DOT=upcast_dot,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 or upcast_dot else "tf32",
        num_warps=4,
    )
    if num_splits > 1:
        _attn._reduce_splits_kernel[(num_tokens, num_q_heads)](
            out, part_acc, part_m, part_l,
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, NUM_SPLITS=num_splits,
        )
    return out

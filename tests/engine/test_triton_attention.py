"""Triton paged attention against the torch reference, on CPU under TRITON_INTERPRET=1.

Triton decides interpret-vs-compile when triton is first imported, and
transformers imports it, so tests/conftest.py sets TRITON_INTERPRET=1 before
anything is collected when the machine has no GPU. On a GPU machine the same
cases run the compiled kernels on CUDA.

The grid is a covering design, not the full product (the interpreter is
slow): every block size (8..128), head dim (64/80/96/128, plus 16/32 of the
tiny test models), GQA ratio (1/4/8), dtype and batch kind (pure decode, pure
prefill, mixed) appears, and most pairs of them do. Every case has context
lengths that are not multiples of the block size, sequences with different
cached-prefix lengths, blocks scattered at random through a pool whose unused
slots hold NaN (a read outside the context poisons the output), and a query
tensor that is a strided view. Split-K is covered forced (2/4/8 splits, on
decode and on a mixed batch) and through the heuristic.

Tolerances (max abs error against the fp32 reference, outputs are O(1)):
    float32  atol 2e-5, rtol 1e-5   (ieee dot, fp32 online softmax vs fp32 softmax)
    float16  atol 3e-3, rtol 3e-3   (P rounded to fp16 before P@V; output rounding 5e-4)
    bfloat16 atol 2e-2, rtol 2e-2   (bf16 has 8 mantissa bits: eps 7.8e-3)
Under the interpreter bf16 tl.dot runs on fp32-widened bf16 operands (see
triton_attention.py); fp16 and fp32 run the same kernel code as the GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from pagedkube.engine.attention import torch_ref
from pagedkube.engine.attention.metadata import AttentionMetadata

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def _kernels_interpreted() -> bool:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from pagedkube.engine.attention import triton_attention
    return all(isinstance(f, InterpretedFunction) for f in (tl.cdiv, triton_attention._paged_attention_kernel))


if DEVICE == "cpu" and not _kernels_interpreted():
    raise RuntimeError("no GPU and the Triton kernels are not interpreted: TRITON_INTERPRET=1 must be set "
                       "before triton is first imported (tests/conftest.py does this)")


def make_batch(seq_lens, q_lens, *, block_size, num_kv_heads, group, head_dim, dtype, seed=0,
               spare_blocks=5):
    """Random pool (NaN outside the contexts), scattered block tables, a strided query view."""
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.zeros(len(seq_lens), max(blocks_needed) + 2, dtype=torch.int32)
    in_context = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    used = 0
    for b, (seq_len, n) in enumerate(zip(seq_lens, blocks_needed)):
        block_tables[b, :n] = perm[used:used + n]
        used += n
        pos = torch.arange(seq_len)
        in_context[block_tables[b, pos // block_size].long() * block_size + pos % block_size] = True
    in_context = in_context.view(num_blocks, block_size)
    k_cache[~in_context] = float("nan")
    v_cache[~in_context] = float("nan")
    num_tokens = sum(q_lens)
    num_q_heads = num_kv_heads * group
    # the runner slices q out of a fused qkv projection: a view with a token stride > Hq * D
    qkv = torch.randn(num_tokens, num_q_heads + 2, head_dim, generator=gen).to(dtype).to(DEVICE)
    query = qkv[:, :num_q_heads]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=block_tables.to(DEVICE),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
    )
    return query.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), meta


def batch_lens(kind: str, block_size: int):
    """(seq_lens, q_lens): context lengths off the block grid, different cached prefixes."""
    bs = block_size
    if kind == "decode":
        return [1, bs + 3, 3 * bs - 1, 2 * bs + 5], [1, 1, 1, 1]
    if kind == "prefill":                   # cold prefill, and chunks after cached prefixes
        return [19, bs + 7, 2 * bs + 9], [19, 11, 5]
    if kind == "mixed":
        return [bs + 5, 1, 2 * bs + 3, 23, bs - 1], [3, 1, 1, 23, 6]
    raise ValueError(kind)


def check(query, k_cache, v_cache, meta, **kwargs):
    from pagedkube.engine.attention import triton_backend
    scale = query.shape[-1] ** -0.5
    ref = torch_ref.paged_attention(query, k_cache, v_cache, meta, scale)
    out = triton_backend.paged_attention(query, k_cache, v_cache, meta, scale, **kwargs)
    assert out.shape == query.shape and out.dtype == query.dtype
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCES[query.dtype])


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
#        block, head_dim, group, dtype, kind, num_splits (None = heuristic)
GRID = [
    (8, 64, 1, F32, "mixed", None),
    (16, 80, 4, F16, "decode", None),
    (32, 96, 8, BF16, "prefill", None),
    (64, 128, 1, BF16, "mixed", None),
    (128, 64, 4, F32, "prefill", None),
    (8, 96, 4, F32, "decode", 4),
    (16, 128, 8, F32, "mixed", None),
    (32, 64, 8, F16, "mixed", None),
    (64, 80, 1, F32, "prefill", None),
    (128, 80, 8, BF16, "decode", 2),
    (16, 64, 1, BF16, "decode", 8),
    (32, 128, 4, F16, "decode", None),
    (8, 80, 8, F16, "prefill", None),
    (128, 96, 1, F16, "mixed", None),
    (64, 96, 4, BF16, "mixed", 4),
    (16, 16, 4, F32, "mixed", None),        # mistral tiny model: head_dim 16, MQA-like
    (16, 32, 2, F32, "decode", 2),          # qwen3 tiny model: head_dim 32
]


@pytest.mark.parametrize("block_size,head_dim,group,dtype,kind,num_splits", GRID,
                         ids=[f"bs{c[0]}-d{c[1]}-g{c[2]}-{str(c[3])[6:]}-{c[4]}-s{c[5]}" for c in GRID])
def test_triton_paged_attention_matches_reference(block_size, head_dim, group, dtype, kind, num_splits):
    seq_lens, q_lens = batch_lens(kind, block_size)
    num_kv_heads = 1 if group == 8 else 2
    batch = make_batch(seq_lens, q_lens, block_size=block_size, num_kv_heads=num_kv_heads, group=group,
                       head_dim=head_dim, dtype=dtype, seed=block_size + head_dim + group)
    check(*batch, num_splits=num_splits)


def test_triton_tile_smaller_and_larger_than_block():
    """TILE_N below and above the block size: positions straddle blocks inside one tile."""
    seq_lens, q_lens = [70, 41], [9, 1]
    batch = make_batch(seq_lens, q_lens, block_size=32, num_kv_heads=2, group=4, head_dim=64, dtype=F32)
    check(*batch, tile_n=16)
    check(*batch, tile_n=128)


def test_triton_split_heuristic_values():
    from pagedkube.engine.attention.triton_backend import choose_num_splits
    # H200 (132 SMs), batch 64, 2 KV heads (Qwen2.5-0.5B), 4k context: 128 programs -> 4 splits
    assert choose_num_splits(64, 2, 1, 4096, 132) == 4
    assert choose_num_splits(1, 8, 1, 32768, 132) == 16        # capped at MAX_SPLITS
    assert choose_num_splits(1, 8, 1, 700, 132) == 2           # capped by 256 tokens per split
    assert choose_num_splits(1, 8, 1, 300, 132) == 1
    assert choose_num_splits(256, 8, 1, 4096, 132) == 1        # enough programs already
    assert choose_num_splits(4, 8, 7, 4096, 132) == 1          # prefill / mixed: never split


def test_triton_split_heuristic_path_on_long_decode():
    """num_splits=None picks split-K here (16 stand-in SMs under the interpreter) and matches."""
    from pagedkube.engine.attention import triton_backend
    seq_lens, q_lens = [600, 530], [1, 1]
    assert triton_backend.choose_num_splits(2, 1, 1, 600, triton_backend.CPU_SM_COUNT) == 2
    batch = make_batch(seq_lens, q_lens, block_size=16, num_kv_heads=1, group=4, head_dim=64, dtype=F32)
    check(*batch)


def test_triton_long_context_with_single_split_and_many():
    seq_lens, q_lens = [1000], [1]
    batch = make_batch(seq_lens, q_lens, block_size=64, num_kv_heads=2, group=2, head_dim=64, dtype=F16)
    check(*batch, num_splits=1)
    check(*batch, num_splits=16)


def test_triton_empty_batch_returns_empty():
    from pagedkube.engine.attention import triton_backend
    query, k_cache, v_cache, meta = make_batch([5], [1], block_size=8, num_kv_heads=1, group=1,
                                               head_dim=64, dtype=F32)
    empty = AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.int64, device=DEVICE),
                              query_start_loc=torch.zeros(1, dtype=torch.int32, device=DEVICE),
                              seq_lens=torch.zeros(0, dtype=torch.int32, device=DEVICE),
                              block_tables=torch.zeros(0, 1, dtype=torch.int32, device=DEVICE),
                              max_query_len=0, max_seq_len=0)
    out = triton_backend.paged_attention(query[:0], k_cache, v_cache, empty, 0.125)
    assert out.shape == (0, 1, 64)


def _bad_inputs():
    query, k_cache, v_cache, meta = make_batch([20, 9], [4, 1], block_size=8, num_kv_heads=2, group=2,
                                               head_dim=64, dtype=F32)
    short_meta = AttentionMetadata(meta.slot_mapping, meta.query_start_loc[:2], meta.seq_lens,
                                   meta.block_tables, meta.max_query_len, meta.max_seq_len)
    float_meta = AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.seq_lens.float(),
                                   meta.block_tables, meta.max_query_len, meta.max_seq_len)
    return {
        "dtype mismatch": ((query.half(), k_cache, v_cache, meta), "differs from the cache dtype"),
        "fp64": ((query.double(), k_cache.double(), v_cache.double(), meta), "dtype must be one of"),
        "gqa": ((query[:, :3], k_cache, v_cache, meta), "not a multiple"),
        "head_dim": ((query[..., :32], k_cache, v_cache, meta), "query must be"),
        "strided dim": ((query.transpose(1, 2).contiguous().transpose(1, 2), k_cache, v_cache, meta),
                        "contiguous in head_dim"),
        "k/v shapes": ((query, k_cache, v_cache[:-1], meta), "differ"),
        "cache rank": ((query, k_cache[0], v_cache[0], meta), "num_blocks, block_size"),
        "meta length": ((query, k_cache, v_cache, short_meta), "number of sequences"),
        "meta dtype": ((query, k_cache, v_cache, float_meta), "int32/int64"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_triton_wrapper_rejects_bad_input(case):
    from pagedkube.engine.attention import triton_backend
    args, message = _bad_inputs()[case]
    with pytest.raises(ValueError, match=message):
        triton_backend.paged_attention(*args, 0.125)


def test_triton_wrapper_needs_cuda_or_interpreter():
    """Without TRITON_INTERPRET, CPU tensors get a clear ValueError instead of a driver error."""
    code = (
        "import torch\n"
        "from pagedkube.engine.attention import triton_backend\n"
        "from pagedkube.engine.attention.metadata import AttentionMetadata\n"
        "meta = AttentionMetadata(torch.zeros(1, dtype=torch.int64), torch.tensor([0, 1], dtype=torch.int32),\n"
        "    torch.tensor([1], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), 1, 1)\n"
        "cache = torch.zeros(1, 8, 1, 64)\n"
        "try:\n"
        "    triton_backend.paged_attention(torch.zeros(1, 1, 64), cache, cache, meta, 0.125)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    res = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ValueError: Triton kernels need CUDA tensors" in res.stdout

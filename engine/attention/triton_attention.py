"""Triton paged attention: one kernel for mixed prefill/decode batches, read
straight from the KV pool through block tables (layout in metadata.py).

Work decomposition. The T query tokens of a step are cut, per sequence, into
query blocks of BLOCK_Q tokens. One program handles one (query block, KV head)
pair, and all GROUP query heads that share that KV head (GQA) are processed
together, flattened into the rows of one tile:

    row r of the Q tile  ->  token  q_block * BLOCK_Q + r // GROUP
                             head   kv_head * GROUP  + r % GROUP
    BLOCK_M = rows = a power of two >= 16 (tl.dot's minimum) and >= GROUP;
    BLOCK_Q = BLOCK_M // GROUP; rows r >= BLOCK_Q * GROUP are padding.

so each K/V tile is loaded once per KV head and used by the whole group. The
program walks the context in tiles of TILE_N positions; a position p lives at
pool[block_tables[seq, p // block_size], p % block_size], looked up per
element, so TILE_N is independent of the pool's block size. Scores use an
online softmax in the log2 domain (exp2 with scale * log2(e) folded in).

Grid axis 0 is a flat list of query blocks: sequence b owns the indices
[qsl[b] // BLOCK_Q + b, qsl[b + 1] // BLOCK_Q + b + 1), which holds at least
ceil(q_len_b / BLOCK_Q) blocks; the total is T // BLOCK_Q + B, so the grid
needs no host sync. A program finds its sequence by binary search and exits
when its block lies past the sequence's queries.

Split-K (flash-decoding). With NUM_SPLITS > 1 grid axis 2 cuts each
program's tiles into NUM_SPLITS contiguous ranges; every split writes its
unnormalised accumulator and its (max, sum) pair to fp32 scratch and
`_reduce_splits_kernel` merges them:

    out = sum_s 2^(m_s - M) * acc_s / sum_s 2^(m_s - M) * l_s,   M = max_s m_s

A split that sees no unmasked key writes m = -inf, l = 0 and drops out.

Interpreter note: triton 3.9's interpreter runs tl.dot as numpy matmul on the
raw storage, and stores bfloat16 as uint16, so a bf16 tl.dot multiplies bit
patterns. Under the interpreter the wrapper sets UPCAST_DOT for bf16: operands
(already rounded to bf16) are widened to fp32 before tl.dot, which is exactly
what a bf16 MMA with fp32 accumulation computes. Compiled kernels never set it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest b with query_start_loc[b] // BLOCK_Q + b <= q_block_idx."""
    left: tl.int32 = 0          # a tensor from the start: loop-carried types must not change
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if start <= q_block_idx:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _paged_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    num_seqs, scale_log2,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    q_block_global = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len                       # cached tokens before this step's queries

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM_PAD)
    q_tok = q_block * BLOCK_Q + rows // GROUP          # token index within the sequence's queries
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_tok < q_len)
    dim_ok = dims < HEAD_DIM
    q_pos = prefix_len + q_tok                         # absolute position of each row's query

    q_offs = (q_start + q_tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(query_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # Keys this query block needs: 0 .. position of its last query.
    last_q = tl.minimum((q_block + 1) * BLOCK_Q, q_len) - 1
    num_tiles = tl.cdiv(prefix_len + last_q + 1, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(num_tiles, tile_lo + tiles_per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    cols = tl.arange(0, TILE_N)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(tile_lo, tile_hi):
        k_pos = tile * TILE_N + cols
        k_ok = k_pos < seq_len
        block_id = tl.load(bt_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        offset = k_pos % BLOCK_SIZE
        kv_mask = k_ok[:, None] & dim_ok[None, :]
        k_offs = block_id[:, None] * stride_kb + offset[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
        k = tl.load(k_cache_ptr + k_offs, mask=kv_mask, other=0.0)
        v_offs = block_id[:, None] * stride_vb + offset[:, None] * stride_vs + kv_head * stride_vh + dims[None, :]
        v = tl.load(v_cache_ptr + v_offs, mask=kv_mask, other=0.0)

        if UPCAST_DOT:  # interpreter only, see module docstring
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with nothing visible yet keeps m = -inf; use 0 as its pivot so
        # exp2 sees -inf - 0 = -inf (-> 0) instead of -inf - -inf = nan.
        m_new = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(out_ptr.dtype.element_ty).to(v.dtype)     # P enters the MMA in the input dtype
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_offs = (q_start + q_tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    else:
        # scratch: acc [T, Hq, NUM_SPLITS, HEAD_DIM_PAD], m and l [T, Hq, NUM_SPLITS], contiguous fp32
        num_q_heads = tl.num_programs(1) * GROUP
        ml_idx = ((q_start + q_tok).to(tl.int64) * num_q_heads + head) * NUM_SPLITS + split
        m_out = tl.where(l_i > 0.0, m_i, float("-inf"))
        tl.store(part_m_ptr + ml_idx, m_out, mask=row_ok)
        tl.store(part_l_ptr + ml_idx, l_i, mask=row_ok)
        tl.store(part_acc_ptr + ml_idx[:, None] * HEAD_DIM_PAD + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _reduce_splits_kernel(
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """One program per (token, query head): merge the NUM_SPLITS partial results."""
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_q_heads = tl.num_programs(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM_PAD)
    base = (tok * num_q_heads + head) * NUM_SPLITS
    m = tl.load(part_m_ptr + base + splits)
    l = tl.load(part_l_ptr + base + splits)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)
    w = tl.exp2(m - m_max)                               # 0 for empty splits (m = -inf)
    acc = tl.load(part_acc_ptr + (base + splits)[:, None] * HEAD_DIM_PAD + dims[None, :])
    num = tl.sum(acc * w[:, None], axis=0)
    den = tl.sum(l * w, axis=0)
    out = num / tl.where(den > 0.0, den, 1.0)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)

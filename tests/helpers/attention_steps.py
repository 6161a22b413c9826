"""One attention step's random pool, block tables, metadata and queries, for the attention
backends' tests (tests/engine/test_torch_backend.py, tests/engine/test_cpu_attention.py)."""
from __future__ import annotations

import random

import torch

from pagedkube.engine.attention.metadata import AttentionMetadata

BLOCK_SIZE = 4
NUM_BLOCKS = 80


def make_step(q_lens: list[int], seq_lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, seed: int = 0):
    """A random pool, scattered block tables and queries for one step."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    k_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim, generator=gen).to(dtype)
    free = rng.sample(range(NUM_BLOCKS), NUM_BLOCKS)
    tables = [[free.pop() for _ in range(-(-n // BLOCK_SIZE))] for n in seq_lens]
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.full((starts[-1],), -1, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables, max_query_len=max(q_lens), max_seq_len=max(seq_lens))
    query = torch.randn(starts[-1], num_q_heads, head_dim, generator=gen).to(dtype)
    return query, k_cache, v_cache, meta

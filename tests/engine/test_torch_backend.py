"""torch_backend (decodes batched) against torch_ref (the per-sequence oracle)."""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.attention import torch_backend, torch_ref
from pagedkube.engine.attention.metadata import AttentionMetadata

from attention_steps import BLOCK_SIZE, NUM_BLOCKS, make_step


@pytest.mark.parametrize("q_lens, seq_lens", [
    ([1, 1, 1, 1], [1, 9, 33, 17]),                       # decode only, one of length 1
    ([1, 7, 1, 12, 1], [21, 7, 5, 30, 64]),               # mixed: chunked prefill + decodes
    ([5, 1], [5, 40]),                                    # a prefill chunk and a single decode
    ([1], [37]),                                          # batch-1 decode: the batched path, B = 1
])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 1)], ids=["gqa", "mha", "mqa"])
def test_matches_reference(q_lens, seq_lens, heads):
    query, k_cache, v_cache, meta = make_step(q_lens, seq_lens, *heads, head_dim=16, dtype=torch.float32)
    expected = torch_ref.paged_attention(query, k_cache, v_cache, meta, 0.25)
    got = torch_backend.paged_attention(query, k_cache, v_cache, meta, 0.25)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_half_precision_matches_reference():
    query, k_cache, v_cache, meta = make_step([1, 3, 1, 1], [10, 3, 50, 2], 8, 2, 32, torch.bfloat16, seed=3)
    expected = torch_ref.paged_attention(query, k_cache, v_cache, meta, 32 ** -0.5)
    got = torch_backend.paged_attention(query, k_cache, v_cache, meta, 32 ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=1e-2, rtol=1e-2)


def test_decode_reads_only_its_own_context():
    """Poisoning every pool slot outside the decodes' contexts must not change their output."""
    query, k_cache, v_cache, meta = make_step([1, 1, 1], [6, 13, 2], 4, 2, 8, torch.float32, seed=5)
    clean = torch_backend.paged_attention(query, k_cache, v_cache, meta, 0.3)
    used = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    for table, n in zip(meta.block_tables.tolist(), meta.seq_lens.tolist()):
        for p in range(n):
            used[table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE] = True
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    flat_k[~used] = 1e4
    flat_v[~used] = -1e4
    assert torch.equal(torch_backend.paged_attention(query, k_cache, v_cache, meta, 0.3), clean)


@pytest.mark.parametrize("q_lens, seq_lens", [
    ([1, 1, 1], [5, 9, 2]),                 # decodes only: no scatter
    ([1, 6, 1], [7, 6, 13]),                # decodes around a prefill chunk
    ([3, 4], [3, 9]),                       # no decode: the plan says so
])
def test_a_step_plans_once_and_every_layer_reuses_it(q_lens, seq_lens):
    """The decode plan (host syncs included) is derived by the first layer of a step and
    reused by the next ones, which hold other K/V in pools of the same layout."""
    query, k_cache, v_cache, meta = make_step(q_lens, seq_lens, 4, 2, 8, torch.float32, seed=3)
    scale = 8 ** -0.5
    first = torch_backend.paged_attention(query, k_cache, v_cache, meta, scale)
    plan = meta.derived["torch"]
    assert (plan is None) == (1 not in q_lens)
    layer2_k, layer2_v = k_cache.flip(0).contiguous(), v_cache.flip(0).contiguous()
    second = torch_backend.paged_attention(query, layer2_k, layer2_v, meta, scale)
    assert meta.derived["torch"] is plan
    fresh = AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                              meta.max_query_len, meta.max_seq_len)
    torch.testing.assert_close(first, torch_ref.paged_attention(query, k_cache, v_cache, fresh, scale))
    torch.testing.assert_close(second, torch_ref.paged_attention(query, layer2_k, layer2_v, fresh, scale))

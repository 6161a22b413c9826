"""Allocator invariants, asserted by the pool, prefix-cache, scheduler and engine tests."""
from __future__ import annotations

from pagedkube.engine.block_pool import BlockPool


def assert_pool_invariants(pool: BlockPool, *, idle: bool = False) -> None:
    """free + used = total; nothing with ref_cnt > 0 in the free queue; the hash map
    points only at blocks carrying that hash. `idle=True`: no request holds a block."""
    free = list(pool.free_block_queue)
    free_ids = [b.block_id for b in free]
    assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks, "free queue has duplicates"
    assert all(b.ref_cnt == 0 for b in free), [b for b in free if b.ref_cnt]
    used = [b for b in pool.blocks if b.ref_cnt > 0]
    assert all(b.ref_cnt >= 0 for b in pool.blocks)
    assert len(used) + len(free) == pool.num_blocks, (len(used), len(free), pool.num_blocks)
    for block_hash, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash, block
    hashed = [b for b in pool.blocks if b.block_hash is not None]
    assert len(hashed) == len(pool.cached_block_hash_to_block), "a hashed block is missing from the map"
    if not pool.enable_caching:
        assert not pool.cached_block_hash_to_block
    if idle:
        assert not used, f"blocks leaked: {used}"


def assert_seq_blocks(pool: BlockPool, seqs) -> None:
    """Each block's ref_cnt equals the number of live block tables holding it."""
    counts: dict[int, int] = {}
    for seq in seqs:
        for block_id in seq.block_table:
            counts[block_id] = counts.get(block_id, 0) + 1
    for block in pool.blocks:
        assert block.ref_cnt == counts.get(block.block_id, 0), (block, counts.get(block.block_id, 0))

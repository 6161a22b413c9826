"""BlockPool and its free queue: exact block ids, LRU order, lazy eviction, events."""
import pytest

from invariants import assert_pool_invariants
from pagedkube.engine.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from pagedkube.hashing import block_hashes


def ids(blocks):
    return [b.block_id for b in blocks]


def test_free_queue_popleft_append_remove_middle():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    assert ids(q) == [0, 1, 2, 3, 4] and len(q) == 5
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4] and len(q) == 4
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    q.append(blocks[0])
    assert ids(q) == [1, 3, 4, 2, 0]
    q.remove(blocks[0])  # the tail
    q.remove(blocks[1])  # the head
    assert ids(q) == [3, 4, 2]
    assert blocks[0] not in q and blocks[3] in q
    for _ in range(3):
        q.popleft()
    with pytest.raises(IndexError):
        q.popleft()


def test_get_new_blocks_in_order_and_none_when_full():
    pool = BlockPool(4, 16)
    a = pool.get_new_blocks(3)
    assert ids(a) == [0, 1, 2] and all(b.ref_cnt == 1 for b in a)
    assert pool.num_free_blocks == 1 and pool.usage == 0.75
    assert pool.get_new_blocks(2) is None
    assert pool.num_free_blocks == 1  # a failed request takes nothing
    assert_pool_invariants(pool)
    pool.free_blocks(reversed(a))
    assert_pool_invariants(pool, idle=True)


def test_free_tail_first_gives_lru_order():
    pool = BlockPool(6, 4)
    a = pool.get_new_blocks(3)   # 0 1 2
    b = pool.get_new_blocks(2)   # 3 4
    pool.free_blocks(reversed(a))
    pool.free_blocks(reversed(b))
    # queue: 5 (never used), then a's tail first, then b's tail first
    assert ids(pool.free_block_queue) == [5, 2, 1, 0, 4, 3]
    assert ids(pool.get_new_blocks(4)) == [5, 2, 1, 0]
    assert_pool_invariants(pool)


def test_shared_block_freed_only_at_last_reference():
    pool = BlockPool(3, 4)
    a = pool.get_new_blocks(2)
    pool.touch([a[0]])
    assert a[0].ref_cnt == 2
    pool.free_blocks(reversed(a))
    assert a[0].ref_cnt == 1 and ids(pool.free_block_queue) == [2, 1]
    pool.free_blocks([a[0]])
    assert ids(pool.free_block_queue) == [2, 1, 0]
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks([a[0]])


def test_cache_hit_touch_and_lazy_eviction_with_events():
    events = []
    pool = BlockPool(4, 2, event_sink=lambda t, h: events.append((t, h)))
    tokens = [1, 2, 3, 4, 5]
    hashes = block_hashes(tokens, 2)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, hashes, tokens)
    assert events == [("stored", hashes)]
    assert blocks[1].token_ids == (3, 4) and blocks[2].block_hash is None
    pool.free_blocks(reversed(blocks))
    assert ids(pool.free_block_queue) == [3, 2, 1, 0]
    # freed blocks keep their hashes (cached): a hit finds them
    assert pool.get_cached_block(hashes[0]) is blocks[0]
    pool.touch([blocks[0]])                  # hit on an evictable block: leaves the queue
    assert ids(pool.free_block_queue) == [3, 2, 1] and pool.num_free_blocks == 3
    # reuse evicts lazily, in LRU order: 3 and 2 are unhashed, 1 holds hashes[1]
    new = pool.get_new_blocks(3)
    assert ids(new) == [3, 2, 1]
    assert events[-1] == ("removed", [hashes[1]])
    assert pool.get_cached_block(hashes[1]) is None and new[2].block_hash is None
    assert pool.get_cached_block(hashes[0]) is blocks[0]
    assert_pool_invariants(pool)
    pool.free_blocks(reversed(new))
    pool.free_blocks([blocks[0]])
    assert_pool_invariants(pool, idle=True)
    assert pool.cached_hashes() == [hashes[0]]


def test_duplicate_hash_stays_private():
    events = []
    pool = BlockPool(4, 2, event_sink=lambda t, h: events.append((t, h)))
    tokens = [7, 8]
    hashes = block_hashes(tokens, 2)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(a, hashes, tokens)
    pool.cache_full_blocks(b, hashes, tokens)
    assert pool.get_cached_block(hashes[0]) is a[0] and b[0].block_hash is None
    assert events == [("stored", hashes)]
    assert_pool_invariants(pool)


def test_caching_disabled_registers_nothing():
    events = []
    pool = BlockPool(2, 2, enable_caching=False, event_sink=lambda t, h: events.append((t, h)))
    blocks = pool.get_new_blocks(1)
    hashes = block_hashes([1, 2], 2)
    pool.cache_full_blocks(blocks, hashes, [1, 2])
    assert pool.get_cached_block(hashes[0]) is None and events == []
    assert_pool_invariants(pool)


def test_bad_sizes_rejected():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(4, 0)

"""KVCacheManager: prefix hits, capacity accounting, salts, eviction, forks (torch-free)."""
import pytest

from invariants import assert_pool_invariants, assert_seq_blocks
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.sequence import Sequence


def make_seq(tokens, salt=None, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4), cache_salt=salt)


def admit(kv, seq):
    """What the scheduler does for a waiting sequence given the whole prompt."""
    hits = kv.get_computed_blocks(seq)
    new = kv.allocate_slots(seq, seq.num_tokens - len(hits) * kv.block_size, hits)
    if new is None:
        return None
    seq.num_computed_tokens = seq.num_tokens   # the step ran
    kv.cache_blocks(seq)
    return hits


def test_second_request_hits_full_prompt_blocks():
    kv = KVCacheManager(8, 16)
    a, b = make_seq(range(33)), make_seq(range(33))
    assert admit(kv, a) == []
    assert a.block_table == [0, 1, 2]
    hits = admit(kv, b)
    assert [h.block_id for h in hits] == [0, 1]
    assert b.block_table == [0, 1, 3]
    assert [blk.ref_cnt for blk in kv.pool.blocks[:4]] == [2, 2, 1, 1]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (66, 32)
    assert_seq_blocks(kv.pool, [a, b])
    kv.free(a)
    kv.free(b)
    assert_pool_invariants(kv.pool, idle=True)


@pytest.mark.parametrize("num_tokens, num_hit_blocks", [(16, 0), (17, 1), (32, 1), (33, 2)])
def test_hit_never_covers_last_token(num_tokens, num_hit_blocks):
    kv = KVCacheManager(8, 16)
    a = make_seq(range(num_tokens))
    admit(kv, a)
    kv.free(a)
    b = make_seq(range(num_tokens))
    assert len(kv.get_computed_blocks(b)) == num_hit_blocks


def test_salt_separates_tenants():
    kv = KVCacheManager(8, 4)
    a = make_seq(range(9), salt="tenant-a")
    admit(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(make_seq(range(9), salt="tenant-b")) == []
    assert kv.get_computed_blocks(make_seq(range(9))) == []
    assert len(kv.get_computed_blocks(make_seq(range(9), salt="tenant-a"))) == 2


def test_evictable_hits_count_against_free_capacity():
    kv = KVCacheManager(4, 16)
    a = make_seq(range(33))
    admit(kv, a)
    kv.free(a)                        # blocks 0, 1 cached (ref_cnt 0), all 4 free
    assert kv.num_free_blocks == 4
    # 65 tokens = 5 blocks: 2 hits (evictable) + 3 new. Counting the hits as free
    # would say 3 <= 4; after touching them only 2 are left.
    b = make_seq(list(range(32)) + list(range(100, 133)))
    hits = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [0, 1]
    assert kv.allocate_slots(b, 33, hits) is None
    assert kv.num_free_blocks == 4 and all(blk.ref_cnt == 0 for blk in kv.pool.blocks)
    assert kv.prefix_cache_queries == 33  # a failed admission is not counted
    # 49 tokens = 4 blocks: 2 hits + 2 new fits exactly
    c = make_seq(list(range(32)) + list(range(100, 117)))
    assert [h.block_id for h in admit(kv, c)] == [0, 1]
    assert c.block_table == [0, 1, 3, 2] and kv.num_free_blocks == 0
    assert_pool_invariants(kv.pool)
    kv.free(c)
    assert_pool_invariants(kv.pool, idle=True)


def test_lru_eviction_keeps_shared_head():
    kv = KVCacheManager(3, 16)
    a = make_seq(range(33))
    admit(kv, a)
    kv.free(a)                       # freed tail first: queue 2, 1, 0
    assert [blk.block_id for blk in kv.pool.free_block_queue] == [2, 1, 0]
    other = make_seq(range(500, 520))  # 2 blocks: takes 2 (unhashed) then 1 (evicts a's 2nd block)
    admit(kv, other)
    assert other.block_table == [2, 1]
    assert [h.block_id for h in kv.get_computed_blocks(make_seq(range(33)))] == [0]
    kv.free(other)
    assert_pool_invariants(kv.pool, idle=True)


def test_output_tokens_extend_hashes_incrementally():
    kv = KVCacheManager(8, 4)
    a = make_seq(range(6))
    admit(kv, a)                     # 1 full block cached
    assert len(kv.pool.cached_block_hash_to_block) == 1
    for t in (50, 51, 52):           # decode: KV of the previous token, then the new one appended
        a.append_token(t)
        assert kv.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
        kv.cache_blocks(a)
    # tokens 0..5,50,51 are computed (52 is not): 2 full blocks cached
    assert a.num_computed_tokens == 9 and len(kv.pool.cached_block_hash_to_block) == 2
    b = make_seq([0, 1, 2, 3, 4, 5, 50, 51, 52])
    assert [h.block_id for h in kv.get_computed_blocks(b)] == a.block_table[:2]


def test_hits_verified_against_stored_tokens():
    kv = KVCacheManager(4, 4)
    a = make_seq(range(9))
    admit(kv, a)
    kv.pool.blocks[1].token_ids = (9, 9, 9, 9)   # what a hash collision would look like
    assert [h.block_id for h in kv.get_computed_blocks(make_seq(range(9)))] == [0]


def test_prefix_caching_disabled():
    kv = KVCacheManager(8, 4, enable_caching=False)
    a, b = make_seq(range(9)), make_seq(range(9))
    assert admit(kv, a) == [] and admit(kv, b) == []
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4, 5]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)
    kv.free(a)
    kv.free(b)
    assert_pool_invariants(kv.pool, idle=True)


@pytest.mark.parametrize("caching", [True, False])
def test_fork_shares_full_prompt_blocks(caching):
    kv = KVCacheManager(8, 4, enable_caching=caching)
    parent, child = make_seq(range(9)), make_seq(range(9))
    admit(kv, parent)
    assert kv.fork(parent, child) == 8
    assert child.block_table == [0, 1] and child.num_computed_tokens == 8
    assert kv.allocate_slots(child, 1) is not None     # its own last prompt token
    assert child.block_table == [0, 1, 3]
    assert [blk.ref_cnt for blk in kv.pool.blocks[:4]] == [2, 2, 1, 1]
    kv.free(parent)
    kv.free(child)
    kv.free(child)                                     # idempotent
    assert_pool_invariants(kv.pool, idle=True)

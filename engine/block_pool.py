"""The pool of fixed-size KV blocks, their LRU free queue and the hash -> block map.

Torch-free: the pool only hands out block ids; the model runner owns the tensors
(`[num_blocks, block_size, num_kv_heads, head_dim]` per layer) they index.

A block is in exactly one of three states:

    used       ref_cnt > 0, not in the free queue (possibly hashed: shared prefix)
    cached     ref_cnt == 0, in the free queue, hashed: reusable by a prefix hit
    free       ref_cnt == 0, in the free queue, no hash

Cached and free blocks both count as free capacity. Eviction is lazy: a cached
block keeps its hash until `get_new_blocks` hands it out again, and only then is
its hash dropped from the map (a "removed" event). The free queue is the LRU
order: the head is evicted first.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Sequence

# event_sink(type, block_hashes): type is "stored" or "removed" (engine/kv_events.py).
EventSink = Callable[[str, list[bytes]], None]


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.token_ids: tuple[int, ...] | None = None  # the tokens behind block_hash (hit verification)
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={h})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order, as an intrusive doubly linked list.

    Why not a deque: a prefix-cache hit takes a block out of the *middle* of the
    free queue (it becomes used again). With a deque or list that removal is
    O(n), which stalled vLLM's scheduler (PR #5411: ~2 s to allocate 1,000
    blocks). The links live in the blocks themselves, so popleft, append and
    remove-from-the-middle are all O(1) and allocation-free.

        sentinel_head <-> b7 <-> b2 <-> ... <-> b5 <-> sentinel_tail
                          ^ evicted first             ^ freed last
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]):
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("no free blocks")
        assert block is not None    # the sentinels keep every link of a queued block set
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        assert block.prev_free is None and block.next_free is None, f"{block} is already in the free queue"
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next_free

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.prev_free is not None


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 event_sink: EventSink | None = None):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.event_sink = event_sink
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # One block per hash: if two sequences fill identical blocks at once, the
        # second copy stays unhashed and is simply freed (never served as a hit).
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Free plus cached (evictable) blocks."""
        return len(self.free_block_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vllm:kv_cache_usage_perc): cached blocks count as free."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock] | None:
        """`num_blocks` blocks with ref_cnt 1, evicting the least recently freed;
        None when fewer are free."""
        if num_blocks > self.num_free_blocks:
            return None
        blocks = [self.free_block_queue.popleft() for _ in range(num_blocks)]
        removed = [h for h in (self._evict(b) for b in blocks) if h is not None]
        for block in blocks:
            assert block.ref_cnt == 0, block
            block.ref_cnt = 1
        if removed:
            self._emit("removed", removed)
        return blocks

    def _evict(self, block: KVCacheBlock) -> bytes | None:
        """Drop a reused block's hash from the map (lazy eviction)."""
        block_hash = block.block_hash
        if block_hash is None:
            return None
        assert self.cached_block_hash_to_block.get(block_hash) is block, block
        del self.cached_block_hash_to_block[block_hash]
        block.block_hash = None
        block.token_ids = None
        return block_hash

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[bytes],
                          token_ids: Sequence[int] | None = None, start: int = 0) -> None:
        """Register blocks[start:len(block_hashes)] (full, computed) under their hashes.

        `token_ids` is the sequence's tokens, stored per block to verify hits.
        """
        if not self.enable_caching:
            return
        stored: list[bytes] = []
        bs = self.block_size
        for i in range(start, len(block_hashes)):
            block, block_hash = blocks[i], block_hashes[i]
            if block.block_hash is not None:  # already cached (it was a prefix hit)
                assert block.block_hash == block_hash, (block, i)
                continue
            if block_hash in self.cached_block_hash_to_block:
                continue  # an identical block is cached already: keep this one private
            block.block_hash = block_hash
            if token_ids is not None:
                block.token_ids = tuple(token_ids[i * bs:(i + 1) * bs])
            self.cached_block_hash_to_block[block_hash] = block
            stored.append(block_hash)
        if stored:
            self._emit("stored", stored)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        if not self.enable_caching:
            return None
        return self.cached_block_hash_to_block.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks; an evictable one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block; blocks reaching 0 join the free queue's tail
        in the given order.

        Callers pass a sequence's blocks in reverse (tail first): the tail blocks
        hold the longest, least shareable prefixes, so they should be evicted
        before the head blocks that other requests are likely to hit again.
        """
        for block in ordered_blocks:
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def cached_hashes(self) -> list[bytes]:
        return list(self.cached_block_hash_to_block)

    def _emit(self, event_type: str, block_hashes: list[bytes]) -> None:
        if self.event_sink is not None:
            self.event_sink(event_type, block_hashes)

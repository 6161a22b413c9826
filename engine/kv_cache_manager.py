"""Per-sequence KV block allocation on top of the BlockPool, with the prefix cache.

A sequence's blocks cover its computed tokens plus the tokens scheduled this step:

    token_ids:    | block 0 | block 1 | block 2 |blk 3 ..
                  |<--- computed (KV in pool) --->|<- new ->|
    block_table:  [  b7    ,  b2    ,   b9   ,  b4  ]

Full, computed blocks are registered in the pool under the chained hash of
pagedkube.hashing (seed = EngineConfig.hash_seed, salt = seq.cache_salt, the LoRA
adapter's name in every block of an adapter's request), so a
later sequence with the same salted prefix reuses them instead of recomputing.
Torch-free.
"""
from __future__ import annotations

from typing import Sequence as Seq

from pagedkube.engine.block_pool import BlockPool, EventSink, KVCacheBlock
from pagedkube.engine.sequence import Sequence
from pagedkube.hashing import block_hashes


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 hash_seed: str = "", event_sink: EventSink | None = None):
        self.pool = BlockPool(num_blocks, block_size, enable_caching, event_sink)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_seed = hash_seed
        self._hashes: dict[Sequence, list[bytes]] = {}
        self._num_cached_blocks: dict[Sequence, int] = {}  # leading blocks already registered
        # vLLM's counters, in tokens: queried = prompt (+ output, after preemption) tokens
        # looked up at admission, hits = tokens served from the cache.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def block_hashes(self, seq: Sequence) -> list[bytes]:
        """Hashes of every full block of seq.token_ids, extended as output fills blocks."""
        hashes = self._hashes.setdefault(seq, [])
        if len(hashes) < seq.num_tokens // self.block_size:
            hashes.extend(block_hashes(
                seq.token_ids, self.block_size, seed=self.hash_seed, cache_salt=seq.cache_salt,
                parent=hashes[-1] if hashes else None, start_block=len(hashes), lora_name=seq.lora_name))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[KVCacheBlock]:
        """The longest cached prefix of a sequence that holds no blocks yet.

        Never covers the last token: its logits are needed to sample the next one,
        so at most (num_tokens - 1) // block_size full blocks can be hits (a
        16-token prompt with block_size 16 gets none, a 17-token prompt one).
        Pure: takes no references (allocate_slots does).
        """
        assert not self.holds_blocks(seq), "prefix lookup for a sequence that already holds blocks"
        if not self.enable_caching:
            return []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits: list[KVCacheBlock] = []
        for i, block_hash in enumerate(self.block_hashes(seq)[:max_blocks]):
            block = self.pool.get_cached_block(block_hash)
            # sha256 makes a collision implausible; comparing tokens makes a hit provably right.
            if block is None or block.token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break
            hits.append(block)
        return hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed_blocks: Seq[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Blocks for seq's next `num_new_tokens` tokens, after `computed_blocks`
        (prefix hits, passed once at admission). None, with nothing taken, when the
        pool cannot hold them. seq.num_computed_tokens does not yet include the
        hits; the caller advances it after success.

        A hit on a block with ref_cnt 0 takes it out of the free queue, so such
        hits count against free capacity (docs/design.md, pitfall "Capacity accounting").
        """
        assert num_new_tokens > 0, num_new_tokens
        held = seq.block_table.blocks
        if computed_blocks is None and len(held) * self.block_size >= seq.num_computed_tokens + num_new_tokens:
            return []   # the common decode step: the last block still has room
        computed = list(computed_blocks or ())
        assert not (computed and held), "prefix hits are only taken at admission"
        num_computed = seq.num_computed_tokens + len(computed) * self.block_size
        num_required = self.num_blocks_needed(num_computed + num_new_tokens)
        num_new_blocks = max(0, num_required - len(held) - len(computed))
        num_evictable_hits = sum(1 for b in computed if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_evictable_hits:
            return None
        self.pool.touch(computed)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        assert new_blocks is not None
        seq.block_table.append_blocks(computed + new_blocks)
        if computed_blocks is not None:
            self._num_cached_blocks[seq] = len(computed)
            if self.enable_caching:
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += len(computed) * self.block_size
        return new_blocks

    def cache_blocks(self, seq: Sequence) -> None:
        """Register seq's full blocks whose KV is now computed (call after the step)."""
        if not self.enable_caching or not self.holds_blocks(seq):
            return
        num_full = seq.num_computed_tokens // self.block_size
        start = self._num_cached_blocks.get(seq, 0)
        if num_full <= start:
            return
        hashes = self.block_hashes(seq)[:num_full]
        self.pool.cache_full_blocks(seq.block_table.blocks, hashes, seq.token_ids, start)
        self._num_cached_blocks[seq] = num_full

    def fork(self, parent: Sequence, child: Sequence) -> int:
        """Share parent's full prompt blocks with a sibling sample (n > 1) that holds
        none yet; returns the number of tokens shared. Works with the prefix cache
        off too: the blocks are shared by reference count, not found by hash. The
        child still recomputes its last prompt token (for its own first sample)."""
        assert not self.holds_blocks(child) and child.num_computed_tokens == 0
        num_shared = min(parent.num_computed_tokens, child.num_tokens - 1) // self.block_size
        if num_shared == 0 or not self.holds_blocks(parent):
            return 0
        blocks = parent.block_table.blocks[:num_shared]
        self.pool.touch(blocks)
        child.block_table.append_blocks(blocks)
        self._num_cached_blocks[child] = min(num_shared, self._num_cached_blocks.get(parent, 0))
        child.num_computed_tokens = num_shared * self.block_size
        if self.enable_caching:
            self.prefix_cache_queries += child.num_tokens
            self.prefix_cache_hits += child.num_computed_tokens
        return child.num_computed_tokens

    def holds_blocks(self, seq: Sequence) -> bool:
        return bool(seq.block_table.blocks)

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first (see BlockPool.free_blocks). Safe to call on
        a sequence that holds none; a second call frees nothing."""
        blocks = seq.block_table.blocks
        self._num_cached_blocks.pop(seq, None)
        self._hashes.pop(seq, None)
        seq.block_table.clear()
        if blocks:
            self.pool.free_blocks(reversed(blocks))

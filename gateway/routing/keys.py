"""A prompt's token ids -> the RoutingInput the pickers read (pure, no tokenizer).

The gateway (prompt.PromptHasher) renders and tokenizes a request and calls
`routing_input` with the prompt's token ids and its head's; the fleet simulator
(bench/sim) calls it with synthetic token ids, so both route on the same keys.

Ring key: the chained hash of the first min(m, ring_key_blocks) full blocks of
the head (prompt.py explains the head); `head_blocks` = that m, the depth the
head-only affinity rule asks of a holder (picker.py). A head shorter than one
block is keyed by all its tokens.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from pagedkube import hashing
from pagedkube.gateway.routing.types import RoutingInput

# Blocks of the head that key the ring: 256 x 16 = 4,096 tokens, so the key
# covers a whole chat head (a product system prompt of up to ~2,000 tokens,
# a profile and the first user message) and sessions sharing only a long
# system prompt still spread. 16 (256 tokens) gave every session of a product
# the key of the product prompt's start: one ring owner for thousands of
# sessions, 61% of decisions overflowed (docs/benchmarks.md "Simulator: routing at fleet scale").
DEFAULT_RING_KEY_BLOCKS = 256


def digest(tag: bytes, salt: str | None, payload: bytes) -> bytes:
    return hashlib.sha256(tag + b"\0" + hashing.salt_bytes(salt) + b"\0" + payload).digest()


def tokens_bytes(token_ids: Sequence[int]) -> bytes:
    return b"".join(t.to_bytes(4, "little") for t in token_ids)


def routing_input(token_ids: Sequence[int], head_ids: Sequence[int] | None, *, block_size: int, seed: str,
                  ring_key_blocks: int, cache_salt: str | None, lora_name: str | None = None) -> RoutingInput:
    """`head_ids` None: the whole prompt is the head (completions). `lora_name`: the adapter the
    request names (its blocks hash apart from the base model's, as the engine's do)."""
    hashes = hashing.block_hashes(token_ids, block_size, seed=seed, cache_salt=cache_salt, lora_name=lora_name)
    head = token_ids if head_ids is None else head_ids
    key_blocks = min(len(head) // block_size, ring_key_blocks)
    n = key_blocks * block_size
    if key_blocks and (head_ids is None or list(token_ids[:n]) == list(head[:n])):
        key = hashes[key_blocks - 1]  # the head starts the prompt: its chained hash is there already
    elif key_blocks:
        key = hashing.block_hashes(head[:n], block_size, seed=seed, cache_salt=cache_salt, lora_name=lora_name)[-1]
    else:
        key = digest(b"short", cache_salt, tokens_bytes(head))
    return RoutingInput(ring_key=key, block_hashes=tuple(hashes), num_prompt_tokens=len(token_ids),
                        block_size=block_size, head_blocks=key_blocks, lora_name=lora_name)

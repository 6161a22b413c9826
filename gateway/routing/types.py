"""What a picker sees and what it answers.

Determinism across gateway replicas (docs/design.md, pitfall "Per-replica routing state"):
a picker's answer depends only on its arguments (the request's hashes and key,
the endpoint set, the loads and the prefix index fed by the engines' cache
feeds), never on arrival order or per-replica random state. Round-robin is the
one exception, and it is a baseline only. The prefix index's pending record
(pending.py) is this gateway's own routes, so it is on only for a gateway that
is the fleet's one router, where no other replica exists to agree with.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

# The routing policies (gateway --routing, pagedkube up --routing, LLMService
# spec.gateway.routing.policy): defined once, here.
ROUTING_POLICIES = ("prefix", "round-robin", "least-load")

# Reasons, as used in pagedkube_gateway_routing_decisions_total{reason}.
AFFINITY = "affinity"      # the deepest held prefix, within the load bound
RING = "ring"              # nothing held: the ring's first pod for the key, within the bound
OVERFLOW = "overflow"      # the preferred pod was over the bound; a later one took it
FALLBACK = "fallback"      # no tokenizer/feed: the ring on a hash of the raw prompt text
ROUND_ROBIN = "round_robin"
LEAST_LOAD = "least_load"
REASONS = (AFFINITY, RING, OVERFLOW, FALLBACK, ROUND_ROBIN, LEAST_LOAD)


@dataclass(frozen=True, slots=True)
class RoutingInput:
    """One request, reduced to what routing needs.

    `block_hashes` are the engine's chained hashes of the prompt's full blocks
    (salted with the tenant's cache salt), empty when the prompt could not be
    tokenized. `ring_key` is the 32-byte key the ring is walked from.
    `head_blocks` is how many full blocks the ring key covers (the prompt's
    head, at most ring_key_blocks): the depth an engine must hold to draw the
    request by affinity under the head-only rule (picker.py). `lora_name`:
    the LoRA adapter the request runs under (None: the base model), for
    adapter affinity (adapters.py).
    """
    ring_key: bytes
    block_hashes: tuple[bytes, ...] = ()
    num_prompt_tokens: int = 0
    block_size: int = 16
    tokenized: bool = True
    head_blocks: int = 0
    lora_name: str | None = None

    def __post_init__(self) -> None:
        if len(self.ring_key) < 8:
            raise ValueError("ring_key must be at least 8 bytes (a sha256 digest)")
        if self.head_blocks < 0:
            raise ValueError(f"head_blocks must be >= 0, got {self.head_blocks}")


@dataclass(frozen=True, slots=True)
class Decision:
    """`endpoints`: the chosen endpoint first, then the others to retry on, in ring order."""
    endpoints: tuple[str, ...]
    reason: str
    matched_blocks: int = 0
    predicted_cached_tokens: int = 0
    loads: Mapping[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]


class Picker(Protocol):
    """Chooses an endpoint for one request. `endpoints` are the routable ones
    (ready, not ejected); `loads` maps each to its load (in-flight from this
    gateway + the engine's waiting queue). Never called with no endpoints."""

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision: ...


class PrefixSource(Protocol):
    """How many leading blocks of `block_hashes` each endpoint holds (`loads`:
    as given to Picker.pick; the pending record draws only to idle endpoints)."""

    def match_depths(self, block_hashes: Sequence[bytes], endpoints: Sequence[str],
                     loads: Mapping[str, int] | None = None) -> dict[str, int]: ...


def predicted_cached_tokens(matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """Tokens the engine should serve from cache: whole matched blocks, never the
    last prompt token (its logits are needed), so at most (n - 1) // block_size blocks."""
    if num_prompt_tokens <= 0:
        return 0
    usable = min(matched_blocks, (num_prompt_tokens - 1) // block_size)
    return usable * block_size

"""Routing pieces (torch-free, no I/O): each is small, pure and tested on its own.

    ring.py          consistent-hash ring of virtual nodes: the walk order for a key
    bounded_load.py  Mirrokni et al.'s bound: which endpoints may take one more request
    prefix_index.py  per-endpoint bounded LRU of the block hashes its cache feed reports
    pending.py       blocks this gateway routed that no feed has reported yet (opt-in)
    picker.py        composes them: deepest held prefix within the bound, else the ring
    adapters.py      LoRA requests: engines holding the adapter first (then a free slot), then picker.py
    policies.py      the baselines: round-robin and least-load
    keys.py          a prompt's token ids -> RoutingInput (hashes, ring key, head depth)
    types.py         RoutingInput, Decision, the reasons and the PrefixSource protocol
"""
from pagedkube.gateway.routing.types import Decision, Picker, RoutingInput

__all__ = ["Decision", "Picker", "RoutingInput"]

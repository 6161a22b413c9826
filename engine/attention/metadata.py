"""Per-step batch layout shared by every attention backend.

A step packs the new tokens of B sequences into one flat batch of T tokens:

    tokens:           [ seq0: q0 tokens | seq1: q1 tokens | ... ]      T = sum(q_b)
    query_start_loc:  [0, q0, q0+q1, ..., T]                           (B + 1)
    seq_lens[b]:      context length of seq b after this step (cached + new)

The q_b queries of sequence b are the LAST q_b positions of its context:
query i sits at position seq_lens[b] - q_b + i and attends causally to
positions 0..that position, all read from the pool through block_tables[b]
(position p lives in block block_tables[b][p // block_size], offset p % block_size).
slot_mapping[t] = block_id * block_size + offset for each new token (< 0: skip).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor     # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor         # [B] int32
    block_tables: torch.Tensor     # [B, max_blocks_per_seq] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    # What a backend derives from this layout once per step and reuses in every layer
    # (torch_backend's decode plan), keyed by the backend; not part of the layout.
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

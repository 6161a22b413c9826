"""The batched LoRA delta of one projection, for a step whose tokens run under different adapters.

A fused projection (qkv: slices q, k, v; gate_up: gate, up) holds every resident adapter's
weights stacked by slot, each slice's rank padded to R = --max-lora-rank with zeros:

    lora_a     [S, n_slices * R, in]        rows [i R, i R + r_i) = slice i's A
    lora_b[i]  [S, out_i, R]                columns [0, r_i)    = slice i's B
    scales     [S, n_slices]                alpha / r (or / sqrt r), 0 where the slice is not adapted

and each token carries its slot (-1: the base model). The delta, added to the base
projection's output y (whatever kernel made it: dense or packed int8/int4), is

    v          = x @ lora_a[slot].T                          "shrink"  [T, n_slices * R]
    y[:, slice i] += (v[:, i R : (i + 1) R] @ lora_b[i][slot].T) * scales[slot, i]    "expand"

as Punica's SGMV/BGMV kernels compute it (vLLM's lora/ops). On CPU the tokens of each
adapter are gathered into one group and run as two dense matmuls cut to the adapter's
own rank (`add_lora_grouped`): with a handful of adapters in a step that is a handful of
small GEMMs. `lora_delta_reference` is the per-token definition the
Triton kernels (triton_punica.py) are tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SlotGroup:
    """The tokens of one adapter slot in a step: rows of the flat batch (None: every row)."""
    slot: int
    rows: torch.Tensor | None


@dataclass(frozen=True)
class SliceRank:
    """What slot s holds for slice i of a projection: rank r (0: not adapted) and scale."""
    rank: int
    scale: float


def add_lora_grouped(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: list[torch.Tensor],
                     offsets: list[int], max_rank: int, slot_slices: list[list[SliceRank]],
                     groups: list[SlotGroup]) -> None:
    """y += each group's delta, in place. slot_slices[s][i]: slot s's rank and scale on slice i.
    One shrink matmul per group covers every slice (up to the last adapted one); each expand
    is cut to the slice's own rank."""
    for group in groups:
        slices = slot_slices[group.slot]
        last = max((i for i, sr in enumerate(slices) if sr.rank), default=-1)
        if last < 0:
            continue
        xs = x if group.rows is None else x.index_select(0, group.rows)
        v = xs @ lora_a[group.slot, :last * max_rank + slices[last].rank].T
        for i, sr in enumerate(slices):
            if sr.rank == 0:
                continue
            lo = i * max_rank
            delta = (v[:, lo:lo + sr.rank] @ lora_b[i][group.slot][:, :sr.rank].T) * sr.scale
            out = y[:, offsets[i]:offsets[i] + delta.shape[1]]
            if group.rows is None:
                out += delta
            else:
                out.index_add_(0, group.rows, delta)


def lora_delta_reference(x: torch.Tensor, token_slots: torch.Tensor, lora_a: torch.Tensor,
                         lora_b: list[torch.Tensor], scales: torch.Tensor, max_rank: int) -> torch.Tensor:
    """The delta [T, sum(out_i)] per token, by gathering every token's own weights (the definition)."""
    take = token_slots.clamp(min=0)
    live = (token_slots >= 0).to(x.dtype)[:, None]
    v = torch.bmm(lora_a[take], x[:, :, None])[:, :, 0]                       # [T, n R]
    parts = []
    for i, b in enumerate(lora_b):
        vi = v[:, i * max_rank:(i + 1) * max_rank]
        parts.append(torch.bmm(b[take], vi[:, :, None])[:, :, 0] * scales[take, i][:, None])
    return torch.cat(parts, dim=1) * live

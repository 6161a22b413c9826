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
adapter are gathered into one contiguous group and run as dense matmuls cut to the
adapter's own rank (`add_lora_grouped`, SGMV's shape): with a handful of adapters in a
step that is a handful of small GEMMs. `lora_delta_reference` is the per-token definition the
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


@dataclass(frozen=True)
class SlotPlan:
    """One slot's delta on one projection, as views into the stacked weights, made when the
    slot is filled (slot_plan) so a step does no index arithmetic per group:
    `a_t` [in, width] the shrink (every slice up to the last adapted one), `expands` one
    (column lo, column hi, v lo, v hi, B^T view [rank, out_i], scale) per adapted slice."""
    a_t: torch.Tensor
    expands: tuple[tuple[int, int, int, int, torch.Tensor, float], ...]


def slot_plan(lora_a: torch.Tensor, lora_b: list[torch.Tensor], offsets: list[int], max_rank: int,
              slices: list[SliceRank], slot: int) -> SlotPlan | None:
    """The plan of slot `slot` (None: it adapts no slice of this projection). The views stay
    valid while the slot is rewritten in place (LoRALinear.set_slot copies into them)."""
    last = max((i for i, sr in enumerate(slices) if sr.rank), default=-1)
    if last < 0:
        return None
    expands = []
    for i, sr in enumerate(slices):
        if sr.rank:
            b = lora_b[i][slot, :, :sr.rank]
            lo = i * max_rank
            expands.append((offsets[i], offsets[i] + b.shape[0], lo, lo + sr.rank, b.T, sr.scale))
    return SlotPlan(lora_a[slot, :last * max_rank + slices[last].rank].T, tuple(expands))


def add_lora_grouped(y: torch.Tensor, x: torch.Tensor, plans: list[SlotPlan | None], groups: list[SlotGroup],
                     rows: torch.Tensor | None = None) -> None:
    """y += each group's delta, in place (plans[s]: slot s's plan, slot_plan).

    One group over every row (one adapter, no base rows): its matmuls add into y's columns
    directly. Otherwise the adapter rows are gathered once in group order (`rows`: the
    groups' rows concatenated; computed here when not given), each group's delta is written
    into its contiguous block of one buffer, and one index_add puts the buffer back:
    per projection 3 gather/scatter ops plus 1 + (adapted slices) matmuls per group, where a
    gather, a scatter, a multiply and an add per group and slice cost more than the
    arithmetic itself when a decode step spreads a few tokens over many adapters
    (docs/benchmarks.md "LoRA adapters (CPU)")."""
    if not groups:
        return
    if len(groups) == 1 and groups[0].rows is None:
        _add_group(y, x, plans[groups[0].slot])
        return
    if rows is None:
        rows = torch.cat([g.rows for g in groups if g.rows is not None])
    assert all(g.rows is not None for g in groups), "a group over every row cannot share the step with another"
    xs = x.index_select(0, rows)
    delta = y.new_zeros(rows.numel(), y.shape[1])
    lo = 0
    for group in groups:
        assert group.rows is not None
        hi = lo + group.rows.numel()
        _add_group(delta[lo:hi], xs[lo:hi], plans[group.slot])
        lo = hi
    assert lo == rows.numel(), "rows must be the groups' rows, in group order"
    y.index_add_(0, rows, delta)


def _add_group(out: torch.Tensor, xs: torch.Tensor, plan: SlotPlan | None) -> None:
    """out += one slot's delta for rows xs: one shrink, then per adapted slice one expand cut
    to its rank, scaled and added by the same GEMM call (addmm_'s alpha)."""
    if plan is None:
        return
    v = xs @ plan.a_t
    for c0, c1, v0, v1, b_t, scale in plan.expands:
        out[:, c0:c1].addmm_(v[:, v0:v1], b_t, alpha=scale)


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

"""Float weights -> the packed formats, for `--quantization int8|int4` at load time.

    int8: per output channel, symmetric      scale = max|w| / 127,   q = round(w / scale)
    int4: groups of INT4_GROUP_SIZE inputs    scale = (max - min) / 15, min = min, q = round((w - min) / scale)

int8 per channel (G = K) is the layout torch's `_weight_int8pack_mm` computes with. int4
uses groups of 32 with a min, exactly GGUF's Q4_1 (the format the default SmolLM2 file
ships): 32 divides every hidden size our families use (SmolLM2's 576 = 18 x 32, while
128, the AWQ/GPTQ default, does not), and the smaller group keeps the error near Q4_1's.
"""
from __future__ import annotations

import torch

from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight, pack_int4

INT4_GROUP_SIZE = 32   # GGUF Q4_0/Q4_1's block; divides 576 (SmolLM2) where 128 does not


def quantize_int8(w: torch.Tensor) -> Int8Weight:
    """Per-channel symmetric int8 (G = K); a zero row gets scale 1 (and q 0)."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(qweight=q.contiguous(), scales=scale.view(n, 1).contiguous(), group_size=k)


def quantize_int4(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Weight:
    """Grouped asymmetric int4 with scale and min (Q4_1's formula, float32 scales)."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    if k % group_size or group_size % 2:
        raise ValueError(f"int4: group size {group_size} must be even and divide the input size {k}")
    g = w.view(n, k // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = (hi - lo) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
    return Int4Weight(qweight=pack_int4(q.view(n, k)).contiguous(), scales=scale.contiguous(),
                      mins=lo.contiguous(), group_size=group_size)


def quantize(w: torch.Tensor, method: str) -> QuantizedWeight:
    if method == "int8":
        return quantize_int8(w)
    if method == "int4":
        return quantize_int4(w)
    raise ValueError(f"quantize: method must be 'int8' or 'int4', got {method!r}")


def concat_rows(pieces: list[QuantizedWeight]) -> QuantizedWeight | None:
    """Stack the output channels of pieces that share a format and group size (q|k|v,
    gate|up); None when they do not, so the caller dequantizes instead."""
    first = pieces[0]
    if any(type(p) is not type(first) or p.group_size != first.group_size or p.shape[1] != first.shape[1]
           for p in pieces):
        return None
    if len(pieces) == 1:
        return first
    if isinstance(first, Int8Weight):
        return Int8Weight(qweight=torch.cat([p.qweight for p in pieces]),
                          scales=torch.cat([p.scales for p in pieces]), group_size=first.group_size)
    int4 = [p for p in pieces if isinstance(p, Int4Weight)]   # all of them: they share first's type
    return Int4Weight(qweight=torch.cat([p.qweight for p in int4]), scales=torch.cat([p.scales for p in int4]),
                      mins=torch.cat([p.mins for p in int4]), group_size=first.group_size)

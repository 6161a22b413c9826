"""Rotary position embedding (RoPE, Su et al. 2021) in the "rotate half" layout
that Llama, Qwen and Mistral checkpoints use (Hugging Face's apply_rotary_pos_emb).

A head vector x of size D is split into halves (x1, x2) and, at position p,
rotated by angle p * inv_freq[i] in plane (x1[i], x2[i]):

    out = [x1 * cos - x2 * sin,  x2 * cos + x1 * sin]
        = x * [cos, cos] + [x2, x1] * [-sin, sin]

The second form is what runs: the sign lives in the table (`sin_signed`), and [x2, x1] is one
flip of x seen as [.., 2, D/2], so a rotation is four torch calls (flip, two muls, an add)
where slicing, negating and concatenating halves took eight. x2 * -sin and -x2 * sin are the
same float, so the result is bit for bit Hugging Face's rotate_half form.

inv_freq follows the checkpoint's rope type: "default", "linear" (all
frequencies divided by factor) or "llama3" (low frequencies divided by factor,
high ones kept, a smooth ramp between; Llama 3.1's long-context recipe).
cos/sin are computed in float32 for every position once, then indexed.
"""
from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(head_dim: int, theta: float, rope_type: str, scaling: dict[str, Any]) -> torch.Tensor:
    steps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (theta ** (steps / head_dim))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope type {rope_type!r}")
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """One table shared by all layers; `cos_sin(positions)` once per step."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, rope_type: str,
                 scaling: dict[str, Any], device: torch.device | str = "cpu"):
        inv_freq = rope_inv_freq(head_dim, theta, rope_type, scaling)
        # Built on the CPU explicitly, so a model constructed under torch.device("meta") gets a real table.
        positions = torch.arange(max_positions, dtype=torch.int64, device="cpu").float()
        freqs = positions[:, None] * inv_freq[None, :]
        self.cos = torch.cat((freqs, freqs), dim=-1).cos().to(device)                  # [max_positions, D]
        self.sin_signed = torch.cat((-freqs.sin(), freqs.sin()), dim=-1).to(device)   # [-sin, sin]
        self.max_positions = max_positions

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> cos, sin_signed [T, 1, D] in `dtype`, broadcastable over heads."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin_signed[positions].to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated at each token's position (cos, sin_signed from cos_sin)."""
    t, h, d = x.shape
    swapped = x.view(t, h, 2, d // 2).flip(2).view(t, h, d)      # [x2, x1]
    return x * cos + swapped * sin_signed

"""Start-up checks of a tensor-parallel size against a model, torch-free: `pagedkube serve`
runs them before it starts anything, so a size that cannot split the model is a one-line error."""
from __future__ import annotations

import math

from pagedkube.engine.model_config import ModelConfig


def compatible_sizes(cfg: ModelConfig, limit: int = 64) -> list[int]:
    """Tensor-parallel sizes up to `limit` that split this model's heads, KV heads and MLP evenly."""
    common = math.gcd(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size)
    return [n for n in range(1, limit + 1) if common % n == 0]


def check_tensor_parallel(cfg: ModelConfig, tp: int, nnodes: int = 1) -> None:
    """ValueError, before any process starts, when `tp` ranks on each of `nnodes` nodes cannot split this model."""
    world = tp * nnodes
    if world == 1:
        return
    parts = {"attention heads": cfg.num_attention_heads, "KV heads": cfg.num_key_value_heads,
             "intermediate size": cfg.intermediate_size}
    bad = [f"{what} ({n})" for what, n in parts.items() if n % world]
    if bad:
        size = f"tensor_parallel_size {tp}" if nnodes == 1 else f"tensor_parallel_size {tp} x nnodes {nnodes} = {world}"
        raise ValueError(f"{size} must divide the model's {' and '.join(bad)}; "
                         f"sizes that do: {compatible_sizes(cfg)}")

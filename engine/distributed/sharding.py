"""Which part of each checkpoint tensor a tensor-parallel rank holds (Megatron-LM's layout, as vLLM's).

With N ranks, rank r of a model of Hq query heads, Hkv KV heads (head size D), intermediate
size I and vocabulary V holds:

    q_proj, k_proj, v_proj   column-parallel: rows of heads [r Hq/N, (r+1) Hq/N) and
                             [r Hkv/N, (r+1) Hkv/N), so its attention reads only its KV heads
                             and the KV cache holds only those (Hkv/N heads per block)
    gate_proj, up_proj       column-parallel: rows [r I/N, (r+1) I/N)
    o_proj, down_proj        row-parallel: columns of the same ranges; each rank's output is a
                             partial sum, all-reduced once per layer and projection
                             (engine/distributed/layers.py); a bias only on rank 0, so it is added once
    embed_tokens, lm_head    vocab-parallel: rows [r V', (r+1) V'), V' = ceil(V / N), the last
                             shard padded with zero rows
    norms                    whole on every rank

The loader builds each rank's decoder from `local_config` (the same decoder, smaller), and
`ShardPlan.tensor` cuts every checkpoint tensor on its way in (engine/loader.py), so no rank
ever holds the whole model's projections at once; from safetensors a rank reads only its rows
or columns (a slice of the file), except where a weight is quantized at load, which needs it whole.

Packed weights (engine/quant/formats.py) are cut along their own layout: rows are output
channels (exact in every format); a column range must start and end on a group boundary
(K/N a multiple of the group size, 32 for GGUF's Q4/Q8 and our int4; per-channel int8 keeps its
one scale per row). Weights quantized at load (--quantization int8/int4) are quantized whole,
then cut, so every rank holds exactly TP=1's numbers. A column range that splits a group is
dequantized (dense), with a warning.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from pagedkube.engine.distributed.checks import check_tensor_parallel
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight, dequantize
from pagedkube.engine.quant.quantize import quantize

log = logging.getLogger(__name__)

COLUMN_PARALLEL = {"self_attn.q_proj": "q", "self_attn.k_proj": "kv", "self_attn.v_proj": "kv",
                   "mlp.gate_proj": "intermediate", "mlp.up_proj": "intermediate"}
ROW_PARALLEL = {"self_attn.o_proj": "q", "mlp.down_proj": "intermediate"}
VOCAB_PARALLEL = ("model.embed_tokens.weight", "lm_head.weight")
Weight = torch.Tensor | QuantizedWeight


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The config of one rank's decoder: 1/tp of the heads, KV heads, MLP and (padded) vocabulary."""
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=cfg.num_key_value_heads // tp,
                               intermediate_size=cfg.intermediate_size // tp,
                               vocab_size=-(-cfg.vocab_size // tp))


def _whole(value: Any) -> Weight:
    """A tensor from a safetensors slice (read now, whole), anything else as it is."""
    return value if isinstance(value, (torch.Tensor, Int8Weight, Int4Weight)) else value[:]


def slice_rows(w: Any, start: int, stop: int) -> Weight:
    """Output rows [start, stop) of a tensor, a packed weight or a safetensors slice (read: those rows only)."""
    if not isinstance(w, (Int8Weight, Int4Weight)):
        return w[start:stop]
    if isinstance(w, Int8Weight):
        return Int8Weight(w.qweight[start:stop].contiguous(), w.scales[start:stop].contiguous(), w.group_size)
    return Int4Weight(w.qweight[start:stop].contiguous(), w.scales[start:stop].contiguous(),
                      w.mins[start:stop].contiguous(), w.group_size)


def slice_columns(w: Any, start: int, stop: int) -> Weight:
    """Input columns [start, stop) of w; a packed weight keeps its groups when the range is aligned."""
    if not isinstance(w, (Int8Weight, Int4Weight)):
        return w[:, start:stop]
    g = w.group_size
    if g == w.shape[1] and isinstance(w, Int8Weight):      # one scale per output channel
        return Int8Weight(w.qweight[:, start:stop].contiguous(), w.scales.clone(), stop - start)
    if start % g or stop % g:
        log.warning("a %d-column shard of a weight packed in groups of %d splits a group: dense", stop - start, g)
        return dequantize(w)[:, start:stop]
    groups = slice(start // g, stop // g)
    if isinstance(w, Int8Weight):
        return Int8Weight(w.qweight[:, start:stop].contiguous(), w.scales[:, groups].contiguous(), g)
    return Int4Weight(w.qweight[:, start // 2:stop // 2].contiguous(), w.scales[:, groups].contiguous(),
                      w.mins[:, groups].contiguous(), g)


@dataclass(frozen=True)
class ShardPlan:
    config: ModelConfig          # the whole model's
    rank: int
    world_size: int
    quantize_method: str | None = None   # "int8"/"int4": projections quantized whole before they are cut

    def __post_init__(self) -> None:
        check_tensor_parallel(self.config, self.world_size)
        assert 0 <= self.rank < self.world_size, (self.rank, self.world_size)

    @property
    def local(self) -> ModelConfig:
        return local_config(self.config, self.world_size)

    def _span(self, kind: str) -> tuple[int, int]:
        cfg = self.config
        size = {"q": cfg.num_attention_heads * cfg.head_dim, "kv": cfg.num_key_value_heads * cfg.head_dim,
                "intermediate": cfg.intermediate_size}[kind] // self.world_size
        return self.rank * size, (self.rank + 1) * size

    def tensor(self, name: str, value: Any, stored: str) -> tuple[Weight, str]:
        """This rank's part of the checkpoint tensor `name` (Hugging Face naming), and its stored type.
        value: a tensor, a packed weight, or a safetensors slice (safe_open's get_slice), of which
        only this rank's rows or columns are read."""
        if name in VOCAB_PARALLEL:
            return self._vocab_rows(value), stored
        module, _, kind = name.rpartition(".")
        suffix = next((s for s in (*COLUMN_PARALLEL, *ROW_PARALLEL) if module.endswith("." + s)), None)
        if suffix is None:
            return _whole(value), stored                          # norms: whole on every rank
        if kind == "weight" and self.quantize_method is not None and not isinstance(value, (Int8Weight, Int4Weight)):
            whole = _whole(value)
            assert isinstance(whole, torch.Tensor)
            value, stored = quantize(whole, self.quantize_method), self.quantize_method
        if suffix in COLUMN_PARALLEL:
            start, stop = self._span(COLUMN_PARALLEL[suffix])
            return slice_rows(value, start, stop), stored
        if kind == "bias":                                        # row-parallel: added once, by rank 0
            bias = _whole(value)
            assert isinstance(bias, torch.Tensor)
            return (bias if self.rank == 0 else torch.zeros_like(bias)), stored
        start, stop = self._span(ROW_PARALLEL[suffix])
        return slice_columns(value, start, stop), stored

    def _vocab_rows(self, value: Any) -> torch.Tensor:
        rows = self.local.vocab_size
        start, stop = self.rank * rows, min((self.rank + 1) * rows, self.config.vocab_size)
        part = slice_rows(value, start, stop)
        if not isinstance(part, torch.Tensor):
            part = dequantize(part)
        if part.shape[0] < rows:
            part = torch.cat([part, part.new_zeros(rows - part.shape[0], *part.shape[1:])])
        return part

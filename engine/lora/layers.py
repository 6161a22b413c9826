"""LoRALinear: a projection of the decoder plus the per-slot delta of the step's adapters.

It wraps whatever layer the linear factory built (nn.Linear, or QuantLinear with packed
int8/int4 weights) and adds the delta to that layer's output, so adapters work on any
base weight format (punica.py has the layout and the math). The wrapping happens after
the model is loaded (`install_lora`), so the decoder and the loader keep their names
and shapes; a LoRA-free engine has no wrappers at all.

All wrappers of a model share one StepAdapters: the runner writes the step's token
slots there before the forward pass (ModelRunner.execute), the layers read it. It is
the model's own object, not a global: two engines in one process do not share it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from pagedkube.engine.lora.peft_format import TARGETS, LoRAWeights
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.models.decoder import DecoderForCausalLM
from pagedkube.engine.lora.punica import SliceRank, SlotGroup, SlotPlan, add_lora_grouped, slot_plan

# fused projection -> the HF modules of its slices, in row order
SLICES = {fused: tuple(m for m, (f, _) in TARGETS.items() if f == fused)
          for fused in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}


@dataclass
class StepAdapters:
    """The current step's adapter layout: each token's slot (-1 = base) and, for the
    grouped CPU path, the rows of each slot. Empty groups: no adapter in this step."""
    token_slots: torch.Tensor | None = None
    groups: list[SlotGroup] = field(default_factory=list)
    rows: torch.Tensor | None = None       # the groups' rows concatenated (None: one group of every row)
    use_triton: bool = False


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, fused: str, out_sizes: tuple[int, ...], max_loras: int, max_rank: int,
                 step: StepAdapters, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.base = base
        in_features, out_features = base.in_features, base.out_features   # nn.Linear's, QuantLinear's
        assert isinstance(in_features, int) and isinstance(out_features, int), type(base)
        self.in_features, self.out_features = in_features, out_features
        self.modules_names = SLICES[fused]
        assert len(out_sizes) == len(self.modules_names), (fused, out_sizes)
        self.offsets = [sum(out_sizes[:i]) for i in range(len(out_sizes))]
        self.max_rank = max_rank
        self.step = step
        n = len(out_sizes)
        self.lora_a = torch.zeros(max_loras, n * max_rank, self.in_features, device=device, dtype=dtype)
        self.lora_b = [torch.zeros(max_loras, size, max_rank, device=device, dtype=dtype) for size in out_sizes]
        self.scales = torch.zeros(max_loras, n, device=device, dtype=torch.float32)
        self.slot_slices = [[SliceRank(0, 0.0)] * n for _ in range(max_loras)]
        self.plans: list[SlotPlan | None] = [None] * max_loras   # the grouped CPU path's views (punica.py)

    def set_slot(self, slot: int, weights: list[LoRAWeights | None]) -> None:
        """Put one adapter's weights of this projection (one entry per slice) in `slot`."""
        self.lora_a[slot].zero_()
        for b in self.lora_b:
            b[slot].zero_()
        slices = []
        for i, w in enumerate(weights):
            if w is None:
                slices.append(SliceRank(0, 0.0))
                self.scales[slot, i] = 0.0
                continue
            lo = i * self.max_rank
            self.lora_a[slot, lo:lo + w.rank].copy_(w.a)
            self.lora_b[i][slot, :, :w.rank].copy_(w.b)
            self.scales[slot, i] = w.scale
            slices.append(SliceRank(w.rank, w.scale))
        self.slot_slices[slot] = slices
        self.plans[slot] = slot_plan(self.lora_a, self.lora_b, self.offsets, self.max_rank, slices, slot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.step
        if not step.groups:
            return y
        if step.use_triton and step.token_slots is not None:
            from pagedkube.engine.lora.triton_punica import add_lora_triton

            add_lora_triton(y, x, step.token_slots, self.lora_a, self.lora_b, self.scales, self.offsets,
                            self.max_rank)
        else:
            add_lora_grouped(y, x, self.plans, step.groups, step.rows)
        return y


def install_lora(model: DecoderForCausalLM, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> tuple[StepAdapters, dict[tuple[int, str], LoRALinear]]:
    """Wrap every projection of `model`; returns the shared step state and the wrappers by
    (layer, fused name)."""
    cfg: ModelConfig = model.config
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    sizes: dict[str, tuple[int, ...]] = {"qkv_proj": (q, kv, kv), "o_proj": (cfg.hidden_size,),
             "gate_up_proj": (cfg.intermediate_size, cfg.intermediate_size), "down_proj": (cfg.hidden_size,)}
    step = StepAdapters()
    wrappers: dict[tuple[int, str], LoRALinear] = {}
    layers: nn.ModuleList = model.model.layers
    for index, layer in enumerate(layers):
        for owner in (layer.self_attn, layer.mlp):
            for fused in SLICES:
                base = getattr(owner, fused, None)
                if base is None:
                    continue
                wrapper = LoRALinear(base, fused, sizes[fused], max_loras, max_rank, step, device, dtype)
                setattr(owner, fused, wrapper)
                wrappers[(index, fused)] = wrapper
    return step, wrappers

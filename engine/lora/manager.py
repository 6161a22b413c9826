"""LoRAManager: which adapters the model holds, and where.

Two tiers, as vLLM's LRUCacheWorkerLoRAManager:

    host memory   up to max_cpu_loras checked adapters (LoRAAdapter), LRU by use
    device slots  max_loras stacked weight slots in every LoRALinear (layers.py), LRU by use

`prepare_step` runs before each forward pass: it gives every adapter of the step a slot
(the scheduler never runs more distinct adapters in one step than there are slots),
copying the weights in when the adapter is not resident, and writes each token's slot
where the layers read it. A slot is only ever overwritten between steps, so no step reads
weights that change under it. An adapter that fell out of host memory is read again from
its path when a request needs it.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from pagedkube.engine.lora.layers import SLICES, install_lora
from pagedkube.engine.lora.peft_format import LoRAAdapter, load_adapter
from pagedkube.engine.lora.punica import SlotGroup
from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.models.decoder import DecoderForCausalLM


class LoRAManager:
    def __init__(self, model: DecoderForCausalLM, model_config: ModelConfig, *, max_loras: int, max_rank: int,
                 max_cpu_loras: int, device: torch.device, dtype: torch.dtype, use_triton: bool):
        self.model_config = model_config
        self.max_loras, self.max_rank, self.max_cpu_loras = max_loras, max_rank, max_cpu_loras
        self.device = device
        self.step, self.wrappers = install_lora(model, max_loras, max_rank, device, dtype)
        self.step.use_triton = use_triton
        self._cpu: OrderedDict[int, LoRAAdapter] = OrderedDict()     # lora_int_id -> adapter
        self._slots: OrderedDict[int, int] = OrderedDict()           # lora_int_id -> slot, LRU first
        self._slot_names: dict[int, str] = {}                        # lora_int_id -> name, for what is in a slot
        self.num_slot_loads = 0                                      # adapters copied into a slot, cumulative

    def get(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter in host memory, read and checked first if needed (AdapterError)."""
        adapter = self._cpu.get(request.lora_int_id)
        if adapter is not None and adapter.path == request.lora_path:
            self._cpu.move_to_end(request.lora_int_id)
            return adapter
        adapter = load_adapter(request.lora_path, self.model_config, self.max_rank)
        self.forget(request.lora_int_id)
        self._cpu[request.lora_int_id] = adapter
        while len(self._cpu) > self.max_cpu_loras:
            self._cpu.popitem(last=False)
        return adapter

    def forget(self, lora_int_id: int) -> None:
        """Drop an adapter from host memory and its slot (its id may come back with other weights)."""
        self._cpu.pop(lora_int_id, None)
        self._slots.pop(lora_int_id, None)
        self._slot_names.pop(lora_int_id, None)

    def resident(self) -> list[int]:
        """lora_int_ids in device slots, least recently used first."""
        return list(self._slots)

    def resident_names(self) -> list[str]:
        """Names of the adapters in device slots (usable by a step without a load), LRU first."""
        return [self._slot_names[i] for i in self._slots]

    def _slot_of(self, request: LoRARequest, pinned: set[int]) -> int:
        slot = self._slots.get(request.lora_int_id)
        if slot is not None:
            self._slots.move_to_end(request.lora_int_id)
            return slot
        adapter = self.get(request)
        if len(self._slots) < self.max_loras:
            slot = len(self._slots)
        else:
            victim = next((i for i in self._slots if i not in pinned), None)
            assert victim is not None, f"a step with more than max_loras={self.max_loras} adapters"
            slot = self._slots.pop(victim)
            del self._slot_names[victim]
        for (layer, fused), wrapper in self.wrappers.items():
            wrapper.set_slot(slot, [adapter.weights.get((layer, m)) for m in SLICES[fused]])
        self._slots[request.lora_int_id] = slot
        self._slot_names[request.lora_int_id] = request.lora_name
        self.num_slot_loads += 1
        return slot

    def prepare_step(self, requests: list[LoRARequest | None], q_lens: list[int]) -> None:
        """Slots for the step's sequences (one LoRARequest or None each, with its token count)."""
        step = self.step
        step.groups, step.rows = [], None
        if all(r is None for r in requests):
            return
        pinned = {r.lora_int_id for r in requests if r is not None}
        seq_slots = [-1 if r is None else self._slot_of(r, pinned) for r in requests]
        token_slots = torch.repeat_interleave(torch.tensor(seq_slots), torch.tensor(q_lens))
        groups = []
        for slot in sorted(set(seq_slots) - {-1}):
            rows = (token_slots == slot).nonzero().flatten()
            groups.append(SlotGroup(slot, None if rows.numel() == token_slots.numel() else rows.to(self.device)))
        step.token_slots = token_slots.to(self.device)
        step.groups = groups
        # the adapter rows in group order, gathered once per projection by the grouped CPU path
        partial = [g.rows for g in groups if g.rows is not None]
        step.rows = torch.cat(partial) if partial else None

    def end_step(self) -> None:
        self.step.groups = []
        self.step.token_slots = None
        self.step.rows = None


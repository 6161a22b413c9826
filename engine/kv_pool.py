"""The paged KV pool's tensors: how many blocks an engine gets, and the caches themselves.

How many: --num-kv-blocks as given; else the bytes of --kv-cache-memory or of
--gpu-memory-utilization; else a share of what is free once the weights are loaded (CPU: of
the host's available memory, capped at every sequence at full length; CUDA: of the device's
free memory), over the bytes of one block in the cache's dtype (engine/loader.py
resolve_kv_cache_dtype). The block manager (engine/kv_cache_manager.py) owns which block holds
what; this module only sizes and allocates.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.host_memory import available_host_memory

# CPU: the share of the memory available once the weights are loaded (available_host_memory)
# that the pool takes by default. Its pages stay the kernel's zero pages until written
# (allocate_kv_pool), so resident memory grows with the tokens actually cached, up to this; a
# fixed 512 MiB held ~11K float32 tokens of SmolLM2 and 64 growing chats preempted each other.
CPU_FREE_MEMORY_FRACTION = 0.5
# CUDA: the share of the memory still free after the weights are loaded. vLLM reserves
# gpu_memory_utilization=0.9 of the whole device; we leave 10% of what is free for
# activations and logits of one step (max_num_batched_tokens x vocab floats) and the allocator.
CUDA_FREE_MEMORY_FRACTION = 0.9


def utilization_budget(fraction: float, device: torch.device) -> int:
    """KV bytes under --gpu-memory-utilization. CUDA, as vLLM: the fraction of the device's total
    memory less what this process already holds (weights, the step's workspace). CPU: the
    fraction of the memory available now, after the weights are loaded."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        budget = int(total * fraction) - torch.cuda.memory_reserved(device)
        if budget < 1:
            raise ValueError(f"--gpu-memory-utilization {fraction:g} leaves no memory for the KV cache: "
                             f"{torch.cuda.memory_reserved(device) / 2**30:.1f} GiB of the device's "
                             f"{total / 2**30:.1f} GiB are already used by the weights")
        return budget
    return int(available_host_memory() * fraction)


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, max_model_len: int, device: torch.device) -> int:
    """The pool's block count for one engine (rank), blocks of `bytes_per_block` each."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    budget = config.kv_cache_memory
    cap = None
    if config.gpu_memory_utilization is not None:
        budget = utilization_budget(config.gpu_memory_utilization, device)
    elif budget is None:
        blocks_per_seq = -(-max_model_len // config.block_size)
        cap = config.max_num_seqs * blocks_per_seq   # more than every sequence at full length is waste
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            budget = int(free * CUDA_FREE_MEMORY_FRACTION)
        else:
            budget = int(available_host_memory() * CPU_FREE_MEMORY_FRACTION)
    num_blocks = budget // bytes_per_block if cap is None else min(budget // bytes_per_block, cap)
    if num_blocks < 1:
        raise ValueError(f"KV cache budget of {budget} bytes holds no block of {bytes_per_block} bytes")
    return num_blocks


def allocate_kv_pool(num_layers: int, shape: tuple[int, ...], dtype: torch.dtype,
                     device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(k, v) zeroed caches per layer. Zeroed, not empty: the torch backend's decode reads whole
    blocks and masks positions past seq_len out of the softmax, and a masked NaN left in v would
    still turn 0 * NaN into NaN (engine/attention/torch_backend.py). On CPU each cache is its own
    numpy.zeros buffer: calloc takes it from the kernel's zero pages without writing them, so start-up
    skips the fill and the resident memory grows with the blocks actually written. Its own, not views
    of one buffer: torch.compile treats inputs that alias one storage as views of a "synthetic base"
    and a captured decode step that writes to them copied the whole pool every step (1.4 s a token
    with a 6 GB pool)."""
    if device.type != "cpu":
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in range(num_layers)]
    per_cache = math.prod(shape) * dtype.itemsize

    def cache() -> torch.Tensor:
        return torch.from_numpy(np.zeros(per_cache, dtype=np.uint8)).view(dtype).view(shape)
    return [(cache(), cache()) for _ in range(num_layers)]

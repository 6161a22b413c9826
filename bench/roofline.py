"""The memory roofline of a batch-1 decode on CPU: weight bytes read per token / bandwidth.

Decode at batch 1 reads every weight once per token, so no engine can pass
`bandwidth / bytes_per_token` tokens/s. bench/cpu_peers.py prints this bound beside
each measured number.

    bandwidth          a large torch copy (reads N bytes, writes N): 2N / time, best of a few,
                       with the engines' thread count
    pagedkube          the model as the engine holds it (LLM(...), the given quantization and
                       dtype): every parameter and buffer once (a tied lm_head shares the
                       embedding's storage and is read whole every token), minus the embedding
                       table when lm_head is a separate tensor (then one row of it is read)
    llama.cpp          every tensor of the GGUF file as stored (its output layer is the tied
                       token_embd, read whole every token)
"""
from __future__ import annotations

import time

COPY_BYTES = 256 * 2**20     # well past the L3 of this machine's CPUs (32 MB per CCD on Zen 4)


def copy_bandwidth_gbps(threads: int, repeats: int = 5) -> float:
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t)
        return 2 * COPY_BYTES / best / 1e9
    finally:
        torch.set_num_threads(old)


def gguf_bytes(path) -> int:
    """Bytes of every tensor in a GGUF file, as stored."""
    from pagedkube.engine.gguf.reader import GGUFFile
    return sum(int(t.raw.nbytes) for t in GGUFFile(path).tensors())


def engine_weight_bytes(model: str, **engine_kwargs) -> int:
    """Bytes of weights a batch-1 decode step of the engine reads (see the module docstring)."""
    import torch
    from pagedkube.engine import LLM
    # no decode capture: it would compile in a background thread of this process for minutes, and
    # cpu_peers then launches and times a server beside it (its launch took 4.1-4.9 s so, 2.4-2.7 s without)
    llm = LLM(model, device="cpu", num_kv_blocks=4, decode_capture="off", **engine_kwargs)
    net = llm.engine.runner.model
    seen, total = set(), 0
    for t in list(net.parameters()) + list(net.buffers()):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    for module in net.modules():        # packed weights held as plain tensor attributes
        for value in vars(module).values():
            for t in _tensors(value):
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += t.untyped_storage().nbytes()
    def main_tensor(module):            # nn.Embedding / nn.Linear's weight, or a packed one's codes
        return getattr(module, "weight", None) if hasattr(module, "weight") else getattr(module, "qweight", None)
    embed, head = main_tensor(net.model.embed_tokens), main_tensor(net.lm_head)
    if not isinstance(head, torch.Tensor) or head.untyped_storage().data_ptr() != embed.untyped_storage().data_ptr():
        total -= embed.untyped_storage().nbytes() - embed[0].nbytes     # a lookup reads one row
        scales = getattr(net.model.embed_tokens, "scales", None)       # and one row of a packed one's scales
        head_scales = getattr(net.lm_head, "scales", None)
        if isinstance(scales, torch.Tensor) and (not isinstance(head_scales, torch.Tensor) or
                                                 head_scales.untyped_storage().data_ptr() != scales.untyped_storage().data_ptr()):
            total -= scales.untyped_storage().nbytes() - scales[0].nbytes
    del llm
    return total


def _tensors(value):
    import dataclasses

    import torch
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name))
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)

"""Paged attention: KV lives only in the block pool and is read through block tables.

Every backend provides the two functions of `torch_ref` with the same signature:
`write_kv` (store this step's K/V by slot mapping) and `paged_attention` (attend
from this step's queries to each sequence's whole context in the pool). The
model writes K/V first and attends second, so a sequence can attend to blocks
that another sequence in the same step has just written.

    metadata.py           AttentionMetadata: the step's batch layout, shared by every backend
    torch_ref.py          the reference in plain torch (CPU path, and the tests' oracle)
    torch_backend.py      torch_ref's math with the decode rows batched
    triton_attention.py   the Triton kernel for mixed prefill/decode batches
    triton_write_kv.py    the Triton reshape-and-cache (K/V into the pool by slot)
    triton_backend.py     write_kv and paged_attention over the two Triton kernels
    cpu_attention.cpp     the CPU decode pass read straight from the paged cache (C++, AVX2)
    cpu_backend.py        torch_backend with that kernel for its decode rows (the CPU default
                          where our C++ kernels are built)
    backend.py            AttentionBackend: the two functions, as a type
"""
from pagedkube.engine.attention.metadata import AttentionMetadata

__all__ = ["AttentionMetadata"]

"""Paged attention: KV lives only in the block pool and is read through block tables.

Every backend provides the two functions of `torch_ref` with the same signature:
`write_kv` (store this step's K/V by slot mapping) and `paged_attention` (attend
from this step's queries to each sequence's whole context in the pool). The
model writes K/V first and attends second, so a sequence can attend to blocks
that another sequence in the same step has just written.
"""
from pagedkube.engine.attention.metadata import AttentionMetadata

__all__ = ["AttentionMetadata"]

"""The embedding and lm_head kept as the file's Q8_0 blocks, computed exactly in float32.

The default GGUF ties its token embedding and output projection in one Q8_0 tensor
(49,152 x 576). Dense in float32 it is 113 MB, and the lm_head reads all of it at every
decode step (a third of a one-client step on this project's CPUs, docs/benchmarks.md);
as Q8_0 it is 32 MB (int8 codes and one float32 scale per 32 values). Both read the
file's numbers, so the engine computes what the float32 reference computes:

    PackedEmbedding   rows of q * scale for the step's token ids (exact: an int8 times an
                      fp16 scale is a float32 without rounding)
    PackedLMHead      q8_linear (engine/quant/q4_linear.cpp): per group scale * (codes . x),
                      float32; the logits of the sampled rows only (model_runner picks them)

`pack_vocab` swaps them in after the load when the file stores the tensor(s) as Q8_0, on
CPU, with float32 activations and our kernels built (engine/loader.py; not under tensor
parallelism, whose vocab-parallel layers shard the dense ones).
"""
from __future__ import annotations

import torch
from torch import nn

from pagedkube.engine.models.decoder import DecoderForCausalLM
from pagedkube.engine.quant.formats import Int8Weight
from pagedkube.engine.quant.q4_fused import GROUP_SIZE, Q4Ops


class PackedEmbedding(nn.Module):
    def __init__(self, weight: Int8Weight):
        super().__init__()
        self.qweight, self.scales = weight.qweight, weight.scales
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        q = self.qweight[ids].to(torch.float32)
        return (q.view(*ids.shape, -1, GROUP_SIZE) * self.scales[ids].unsqueeze(-1)).view(*ids.shape, -1)


class PackedLMHead(nn.Module):
    def __init__(self, weight: Int8Weight, ops: Q4Ops):
        super().__init__()
        self.qweight, self.scales, self.ops = weight.qweight, weight.scales, ops
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.q8_linear(x.float().contiguous(), self.qweight, self.scales).to(x.dtype)


def pack_vocab(model: DecoderForCausalLM, embed: Int8Weight, lm_head: Int8Weight | None, ops: Q4Ops) -> None:
    """lm_head None: tied to the embedding (one packed copy serves both)."""
    for w in (embed, lm_head):
        if w is not None and w.group_size != GROUP_SIZE:
            raise ValueError(f"pack_vocab: Q8_0 groups of {GROUP_SIZE} expected, got {w.group_size}")
    model.model.embed_tokens = PackedEmbedding(embed)  # type: ignore[assignment]   # nn.Embedding's interface
    model.lm_head = PackedLMHead(lm_head if lm_head is not None else embed, ops)  # type: ignore[assignment]

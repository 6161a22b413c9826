"""The three layers whose forward talks to the other ranks, put in place after the weights load.

`parallelize(model, group, vocab_size)` swaps them into a decoder built from local_config and
filled through a ShardPlan (engine/distributed/sharding.py). Loading first keeps the checkpoint
names untouched (the loader fills `self_attn.o_proj.weight` as at TP=1), and the decoder
(engine/models/decoder.py) stays what it is: it calls `self.o_proj(x)` and
`self.model.embed_tokens(ids)` without knowing that those now all-reduce.

    RowParallel              y = all_reduce(inner(x)): o_proj and down_proj's partial sums
    VocabParallelEmbedding   each rank looks up the ids in its vocabulary range (zeros elsewhere),
                             then one all-reduce: exact, since only one rank adds non-zeros
    ParallelLMHead           each rank's logits for its vocabulary range, gathered to rank 0
                             and trimmed to the real vocabulary; the other ranks get None

Per layer and step that is two all-reduces of [T, hidden], plus one for the embedding, and one
gather of [S, V/N] logits for the S sequences that sample.
"""
from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from pagedkube.engine.distributed.group import TPGroup
from pagedkube.engine.models.decoder import DecoderForCausalLM, DecoderLayer


class RowParallel(nn.Module):
    def __init__(self, inner: nn.Module, group: TPGroup):
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner(x))


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor, group: TPGroup):
        super().__init__()
        self.weight, self.group = weight, group
        self.start = group.rank * weight.shape[0]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Module):
    def __init__(self, weight: torch.Tensor, group: TPGroup, vocab_size: int):
        super().__init__()
        self.weight, self.group, self.vocab_size = weight, group, vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        shards = self.group.gather_to_first(F.linear(hidden, self.weight))
        return None if shards is None else torch.cat(shards, dim=-1)[:, :self.vocab_size]


def parallelize(model: DecoderForCausalLM, group: TPGroup, vocab_size: int) -> None:
    """Swap the communicating layers into a loaded local decoder (each keeps the loaded weights;
    the ignores: the decoder declares the plain layers these stand in for)."""
    for layer in cast("list[DecoderLayer]", model.model.layers):
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, group)
    model.model.embed_tokens = VocabParallelEmbedding(model.model.embed_tokens.weight, group)  # type: ignore[assignment]
    model.lm_head = ParallelLMHead(model.lm_head.weight, group, vocab_size)   # type: ignore[assignment]

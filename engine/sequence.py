"""One sequence being generated: what the scheduler tracks and the runner reads.

The model runner reads only: request_id, token_ids, num_computed_tokens,
block_table, params, sample_index, num_output_tokens, grammar, lora_request (see ScheduledSeq).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedkube.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedkube.engine.lora.request import LoRARequest
    from pagedkube.engine.structured.grammars import GrammarState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                        SequenceStatus.FINISHED_ABORTED)


class BlockTable(list):
    """A sequence's KV block ids, in order (what the model runner and attention read),
    with the pool's block objects behind them, index for index, in `blocks`.

    Written only by the KVCacheManager, through `append_blocks` and `clear`, so the
    ids and the blocks cannot drift apart; everyone else only reads."""
    __slots__ = ("blocks",)

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list = []        # KVCacheBlock objects (engine/block_pool.py)

    def append_blocks(self, blocks: list) -> None:
        self.blocks.extend(blocks)
        self.extend(b.block_id for b in blocks)

    def clear(self) -> None:
        super().clear()
        self.blocks = []


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    sample_index: int = 0                 # which of the request's n samples this is
    cache_salt: str | None = None
    group: str | None = None              # fairness group (one HTTP request); None = the request itself
    arrival_time: float = field(default_factory=time.monotonic)
    status: SequenceStatus = SequenceStatus.WAITING
    token_ids: list[int] = field(default_factory=list)      # prompt + output so far
    output_token_ids: list[int] = field(default_factory=list)
    block_table: BlockTable = field(default_factory=BlockTable)   # the KVCacheManager's to write
    num_computed_tokens: int = 0          # tokens whose KV is in the pool
    num_cached_tokens: int = 0            # prompt tokens served by the prefix cache
    grammar: GrammarState | None = None   # GrammarState of a constrained request (engine/structured/manager.py)
    lora_request: LoRARequest | None = None   # the adapter it runs under (engine/lora/); None = the base model

    @property
    def lora_name(self) -> str | None:
        return None if self.lora_request is None else self.lora_request.lora_name

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def group_key(self) -> str:
        return self.request_id if self.group is None else self.group

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: run token_ids[num_computed_tokens :
    num_computed_tokens + num_new_tokens]; sample a token after it when `sample`."""
    seq: Sequence
    num_new_tokens: int

    @property
    def sample(self) -> bool:
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SampleOutput:
    token_id: int
    logprob: float | None = None                          # of the sampled token (when params.logprobs is not None)
    top_logprobs: list[tuple[int, float]] | None = None   # the params.logprobs most likely (token id, logprob)
    rank: int | None = None                               # of the sampled token in the vocabulary (1 = likeliest)

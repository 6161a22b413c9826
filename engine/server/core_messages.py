"""What crosses the pipe between the HTTP process and the engine core: named types only.

    HTTP process                                        engine core
    AddRequests([NewRequest, ...])   ---------------->  LLMEngine.add_request each (400 on ValueError)
    AbortRequests([request_id, ...]) ---------------->  LLMEngine.abort_request each
    LoadLoRA(op_id, LoRARequest)     ---------------->  LLMEngine.add_lora: read and check it
    UnloadLoRA(lora_int_id)          ---------------->  LLMEngine.remove_lora (running requests finish)
    Shutdown()                       ---------------->  fail what runs (503), exit
                                     <----------------  CoreReady(EngineFacts) | CoreFailed(message)
                                     <----------------  StepMessage after every step that did
                                                        something, and at least every
                                                        HEARTBEAT_INTERVAL_S while idle

A StepMessage carries each progressing request's RequestDelta (new tokens only),
the add errors, the pool's KV events and a stats snapshot, so per-step IPC is
O(batch x new tokens). They are pickled: measured in docs/benchmarks.md
("engine-core IPC"), pickling a 256-request step costs well under a millisecond.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedkube.engine.outputs import RequestDelta

if TYPE_CHECKING:   # annotations only: the HTTP side needs neither module to build or read a message
    from pagedkube.engine.llm_engine import EngineStats
    from pagedkube.engine.lora.request import LoRARequest
    from pagedkube.engine.sampling_params import SamplingParams

# The core speaks at least this often while idle, so the HTTP side can tell a live
# core from a hung one (core_client.HEARTBEAT_TIMEOUT_S).
HEARTBEAT_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class NewRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    group: str | None = None    # the fairness group: one HTTP request's prompts share it
    lora_request: LoRARequest | None = None


@dataclass(frozen=True, slots=True)
class LoadLoRA:
    op_id: int
    lora_request: LoRARequest


@dataclass(frozen=True, slots=True)
class UnloadLoRA:
    lora_int_id: int


@dataclass(frozen=True, slots=True)
class LoRAResult:
    """The answer to one LoadLoRA: status 200, or 400/404 with the reason."""
    op_id: int
    status: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class AddRequests:
    requests: list[NewRequest]


@dataclass(frozen=True, slots=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the HTTP process needs to know about the engine, sent once after it is built."""
    tokenizer_files: dict[str, str] | None   # file name -> text (pagedkube.tokenizer.Tokenizer's input)
    vocab_size: int
    model_name: str
    max_model_len: int
    block_size: int
    hash_seed: str
    num_kv_blocks: int
    eos_token_ids: list[int]
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class CoreReady:
    facts: EngineFacts


@dataclass(frozen=True, slots=True)
class CoreFailed:
    message: str
    user_error: bool = False    # the configuration's fault (a ValueError): one line, no traceback


@dataclass(frozen=True, slots=True)
class RequestError:
    request_id: str
    status: int                 # the HTTP status the client gets (400: its fault, 500: ours)
    message: str


@dataclass(frozen=True, slots=True)
class KVEvent:
    type: str                   # "stored" | "removed" (kv_events.EVENT_TYPES)
    block_hashes: list[bytes]


@dataclass(slots=True)
class StepMessage:
    deltas: list[RequestDelta] = field(default_factory=list)
    errors: list[RequestError] = field(default_factory=list)
    kv_events: list[KVEvent] = field(default_factory=list)
    lora_results: list[LoRAResult] = field(default_factory=list)
    num_adds: int = 0           # sequences (n per request) the core took from the pipe
    stats: EngineStats | None = None    # after the step
    healthy: bool = True        # False after MAX_CONSECUTIVE_STEP_FAILURES failed steps

    @property
    def empty(self) -> bool:
        return not (self.deltas or self.errors or self.kv_events or self.num_adds or self.lora_results)

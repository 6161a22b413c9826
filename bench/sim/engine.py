"""One simulated engine: the engine's real Scheduler and KVCacheManager, stepped
by the event loop with a TimeModel instead of a model runner.

A request's answer is fixed by the workload (its token ids), so the "sampler"
hands out the next answer token; `ignore_eos` with max_tokens = len(answer)
makes the real Scheduler stop exactly there. Everything else (admission, the
token budget, chunked prefill, prefix hits, LRU eviction, preemption and the
stored/removed events of the cache feed) is the engine's own code.

LoRA (EngineConfig.max_loras): the real Scheduler runs at most max_loras distinct
adapters at once; the slots are an LRU as engine/lora/manager.py keeps them (an
adapter of the step is never evicted for another of the same step), and each load
into a slot adds `lora_load_s` to its step.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from pagedkube import hashing
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import SampleOutput, Sequence
from pagedkube.gateway.routing.adapters import AdapterSlots

from sim.events import EventLoop
from sim.timing import TimeModel


@dataclass(slots=True)
class SimRequest:
    """One turn as an engine sees it, and what it reports back."""
    request_id: str
    prompt: list[int]
    answer: list[int]
    cache_salt: str | None = None
    lora_name: str | None = None
    on_first_token: Callable[[float], None] | None = None
    on_done: Callable[[float, int], None] | None = None   # (time, cached prompt tokens)
    arrived: float = 0.0
    scheduled: bool = False


# A slot load of a rank-16 adapter on all seven projections of an 8B model (~84 MB in bf16)
# from host memory over PCIe at ~25 GB/s: ~3.4 ms, rounded up.
DEFAULT_LORA_LOAD_S = 0.005


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256           # vLLM's default
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768
    hash_seed: str = hashing.DEFAULT_HASH_SEED
    max_loras: int | None = None      # LoRA adapter slots (None: no adapters)
    lora_load_s: float = DEFAULT_LORA_LOAD_S


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    finished: int = 0
    preemptions: int = 0
    queue_s: list[float] = field(default_factory=list)   # arrival to first scheduled, per request
    lora_loads: int = 0            # adapters copied into a slot
    lora_requests: int = 0         # requests under an adapter, first scheduled
    lora_hits: int = 0             # of those, whose adapter was in a slot already


class SimEngine:
    def __init__(self, name: str, loop: EventLoop, config: EngineConfig, time_model: TimeModel,
                 on_events: Callable[["SimEngine", list[tuple[str, list[bytes]]]], None] | None = None):
        self.name = name
        self.engine_id = name    # never restarts in the simulation
        self.loop = loop
        self.config = config
        self.time_model = time_model
        self.on_events = on_events
        self._events: list[tuple[str, list[bytes]]] = []
        self.kv = KVCacheManager(config.num_blocks, config.block_size, enable_caching=True,
                                 hash_seed=config.hash_seed, event_sink=self._sink)
        self.scheduler = Scheduler(self.kv, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_model_len=config.max_model_len, max_loras=config.max_loras)
        self.slots: OrderedDict[str, None] = OrderedDict()   # resident adapters, least recently used first
        self._lora_ids: dict[str, LoRARequest] = {}
        self._requests: dict[Sequence, SimRequest] = {}
        self._busy = False
        self.stats = EngineStats()

    def _sink(self, event_type: str, block_hashes: list[bytes]) -> None:
        self._events.append((event_type, list(block_hashes)))

    # -- what a scrape and the hit-rate metric read -------------------------------
    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def load(self) -> int:
        return self.scheduler.num_running + self.scheduler.num_waiting

    def prefill_backlog(self) -> int:
        """Prompt tokens this engine has still to prefill (uncached_prompt_tokens, summed)."""
        return sum(self.uncached_prompt_tokens(seq) for seq in self._requests)

    def uncached_prompt_tokens(self, seq: Sequence) -> int:
        """What seq has still to prefill: the unscheduled rest of a running prompt, or for a
        waiting one what this engine's cache would not serve now."""
        if seq.num_computed_tokens >= seq.num_prompt_tokens:
            return 0
        if self.kv.holds_blocks(seq):
            return seq.num_prompt_tokens - seq.num_computed_tokens
        return seq.num_prompt_tokens - len(self.kv.get_computed_blocks(seq)) * self.config.block_size

    def lora_slots(self) -> AdapterSlots | None:
        """What the engine's /metrics would say (gateway/engine_metrics.py reads the same)."""
        if self.config.max_loras is None:
            return None
        sched = self.scheduler
        return AdapterSlots(self.config.max_loras, frozenset(self.slots),
                            frozenset(s.lora_name for s in sched.running if s.lora_name is not None),
                            frozenset(s.lora_name for s in sched.waiting if s.lora_name is not None))

    def cached_hashes(self) -> list[bytes]:
        return self.kv.pool.cached_hashes()

    # -- requests and steps ---------------------------------------------------------
    def submit(self, request: SimRequest) -> Sequence:
        if not request.answer:
            raise ValueError(f"request {request.request_id} has an empty answer")
        params = SamplingParams(max_tokens=len(request.answer), ignore_eos=True, temperature=0.0)
        lora = None
        if request.lora_name is not None:
            if self.config.max_loras is None:
                raise ValueError(f"request {request.request_id} names an adapter; the engine has no max_loras")
            lora = self._lora_ids.get(request.lora_name)
            if lora is None:
                lora = self._lora_ids[request.lora_name] = LoRARequest(request.lora_name, len(self._lora_ids) + 1,
                                                                       f"/adapters/{request.lora_name}")
        seq = Sequence(request.request_id, list(request.prompt), params, cache_salt=request.cache_salt,
                       arrival_time=self.loop.now, lora_request=lora)
        request.arrived = self.loop.now
        self.scheduler.add_request([seq])
        self._requests[seq] = request
        if not self._busy:
            self._busy = True
            self.loop.at(self.loop.now, self._step)
        return seq

    def _step(self) -> None:
        scheduled = self.scheduler.schedule()
        self._flush_events()
        if not scheduled:
            self._busy = False
            return
        now = self.loop.now
        resident = set(self.slots)
        for item in scheduled:
            request = self._requests[item.seq]
            if not request.scheduled:
                request.scheduled = True
                self.stats.queue_s.append(now - request.arrived)
                if request.lora_name is not None:
                    self.stats.lora_requests += 1
                    self.stats.lora_hits += request.lora_name in resident
        prefill = sum(s.num_new_tokens for s in scheduled if s.seq.num_computed_tokens < s.seq.num_prompt_tokens)
        decode = sum(1 for s in scheduled if s.seq.num_computed_tokens >= s.seq.num_prompt_tokens)
        loads = self._load_adapters({s.seq.lora_name for s in scheduled} - {None})
        dt = self.time_model.step_time(prefill, decode) + loads * self.config.lora_load_s
        self.stats.steps += 1
        self.stats.busy_s += dt
        self.stats.prefill_tokens += prefill
        self.loop.after(dt, self._finish_step, scheduled)

    def _load_adapters(self, names: set) -> int:
        """Slots for the step's adapters, as LoRAManager.prepare_step gives them; the loads it took."""
        loads = 0
        for name in sorted(names):
            if name in self.slots:
                self.slots.move_to_end(name)
                continue
            if len(self.slots) >= self.config.max_loras:
                victim = next(n for n in self.slots if n not in names)   # the Scheduler runs <= max_loras
                del self.slots[victim]
            self.slots[name] = None
            loads += 1
        self.stats.lora_loads += loads
        return loads

    def _finish_step(self, scheduled) -> None:
        outputs = []
        for item in scheduled:
            if item.sample:
                answer = self._requests[item.seq].answer
                outputs.append(SampleOutput(token_id=answer[item.seq.num_output_tokens]))
            else:
                outputs.append(None)
        now = self.loop.now
        for update in self.scheduler.postprocess(scheduled, outputs):
            seq = update.seq
            request = self._requests[seq]
            if seq.num_output_tokens == 1 and request.on_first_token is not None:
                request.on_first_token(now)
            if seq.status.finished:
                del self._requests[seq]
                self.stats.finished += 1
                if request.on_done is not None:
                    request.on_done(now, seq.num_cached_tokens)
        self.stats.preemptions = self.scheduler.num_preemptions
        self._flush_events()
        self._step()

    def _flush_events(self) -> None:
        if self._events:
            events, self._events = self._events, []
            if self.on_events is not None:
                self.on_events(self, events)

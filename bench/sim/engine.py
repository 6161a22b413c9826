"""One simulated engine: the engine's real Scheduler and KVCacheManager, stepped
by the event loop with a TimeModel instead of a model runner.

A request's answer is fixed by the workload (its token ids), so the "sampler"
hands out the next answer token; `ignore_eos` with max_tokens = len(answer)
makes the real Scheduler stop exactly there. Everything else (admission, the
token budget, chunked prefill, prefix hits, LRU eviction, preemption and the
stored/removed events of the cache feed) is the engine's own code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pagedkube import hashing
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import SampleOutput, Sequence

from sim.events import EventLoop
from sim.timing import TimeModel


@dataclass(slots=True)
class SimRequest:
    """One turn as an engine sees it, and what it reports back."""
    request_id: str
    prompt: list[int]
    answer: list[int]
    cache_salt: str | None = None
    on_first_token: Callable[[float], None] | None = None
    on_done: Callable[[float, int], None] | None = None   # (time, cached prompt tokens)
    arrived: float = 0.0
    scheduled: bool = False


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256           # vLLM's default
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768
    hash_seed: str = hashing.DEFAULT_HASH_SEED


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    finished: int = 0
    preemptions: int = 0
    queue_s: list[float] = field(default_factory=list)   # arrival to first scheduled, per request


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
                                   max_model_len=config.max_model_len)
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

    def cached_hashes(self) -> list[bytes]:
        return self.kv.pool.cached_hashes()

    # -- requests and steps ---------------------------------------------------------
    def submit(self, request: SimRequest) -> Sequence:
        if not request.answer:
            raise ValueError(f"request {request.request_id} has an empty answer")
        params = SamplingParams(max_tokens=len(request.answer), ignore_eos=True, temperature=0.0)
        seq = Sequence(request.request_id, list(request.prompt), params, cache_salt=request.cache_salt,
                       arrival_time=self.loop.now)
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
        for item in scheduled:
            request = self._requests[item.seq]
            if not request.scheduled:
                request.scheduled = True
                self.stats.queue_s.append(now - request.arrived)
        prefill = sum(s.num_new_tokens for s in scheduled if s.seq.num_computed_tokens < s.seq.num_prompt_tokens)
        decode = sum(1 for s in scheduled if s.seq.num_computed_tokens >= s.seq.num_prompt_tokens)
        dt = self.time_model.step_time(prefill, decode)
        self.stats.steps += 1
        self.stats.busy_s += dt
        self.stats.prefill_tokens += prefill
        self.loop.after(dt, self._finish_step, scheduled)

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

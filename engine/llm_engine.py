"""LLMEngine: requests in, cumulative RequestOutputs out, one forward pass per step.

    add_request ──> Scheduler.waiting  (a constrained request first waits for its grammar:
                                        engine/structured/manager.py)
    step():  schedule ──> ModelRunner.execute ──> Scheduler.postprocess ──> outputs
                (KVCacheManager / BlockPool)         (stop, free)     (text, stop strings)

Validation happens in add_request, before anything is queued, so a bad request
is a ValueError for its caller and never disturbs the others. Not thread-safe:
call everything from one thread (the server's engine loop). Importing this
module does not import torch; constructing an engine does.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.kv_events import KVEventLog
from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.output_processor import RequestState
from pagedkube.engine.outputs import RequestDelta, RequestOutput
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import Sequence, SequenceStatus
from pagedkube.engine.structured.manager import StructuredOutputManager
from pagedkube.engine.tokenizer_source import engine_tokenizer_files
from pagedkube.tokenizer import Tokenizer


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float          # 0..1, cached-but-free blocks count as free
    prefix_cache_queries: int      # tokens, cumulative
    prefix_cache_hits: int         # tokens, cumulative
    num_preemptions: int           # cumulative
    num_kv_blocks: int
    num_free_blocks: int
    num_captured_steps: int = 0    # cumulative: decode steps run through the captured program (decode_capture.py)
    running_lora_adapters: tuple[str, ...] = ()   # names of the adapters of running / waiting sequences
    waiting_lora_adapters: tuple[str, ...] = ()
    num_lora_slot_loads: int = 0   # cumulative: adapters copied into a device slot (engine/lora/manager.py)
    resident_lora_adapters: tuple[str, ...] = ()  # names of the adapters in device slots: a step runs them unloaded


# While only grammars are compiling, a step waits this long for one (instead of spinning).
PARKED_WAIT_S = 0.005


class LLMEngine:
    def __init__(self, config: EngineConfig, kv_event_sink: Callable[[str, list[bytes]], None] | None = None):
        """`kv_event_sink` receives the pool's cache events (stored/removed block hashes).
        None: the engine keeps them in its own KVEventLog (`self.kv_events`), as the
        offline LLM does; the server's engine core passes its own sink instead, so the
        log lives only in the HTTP process."""
        from pagedkube.engine.model_runner import ModelRunner
        from pagedkube.model_source import model_name

        self.config = config
        self.model_name = model_name(config.model)
        self.runner = ModelRunner(config)
        model_dir = self.runner.model_config.model_dir   # a GGUF's converted files live in the cache
        # The files now; the tokenizer itself when first used (below): a server's core hands the
        # files to its HTTP process, which tokenizes, and never needs one (0.09 s of start-up).
        self.tokenizer_files = engine_tokenizer_files(config, model_dir)
        self.vocab_size = self.runner.model_config.vocab_size
        self.max_model_len = self.runner.max_model_len
        self.block_size = self.runner.block_size
        self.kv_events = KVEventLog() if kv_event_sink is None else None
        self.kv_manager = KVCacheManager(self.runner.num_kv_blocks, self.block_size, config.enable_prefix_caching,
                                         config.hash_seed, kv_event_sink or self.kv_events.record)
        # The one source of EOS ids (the model's, else the tokenizer's), for the stop check and
        # for the sampler's min_tokens mask alike.
        eos_ids = self.runner.model_config.eos_token_ids or (self.tokenizer.eos_token_ids if self.tokenizer_files else [])
        self.eos_token_ids = list(eos_ids)
        self.runner.sampler.eos_token_ids = self.eos_token_ids
        self.scheduler = Scheduler(self.kv_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_model_len=self.max_model_len, eos_token_ids=eos_ids,
                                   max_loras=config.max_loras if config.enable_lora else None)
        self._requests: dict[str, RequestState] = {}
        self.structured = StructuredOutputManager(self._make_grammar_compiler, config.grammar_compile_timeout)
        self._errors: list[RequestDelta] = []     # requests that failed outside a step (their grammar)

    @functools.cached_property
    def tokenizer(self) -> Tokenizer | None:
        return Tokenizer(self.tokenizer_files) if self.tokenizer_files is not None else None

    def _make_grammar_compiler(self):
        from pagedkube.engine.structured.grammars import GrammarCompiler

        return GrammarCompiler(self.tokenizer_files["tokenizer.json"], self.vocab_size, self.eos_token_ids)

    # ---- requests ------------------------------------------------------------------

    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt, checked against the vocabulary (ValueError if bad)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            if self.tokenizer is None:
                raise ValueError(f"model {self.model_name!r} has no tokenizer.json; pass token ids")
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            token_ids = list(prompt)
            bad = [t for t in token_ids if isinstance(t, bool) or not isinstance(t, int)
                   or not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size}) "
                                 f"(the vocabulary size); got {bad[:5]}")
        else:
            raise ValueError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty")
        return token_ids

    # ---- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read and check an adapter into host memory now (AdapterError, a ValueError, if it cannot
        be served), so its first request does not pay the load; True when done."""
        self.check_lora(lora_request)
        return True

    def check_lora(self, lora_request: LoRARequest | None) -> None:
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        if self.runner.lora is None:
            raise ValueError(f"adapter {lora_request.lora_name!r} requested, but LoRA is not enabled "
                             "(enable_lora=True / --enable-lora)")
        self.runner.lora.get(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop an adapter from host memory and its slot. Requests still running under it finish:
        they carry their LoRARequest, and the adapter is read again if a step needs it."""
        lora = self.runner.lora
        if lora is None or lora_int_id not in self.list_loras():
            return False
        in_use = any(s.lora_request is not None and s.lora_request.lora_int_id == lora_int_id
                     for s in (*self.scheduler.running, *self.scheduler.waiting))
        if not in_use:
            lora.forget(lora_int_id)
        return True

    def list_loras(self) -> set[int]:
        lora = self.runner.lora
        return set() if lora is None else set(lora._cpu) | set(lora.resident())

    def check_request(self, prompt: str | list[int], params: SamplingParams,
                      lora_request: LoRARequest | None = None) -> list[int]:
        """Everything add_request validates, without queueing; returns the token ids."""
        self.check_lora(lora_request)
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        token_ids = self.tokenize_prompt(prompt)
        bad_bias = [t for t in params.logit_bias or () if t >= self.vocab_size]
        if bad_bias:
            raise ValueError(f"logit_bias: token ids must be < {self.vocab_size} (the vocabulary size); "
                             f"got {bad_bias[:5]}")
        if params.structured_outputs is not None and self.tokenizer_files is None:
            raise ValueError(f"structured_outputs: model {self.model_name!r} has no tokenizer.json to build a "
                             "grammar from")
        self.scheduler.check_request(len(token_ids), params)
        return token_ids

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    *, cache_salt: str | None = None, group: str | None = None,
                    lora_request: LoRARequest | None = None) -> list[int]:
        """Queues a request; returns its prompt token ids (ValueError if it can never run)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already running")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError("cache_salt must be a string")
        token_ids = self.check_request(prompt, params, lora_request)
        seqs = [Sequence(request_id, token_ids, params, sample_index=i, cache_salt=cache_salt, group=group,
                         lora_request=lora_request) for i in range(params.n)]
        if params.structured_outputs is None or self.structured.submit(request_id, seqs):
            self.scheduler.add_request(seqs)
        self._requests[request_id] = RequestState.create(
            request_id, prompt if isinstance(prompt, str) else None, seqs, self.tokenizer)
        return token_ids

    def abort_request(self, request_id: str) -> None:
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        if self.structured.abort(request_id):
            return                       # parked for its grammar: never reached the scheduler
        for sample in state.samples:
            self.scheduler.finish(sample.seq, SequenceStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    # ---- the loop ------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One forward pass; the cumulative outputs of the requests that sampled a token
        (vLLM's LLMEngine.step). O(tokens so far) per request: the server and LLM use
        step_deltas() instead. A request that fails before it runs (its grammar did not
        compile) ends with a RequestOutput whose outputs are empty and finished is True."""
        outputs = [state.to_output() for state in self._step()]
        return outputs + [RequestOutput(e.request_id, None, [], [], True) for e in self._take_errors()]

    def step_deltas(self) -> list[RequestDelta]:
        """One forward pass; what each request that sampled a token added (O(new tokens)), and a
        finished delta with `error` set for each request that failed before it ran."""
        return [state.to_delta() for state in self._step()] + self._take_errors()

    def _take_errors(self) -> list[RequestDelta]:
        errors, self._errors = self._errors, []
        return errors

    def _admit_compiled(self) -> None:
        """Queue the requests whose grammar compiled; fail those whose grammar did not."""
        if not self.structured.num_parked:
            return
        ready, failed = self.structured.poll()
        for _, seqs in ready:
            self.scheduler.add_request(seqs)
        for request_id, message in failed:
            del self._requests[request_id]
            self._errors.append(RequestDelta(request_id, [], True, 0, error=message))

    def _step(self) -> list[RequestState]:
        self._admit_compiled()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self.structured.num_parked and not self.scheduler.has_unfinished():
                self.structured.wait(PARKED_WAIT_S)    # only grammars compiling: wait a little, not spin
                return []
            if self._requests:   # the scheduler guarantees progress; never spin silently
                raise RuntimeError(f"no request could be scheduled ({self.stats()})")
            return []
        now = time.monotonic()
        for item in scheduled:
            self._requests[item.seq.request_id].metrics.setdefault("first_scheduled_time", now)
        sampled = self.runner.execute(scheduled, self.structured)
        updates = self.scheduler.postprocess(scheduled, sampled)
        touched: dict[str, RequestState] = {}
        for update in updates:
            seq = update.seq
            if seq.grammar is not None and not self.structured.accept(seq, update.sample.token_id) \
                    and not seq.status.finished:
                self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)   # the grammar has ended
            state = self._requests[seq.request_id]
            state.apply(update, self.scheduler)
            touched[state.request_id] = state
        for request_id, state in touched.items():
            if state.finished:
                del self._requests[request_id]
        return list(touched.values())

    def check_workers(self) -> None:
        """WorkerFailed if a tensor-parallel worker has exited (a no-op at TP=1)."""
        self.runner.check_workers()

    def shutdown(self) -> None:
        """Stops the tensor-parallel workers, if any; the engine cannot step after it."""
        self.runner.shutdown()

    def stats(self) -> EngineStats:
        kv = self.kv_manager
        lora: dict = {}
        if self.runner.lora is not None:
            sched = self.scheduler
            lora = dict(running_lora_adapters=tuple(sorted({s.lora_name for s in sched.running} - {None})),
                        waiting_lora_adapters=tuple(sorted({s.lora_name for s in sched.waiting} - {None})),
                        num_lora_slot_loads=self.runner.lora.num_slot_loads,
                        resident_lora_adapters=tuple(sorted(self.runner.lora.resident_names())))
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=kv.usage, prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits, num_preemptions=self.scheduler.num_preemptions,
            num_kv_blocks=kv.pool.num_blocks, num_free_blocks=kv.num_free_blocks,
            num_captured_steps=self.runner.decode_capture.num_captured_steps if self.runner.decode_capture else 0,
            **lora)

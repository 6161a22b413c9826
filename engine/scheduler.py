"""Which sequences run in the next forward pass, and what their results mean.

One token budget per step (max_num_batched_tokens) is spent in this order:

    1. running sequences, oldest first: a decode costs 1 token, an unfinished
       prefill its remaining prompt (cut to the budget: chunked prefill);
    2. waiting sequences, front first, while the budget, max_num_seqs and the
       pool allow (prefix-cache hits are free). The waiting queue is fair across
       requests (waiting_queue.py): round-robin between groups, FIFO within one.

When a running sequence needs a block and the pool is empty, the most recently
arrived running sequence not yet scheduled this step is preempted by recompute:
its blocks go back to the pool, num_computed_tokens to 0, and it returns to the
front of `waiting` (its full blocks stay cached, so the recompute is mostly hits).
A scheduled sequence is never preempted in the same step, so no block is freed
while a step still reads it; finished sequences are freed in postprocess, after
the step. Every request passed check_request fits in the pool alone, so the
oldest sequence always makes progress: the loop never spins.

LoRA: at most `max_loras` distinct adapters run at once (the model's device slots).
A waiting sequence whose adapter would be one too many is passed over this step and
keeps its place; the sequences behind it may still be admitted (vLLM does the same).
Once the running adapters' sequences finish, it is admitted: nothing waits forever.

n > 1: only sample 0 of a request is queued at first. When its prompt is
computed its siblings get its full prompt blocks (KVCacheManager.fork, by
reference count, prefix cache on or off) and join the front of `waiting`.

Torch-free.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from pagedkube.engine.admission import AdmissionLimits, allowed_max_tokens
from pagedkube.engine.forks import PendingForks
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.sequence import SampleOutput, ScheduledSeq, Sequence, SequenceStatus
from pagedkube.engine.waiting_queue import WaitingQueue


@dataclass
class SeqUpdate:
    """One sampled token, after the stop checks ran (seq.status says if it finished)."""
    seq: Sequence
    sample: SampleOutput
    stop_reason: int | None = None   # the stop_token_ids entry that ended it (None for EOS)


class Scheduler:
    def __init__(self, kv: KVCacheManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: list[int] | tuple[int, ...] = (), max_loras: int | None = None):
        self.kv = kv
        self.block_size = kv.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.limits = AdmissionLimits(max_model_len, kv.pool.num_blocks, self.block_size)
        # A sequence never outgrows the pool: max_tokens=None stops here ("length").
        self.max_seq_len = self.limits.max_seq_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting = WaitingQueue()
        self.running: list[Sequence] = []          # sorted by arrival, oldest first
        self.forks = PendingForks()
        self._arrival: dict[Sequence, int] = {}
        self._num_arrived = 0
        self._admitted: set[Sequence] = set()
        self.num_preemptions = 0
        self.max_loras = max_loras            # None: no adapters (every sequence runs the base model)

    # ---- admission -------------------------------------------------------------

    def max_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        if params.max_tokens is None:
            return self.max_seq_len - num_prompt_tokens
        return params.max_tokens

    def check_request(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """ValueError (AdmissionError) for a request that could never finish, even alone in the pool."""
        allowed_max_tokens(self.limits, num_prompt_tokens, params.max_tokens)

    def add_request(self, seqs: list[Sequence]) -> None:
        """Queue one request's samples (seqs[i].sample_index == i)."""
        self.check_request(seqs[0].num_prompt_tokens, seqs[0].params)
        for seq in seqs:
            self._arrival[seq] = self._num_arrived
            self._num_arrived += 1
        self.waiting.append(seqs[0])
        self.forks.add(seqs[0], seqs[1:])

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End a sequence on any path (stop, length, abort) and free its blocks once."""
        assert status.finished
        if seq.status.finished:
            return
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.forks.remove(seq)
        pending = self.forks.take(seq)
        if status == SequenceStatus.FINISHED_ABORTED:
            for sibling in pending:
                self.finish(sibling, status)
        else:  # sample 0 ended (e.g. max_tokens=1) before its siblings were forked: queue them
            self.waiting.extendleft(reversed(pending))
        seq.status = status
        self.kv.free(seq)
        self._arrival.pop(seq, None)
        self._admitted.discard(seq)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self.forks)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.forks)

    # ---- one step ----------------------------------------------------------------

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            assert num_new > 0, seq
            while self.kv.allocate_slots(seq, num_new) is None:
                preempted = True
                if self._release_waiting_blocks():
                    continue
                victim = self.running[-1]    # newest; everything before index i is scheduled
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, num_new))
                budget -= num_new
                i += 1
        if preempted:   # the pool is full: admitting anyone would only thrash
            return scheduled
        loras = {s.lora_name for s in self.running} - {None}
        passed_over: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.lora_name is not None and seq.lora_name not in loras:
                if self.max_loras is None or len(loras) >= self.max_loras:
                    passed_over.append(self.waiting.popleft())
                    continue
            if self.kv.holds_blocks(seq):     # a forked sibling: shared prompt blocks
                hits, num_computed = None, seq.num_computed_tokens
            else:
                hits = self.kv.get_computed_blocks(seq)
                num_computed = len(hits) * self.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if self.kv.allocate_slots(seq, num_new, hits) is None:
                # With nothing running, only waiting siblings' shared blocks can be in
                # the way: release them (the head then fits, as it fits alone).
                if not self.running and self._release_waiting_blocks(exclude=seq):
                    continue
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_computed
            if seq not in self._admitted:
                self._admitted.add(seq)
                seq.num_cached_tokens = num_computed
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=self._arrival.__getitem__)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            if seq.lora_name is not None:
                loras.add(seq.lora_name)
        self.waiting.extendleft(reversed(passed_over))
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release_waiting_blocks(self, exclude: Sequence | None = None) -> bool:
        """Un-fork the newest waiting sibling holding blocks (cheaper than a preemption)."""
        for seq in reversed(self.waiting):
            if seq is not exclude and self.kv.holds_blocks(seq):
                self.kv.free(seq)
                seq.num_computed_tokens = 0
                return True
        return False

    def postprocess(self, scheduled: list[ScheduledSeq],
                    outputs: list[SampleOutput | None]) -> list[SeqUpdate]:
        """Apply a finished step: advance, cache full blocks, append, stop, free."""
        assert len(scheduled) == len(outputs), (len(scheduled), len(outputs))
        updates: list[SeqUpdate] = []
        for item, out in zip(scheduled, outputs):
            seq = item.seq
            sampled = item.sample            # before num_computed_tokens moves
            if seq.status != SequenceStatus.RUNNING:
                continue                     # aborted while the step ran
            seq.num_computed_tokens += item.num_new_tokens
            self.kv.cache_blocks(seq)
            if self.forks.ready(seq):
                self._fork_siblings(seq)
            if not sampled:
                assert out is None, "the runner sampled a prefill chunk"
                continue
            assert out is not None, "the runner did not sample a sequence that reached its end"
            seq.append_token(out.token_id)
            status, stop_reason = self._check_stop(seq)
            if status is not None:
                self.finish(seq, status)     # the step that used its blocks is over
            updates.append(SeqUpdate(seq, out, stop_reason))
        return updates

    def _fork_siblings(self, parent: Sequence) -> None:
        siblings = self.forks.take(parent)
        for sibling in siblings:
            sibling.num_cached_tokens = self.kv.fork(parent, sibling)
            self._admitted.add(sibling)
        self.waiting.extendleft(reversed(siblings))

    def _check_stop(self, seq: Sequence) -> tuple[SequenceStatus | None, int | None]:
        """(finish status or None, the stop token id) after seq's last token."""
        params = seq.params
        token_id = seq.output_token_ids[-1]
        if seq.num_output_tokens >= params.min_tokens:
            if token_id in self.eos_token_ids and not params.ignore_eos:
                return SequenceStatus.FINISHED_STOPPED, None
            if token_id in params.stop_token_ids:
                return SequenceStatus.FINISHED_STOPPED, token_id
        if (seq.num_output_tokens >= self.max_tokens(seq.num_prompt_tokens, params)
                or seq.num_tokens >= self.max_seq_len):
            return SequenceStatus.FINISHED_LENGTH, None
        return None, None

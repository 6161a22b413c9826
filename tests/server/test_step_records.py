"""The per-step record (RequestDelta in a StepMessage): it crosses the process boundary
as it is, and the work per step is O(new tokens) in the engine and in the formatter."""
from __future__ import annotations

import multiprocessing

import pytest

from core_echo import echo
from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.outputs import OutputAccumulator, RequestDelta, SampleDelta
from pagedkube.engine.server.core_messages import (AddRequests, KVEvent, NewRequest, RequestError,
                                                   StepMessage)
from pagedkube.engine.server.responses import ChatFormatter, CompletionFormatter
from pagedkube.engine.server.prepare import Prepared

STEPS = 150


def test_step_message_round_trip_through_a_real_process():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=echo, args=(child,), daemon=True)
    proc.start()
    child.close()
    params = SamplingParams(n=2, temperature=0.5, max_tokens=9, stop=["x"], logit_bias={3: 1.5})
    messages = [
        AddRequests([NewRequest("r-0", [1, 2, 3], params, "tenant", group="r")]),
        StepMessage(deltas=[RequestDelta("r-0", [SampleDelta(0, [7, 8], "ab", [{7: -0.5}, {8: -1.0, 2: -2.0}], -1.5),
                                                 SampleDelta(1, [9], "é", None, None, "stop", "x")],
                                         finished=False, num_cached_tokens=16, first_scheduled_time=12.5)],
                    errors=[RequestError("r-1", 400, "bad")], kv_events=[KVEvent("stored", [b"\x00" * 32])],
                    num_adds=2, healthy=True),
    ]
    try:
        for msg in messages:
            parent.send(msg)
            back = parent.recv()
            assert back == msg and type(back) is type(msg)
        assert back.deltas[0].samples[1].finish_reason == "stop"
    finally:
        parent.close()
        proc.join(10)


@pytest.fixture(scope="module")
def long_run():
    """Deltas of one request, one per step, for STEPS steps (2 samples, logprobs on)."""
    llm = LLM("builtin://tiny", device="cpu", max_model_len=512)
    engine = llm.engine
    engine.add_request("long", "My dog likes", SamplingParams(n=2, max_tokens=STEPS, ignore_eos=True, logprobs=2,
                                                              temperature=0.7, seed=1))
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step_deltas()
    return llm, deltas


def test_each_step_carries_only_the_new_token(long_run):
    _, deltas = long_run
    # n = 2: sample 1 is forked after sample 0's prefill, so it runs one step behind.
    per_sample = {0: 0, 1: 0}
    for d in deltas:
        for s in d.samples:
            assert len(s.token_ids) == 1 and len(s.logprobs) == 1
            per_sample[s.index] += 1
    assert per_sample == {0: STEPS, 1: STEPS} and len(deltas) <= STEPS + 1
    assert deltas[-1].finished and deltas[-1].samples[-1].finish_reason == "length"


def test_deltas_accumulate_to_the_cumulative_output(long_run):
    llm, deltas = long_run
    acc = OutputAccumulator("long", None, [])
    for d in deltas:
        acc.add(d)
    out = acc.result()
    again = llm.generate(["My dog likes"], SamplingParams(n=2, max_tokens=STEPS, ignore_eos=True, logprobs=2,
                                                           temperature=0.7, seed=1))[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in again.outputs]
    assert [c.text for c in out.outputs] == [c.text for c in again.outputs]
    def numbers(c):      # the server's accumulator decodes no token text (its formatter does)
        return [{t: (lp.logprob, lp.rank) for t, lp in entry.items()} for entry in c.logprobs]
    assert [numbers(c) for c in out.outputs] == [numbers(c) for c in again.outputs]
    assert all(lp.decoded_token is not None for c in again.outputs for entry in c.logprobs for lp in entry.values())


class CountingTokenizer:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += len(ids)
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("formatter", [CompletionFormatter, ChatFormatter])
def test_formatting_work_per_step_does_not_grow(long_run, formatter):
    llm, deltas = long_run
    tokenizer = CountingTokenizer(llm.get_tokenizer())
    prepared = Prepared([[1, 2, 3]], ["My dog likes"], SamplingParams(n=2), None)
    extra = {"logprobs": 2, "echo": False} if formatter is CompletionFormatter else {"top_logprobs": 2}
    fmt = formatter("id", "m", prepared, tokenizer, 2, **extra)
    per_step = []
    for d in deltas:
        before = tokenizer.calls
        fmt.stream_update(0, d)
        per_step.append(tokenizer.calls - before)
    busy = [c for c in per_step if c]
    assert len(busy) in (STEPS, STEPS + 1)
    # Tokens decoded per step: for each of 2 samples the new token and its top 2 (3 when the
    # sampled one is not among them): bounded, the same at step 150 as at step 1.
    assert max(busy) <= 2 * 4 and max(busy[-20:]) <= max(busy[:20]) + 2
    assert fmt.tokens_formatted == 2 * STEPS
    assert fmt.usage()["completion_tokens"] == 2 * STEPS

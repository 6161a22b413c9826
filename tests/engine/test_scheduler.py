"""Scheduler: budgets, chunked prefill, caps, preemption, n > 1 sharing, stops, aborts.

Torch-free. `PoolCheckingRunner` stands in for the model: it writes each computed
token into a fake KV pool through the block table and checks that every
position it reads back holds the right token (so prefix hits, forks and
preemption are verified end to end), then "samples" a token that is a fixed
function of the sequence so far.
"""
import pytest

from invariants import assert_pool_invariants, assert_seq_blocks
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import SampleOutput, Sequence, SequenceStatus

EOS = 2


class PoolCheckingRunner:
    def __init__(self, block_size):
        self.block_size = block_size
        self.kv = {}        # slot -> (position, token id)
        self.num_calls = 0

    @staticmethod
    def next_token(token_ids, sample_index):
        return (sum(token_ids) * 31 + len(token_ids) + 7 * sample_index) % 50 + 10

    def execute(self, batch):
        self.num_calls += 1
        outs = []
        bs = self.block_size
        for item in batch:
            seq = item.seq
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            assert len(seq.block_table) * bs >= end, "block table too short"
            for pos in range(start, end):
                self.kv[seq.block_table[pos // bs] * bs + pos % bs] = (pos, seq.token_ids[pos])
            for pos in range(end):   # attention reads the whole context through the table
                assert self.kv[seq.block_table[pos // bs] * bs + pos % bs] == (pos, seq.token_ids[pos])
            outs.append(SampleOutput(self.next_token(seq.token_ids, seq.sample_index)) if item.sample else None)
        return outs


def expected_tokens(prompt, n_out, sample_index=0):
    tokens = list(prompt)
    for _ in range(n_out):
        tokens.append(PoolCheckingRunner.next_token(tokens, sample_index))
    return tokens[len(prompt):]


def make(num_blocks=64, block_size=4, budget=64, max_num_seqs=8, max_model_len=256, caching=True):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    sched = Scheduler(kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                      max_model_len=max_model_len, eos_token_ids=[EOS])
    return sched, PoolCheckingRunner(block_size)


def add(sched, rid, prompt, n=1, salt=None, **params):
    p = SamplingParams(n=n, temperature=0, **params)
    seqs = [Sequence(rid, list(prompt), p, sample_index=i, cache_salt=salt) for i in range(n)]
    sched.add_request(seqs)
    return seqs


def step(sched, runner):
    batch = sched.schedule()
    plan = [(item.seq.request_id, item.seq.sample_index, item.num_new_tokens) for item in batch]
    live = [item.seq for item in batch]
    assert_seq_blocks(sched.kv.pool, sched.running + [s for s in sched.waiting if s.block_table])
    updates = sched.postprocess(batch, runner.execute(batch))
    assert_pool_invariants(sched.kv.pool)
    assert all(s.block_table == [] for s in live if s.status.finished)
    return plan, updates


def run(sched, runner, max_steps=500):
    plans = []
    while sched.has_unfinished():
        assert len(plans) < max_steps, "scheduler spins"
        plans.append(step(sched, runner)[0])
    assert_pool_invariants(sched.kv.pool, idle=True)
    return plans


def test_chunked_prefill_then_decode():
    sched, runner = make(budget=8)
    (seq,) = add(sched, "a", range(20), max_tokens=3)
    assert run(sched, runner) == [[("a", 0, 8)], [("a", 0, 8)], [("a", 0, 4)], [("a", 0, 1)], [("a", 0, 1)]]
    assert seq.output_token_ids == expected_tokens(range(20), 3)
    assert seq.status == SequenceStatus.FINISHED_LENGTH


def test_decodes_first_then_prefill_in_one_budget():
    sched, runner = make(budget=4)
    add(sched, "a", range(3), max_tokens=4)
    step(sched, runner)                        # a's prefill
    add(sched, "b", range(10, 20), max_tokens=2)
    plans = run(sched, runner)
    assert plans[:3] == [[("a", 0, 1), ("b", 0, 3)], [("a", 0, 1), ("b", 0, 3)], [("a", 0, 1), ("b", 0, 3)]]
    assert plans[3] == [("b", 0, 1)]


def test_max_num_seqs_cap():
    sched, runner = make(max_num_seqs=2)
    for rid in "abc":
        add(sched, rid, range(5), max_tokens=2)
    plan, _ = step(sched, runner)
    assert [p[0] for p in plan] == ["a", "b"] and sched.num_waiting == 1
    plan, _ = step(sched, runner)             # a, b finish here
    assert [p[0] for p in plan] == ["a", "b"]
    plan, _ = step(sched, runner)
    assert plan == [("c", 0, 1)]              # c's 5-token prompt: 4 cached, 1 computed


def test_prefix_hit_sets_cached_tokens():
    sched, runner = make()
    (a,) = add(sched, "a", range(10), max_tokens=1)
    run(sched, runner)
    (b,) = add(sched, "b", range(10), max_tokens=1)
    (c,) = add(sched, "c", range(10), max_tokens=1, salt="other-tenant")
    assert run(sched, runner) == [[("b", 0, 2), ("c", 0, 10)]]
    assert (a.num_cached_tokens, b.num_cached_tokens, c.num_cached_tokens) == (0, 8, 0)
    assert b.output_token_ids == a.output_token_ids
    assert (sched.kv.prefix_cache_queries, sched.kv.prefix_cache_hits) == (30, 8)


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_by_recompute_of_newest(caching):
    # 8 blocks of 4: a and b each need 5 blocks by the end, so b (newer) gets preempted.
    sched, runner = make(num_blocks=8, caching=caching)
    (a,) = add(sched, "a", range(8), max_tokens=12)
    (b,) = add(sched, "b", range(30, 38), max_tokens=12)
    plans = run(sched, runner)
    assert sched.num_preemptions >= 1
    assert a.output_token_ids == expected_tokens(range(8), 12)
    assert b.output_token_ids == expected_tokens(range(30, 38), 12)
    # a was never preempted: it decoded in every step after its prefill
    assert all(any(p[0] == "a" for p in plan) for plan in plans[:12])


def test_rejects_requests_that_can_never_fit():
    sched, _ = make(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        add(sched, "a", range(60), max_tokens=5)
    with pytest.raises(ValueError, match="shorter than max_model_len"):
        add(sched, "a", range(64), max_tokens=None)
    with pytest.raises(ValueError, match="needs 5 KV blocks but the pool has only 4"):
        add(sched, "a", range(10), max_tokens=8)
    with pytest.raises(ValueError, match="empty"):
        add(sched, "a", [], max_tokens=1)
    assert not sched.has_unfinished()
    add(sched, "ok", range(10), max_tokens=7)    # 16 KV tokens: exactly 4 blocks


def test_max_tokens_none_stops_at_pool_capacity():
    sched, runner = make(num_blocks=4, block_size=4, max_model_len=64)
    (a,) = add(sched, "a", range(5), max_tokens=None)
    run(sched, runner)
    assert a.num_tokens == 17 and a.status == SequenceStatus.FINISHED_LENGTH


@pytest.mark.parametrize("caching", [True, False])
def test_n_samples_share_prompt_blocks_allocated_once(caching):
    sched, runner = make(caching=caching)
    seqs = add(sched, "a", range(9), n=3, max_tokens=5)
    assert sched.num_waiting == 3
    plan, _ = step(sched, runner)
    assert plan == [("a", 0, 9)]              # sample 0 computes the prompt
    assert [s.block_table for s in seqs] == [[0, 1, 2], [0, 1], [0, 1]]
    plan, _ = step(sched, runner)
    assert plan == [("a", 0, 1), ("a", 1, 1), ("a", 2, 1)]   # each recomputes only its last prompt token
    tables = [s.block_table for s in seqs]
    assert tables == [[0, 1, 2], [0, 1, 3], [0, 1, 4]]
    assert [sched.kv.pool.blocks[i].ref_cnt for i in (0, 1)] == [3, 3]
    assert [s.num_cached_tokens for s in seqs] == [0, 8, 8]
    run(sched, runner)
    for s in seqs:
        assert s.output_token_ids == expected_tokens(range(9), 5, s.sample_index)


def test_stop_conditions():
    sched, runner = make()
    prompt = list(range(4))
    first = expected_tokens(prompt, 3)
    (eos,) = add(sched, "eos", prompt, max_tokens=8)
    runner.next_token = lambda tokens, i: EOS
    (ign,) = add(sched, "ign", prompt, max_tokens=3, ignore_eos=True)
    (mint,) = add(sched, "min", prompt, max_tokens=8, min_tokens=2)
    run(sched, runner)
    assert eos.output_token_ids == [EOS] and eos.status == SequenceStatus.FINISHED_STOPPED
    assert ign.output_token_ids == [EOS] * 3 and ign.status == SequenceStatus.FINISHED_LENGTH
    assert mint.output_token_ids == [EOS] * 2 and mint.status == SequenceStatus.FINISHED_STOPPED
    del runner.next_token
    (st,) = add(sched, "st", prompt, max_tokens=8, stop_token_ids=[first[1]])
    _, updates = step(sched, runner)
    _, updates = step(sched, runner)
    assert st.output_token_ids == first[:2] and updates[0].stop_reason == first[1]
    assert st.status == SequenceStatus.FINISHED_STOPPED
    assert_pool_invariants(sched.kv.pool, idle=True)


def test_abort_on_every_path_frees_once():
    sched, runner = make(max_num_seqs=1)
    (a,) = add(sched, "a", range(9), max_tokens=5)
    (b,) = add(sched, "b", range(9), max_tokens=5)
    c = add(sched, "c", range(9), n=2, max_tokens=5)
    step(sched, runner)
    assert a.status == SequenceStatus.RUNNING and b.status == SequenceStatus.WAITING
    for seq in (a, b, *c, a):
        sched.finish(seq, SequenceStatus.FINISHED_ABORTED)
    assert all(s.status == SequenceStatus.FINISHED_ABORTED for s in (a, b, *c))
    assert not sched.has_unfinished() and sched.num_waiting == 0
    assert_pool_invariants(sched.kv.pool, idle=True)


@pytest.mark.parametrize("seed", range(12))
def test_random_workload_keeps_invariants_and_exact_outputs(seed):
    """Random arrivals, shared prefixes, n > 1, aborts, tiny pools and budgets."""
    import random
    rng = random.Random(seed)
    caching = seed % 3 != 2
    sched, runner = make(num_blocks=rng.choice([6, 10, 24]), block_size=rng.choice([2, 4]),
                         budget=rng.choice([3, 8, 64]), max_num_seqs=rng.choice([1, 3, 8]), caching=caching)
    heads = [[rng.randrange(10, 60) for _ in range(rng.randrange(1, 9))] for _ in range(3)]
    requests, aborted = {}, set()
    for t in range(200):
        if t < 60 and rng.random() < 0.3:
            prompt = rng.choice(heads) + [rng.randrange(10, 60) for _ in range(rng.randrange(1, 6))]
            rid = f"r{t}"
            try:
                requests[rid] = add(sched, rid, prompt, n=rng.choice([1, 1, 2, 3]),
                                    max_tokens=rng.randrange(1, 6), salt=rng.choice([None, "x"]))
            except ValueError as e:
                assert "KV blocks" in str(e)
        if requests and rng.random() < 0.05:
            rid = rng.choice(sorted(requests))
            for s in requests[rid]:
                sched.finish(s, SequenceStatus.FINISHED_ABORTED)
            aborted.add(rid)
        if sched.has_unfinished():
            step(sched, runner)
    run(sched, runner)
    for rid, seqs in requests.items():
        for s in seqs:
            if rid in aborted and s.status == SequenceStatus.FINISHED_ABORTED:
                continue
            assert s.status == SequenceStatus.FINISHED_LENGTH
            assert s.output_token_ids == expected_tokens(s.prompt_token_ids, s.params.max_tokens, s.sample_index)


def test_idle_scheduler_releases_waiting_siblings_blocks_instead_of_stalling():
    sched, runner = make(num_blocks=4, block_size=4)
    kv = sched.kv
    parent, child = add(sched, "p", range(9), n=2, max_tokens=1)
    step(sched, runner)                       # parent prefills, forks child, finishes
    assert parent.status == SequenceStatus.FINISHED_LENGTH and child.block_table == [0, 1]
    (big,) = add(sched, "big", range(100, 112), max_tokens=1)    # 3 blocks; only 2 are free
    sched.waiting.remove(big)                 # put it ahead of the sibling: nothing is running
    sched.waiting.appendleft(big)
    assert list(sched.waiting) == [big, child] and kv.num_free_blocks == 2
    plan, _ = step(sched, runner)
    assert plan[0] == ("big", 0, 12) and child.block_table == [] and child.num_computed_tokens == 0
    run(sched, runner)
    assert child.output_token_ids == expected_tokens(range(9), 1, 1)

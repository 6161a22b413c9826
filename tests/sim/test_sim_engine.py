"""The simulated engine is the real engine's scheduler and pool under a clock:
same evictions, same events, and a gateway index fed by them that equals the pool."""
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import SampleOutput, Sequence
from pagedkube.gateway.routing.prefix_index import PrefixIndex

from sim.engine import EngineConfig, SimEngine, SimRequest
from sim.events import EventLoop
from sim.timing import PROFILES, TimeModel

# Prompts that share a 2-block prefix, then diverge; a pool of 10 blocks of 4
# tokens, so later requests evict earlier ones' blocks.
SHARED = list(range(100, 108))
PROMPTS = [SHARED + [200 + 10 * i + j for j in range(9)] for i in range(6)]
ANSWER = [7, 8, 9, 10, 11]


def reference(prompts, num_blocks=10, block_size=4):
    """The same requests, one at a time, straight through the engine's own classes."""
    events = []
    kv = KVCacheManager(num_blocks, block_size, event_sink=lambda t, h: events.append((t, list(h))))
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=1024)
    for i, prompt in enumerate(prompts):
        seq = Sequence(f"r{i}", list(prompt), SamplingParams(max_tokens=len(ANSWER), ignore_eos=True, temperature=0))
        sched.add_request([seq])
        while sched.has_unfinished():
            scheduled = sched.schedule()
            outs = [SampleOutput(ANSWER[s.seq.num_output_tokens]) if s.sample else None for s in scheduled]
            sched.postprocess(scheduled, outs)
    return events, kv


def simulated(prompts, num_blocks=10, block_size=4):
    loop = EventLoop()
    events, index = [], PrefixIndex()

    def feed(engine, batch):
        events.extend(batch)
        for t, hashes in batch:
            (index.stored if t == "stored" else index.removed)(engine.name, hashes, engine.engine_id)

    engine = SimEngine("e0", loop, EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4,
                                                max_num_batched_tokens=64, max_model_len=1024),
                       PROFILES["cpu"], feed)
    done = []
    queue = list(enumerate(prompts))

    def send_next(*_):
        if queue:
            i, prompt = queue.pop(0)
            engine.submit(SimRequest(f"r{i}", list(prompt), list(ANSWER), on_done=lambda t, c: (done.append(c),
                                                                                                   send_next())))
    send_next()
    loop.run()
    return events, engine, index, done


def test_the_simulated_pool_evicts_exactly_as_block_pool_does():
    ref_events, ref_kv = reference(PROMPTS)
    events, engine, index, cached = simulated(PROMPTS)
    assert events == ref_events
    assert any(t == "removed" for t, _ in events), "the pool was meant to evict"
    assert [b.block_id for b in engine.kv.pool.free_block_queue] == [b.block_id for b in ref_kv.pool.free_block_queue]
    assert engine.cached_hashes() == ref_kv.pool.cached_hashes()
    # The gateway's index, fed by the events, holds exactly what the pool holds.
    assert sorted(index._endpoints["e0"].hashes) == sorted(engine.cached_hashes())
    # Every request after the first hit the shared 2-block prefix while it was cached.
    assert cached[0] == 0 and cached[1] == 8
    assert (engine.kv.prefix_cache_hits, engine.kv.prefix_cache_queries) == (ref_kv.prefix_cache_hits,
                                                                             ref_kv.prefix_cache_queries)


def test_step_time_model():
    m = TimeModel("t", overhead_s=0.01, prefill_s_per_token=0.001, decode_s_per_seq=0.002)
    assert m.step_time(100, 3) == 0.01 + 0.1 + 0.006
    pooled = m.pooled(4)
    assert (pooled.overhead_s, pooled.prefill_s_per_token, pooled.decode_s_per_seq) == (0.01, 0.00025, 0.0005)
    for bad in ({"overhead_s": -1.0}, {"overhead_s": 0.0, "prefill_s_per_token": 0.0, "decode_s_per_seq": 0.0}):
        kwargs = {"overhead_s": 0.01, "prefill_s_per_token": 0.001, "decode_s_per_seq": 0.002, **bad}
        try:
            TimeModel("bad", **kwargs)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


def test_the_event_loop_orders_by_time_then_insertion():
    loop, seen = EventLoop(), []
    loop.at(2.0, seen.append, "c")
    loop.at(1.0, seen.append, "a")
    loop.at(1.0, seen.append, "b")
    loop.run()
    assert seen == ["a", "b", "c"] and loop.now == 2.0
    try:
        loop.at(1.0, seen.append, "late")
    except ValueError:
        pass
    else:
        raise AssertionError("an event in the past was accepted")

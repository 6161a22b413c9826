"""A deterministic discrete-event simulator of a serving fleet (bench/simulate.py).

It drives the project's real code under a simulated clock:

    gateway side  gateway/routing/* (PrefixIndex fed by cache events, HashRing,
                  BoundedLoad, PrefixPicker, the baselines, routing keys) and
                  gateway/endpoints.EndpointSet (own in-flight + other replicas'
                  scraped load), one set per gateway replica
    engine side   engine/kv_cache_manager.KVCacheManager (BlockPool, prefix
                  cache, LRU eviction, stored/removed events) and
                  engine/scheduler.Scheduler (continuous batching, max_num_seqs,
                  token budget, chunked prefill, preemption)

and simulates only what has no pure code: time (timing.py: a step's cost from
its prefill tokens and decode sequences), the network (feed delay, scrape
interval) and the users (workloads.py). The `cache_aware` policy of SGLang's /
vLLM's router is re-implemented in cache_aware.py, llm-d's endpoint picker in llmd.py.

    events.py      the event loop (a heap keyed by time, then insertion order)
    timing.py      step time model and its two profiles (this CPU, H100 8B)
    engine.py      one engine: the real Scheduler + KVCacheManager under the clock
    gateway.py     one gateway replica: the real EndpointSet, index and picker
    cache_aware.py the SGLang / vllm-router policy, per router replica
    llmd.py        llm-d's scorers (prefix, queue, KV-cache, lora-affinity), per router replica
    workloads.py   seeded token-level workloads (pet-care, ShareGPT-like, tenants)
    fleet.py       wires them together, runs a workload, returns a RunResult
"""

"""The simulator's LoRA workload: the simulated engine's slots are the LoRA manager's LRU
(loads counted exactly), llm-d's lora-affinity scores are its four tiers, and on a seeded
Zipf workload the default routing loads fewer adapters than llm-d's scoring and round-robin,
never fewer than the ideal (one engine with the fleet's slots)."""
from dataclasses import replace

from pagedkube.gateway.routing.adapters import AdapterSlots

from sim.engine import EngineConfig, SimEngine, SimRequest
from sim.events import EventLoop
from sim.fleet import FleetConfig, simulate
from sim.gateway import PolicySpec
from sim.llmd import lora_score
from sim.timing import PROFILES
from sim.workloads import WorkloadSpec, sessions


def test_the_simulated_slots_are_an_lru_of_max_loras():
    loop = EventLoop()
    engine = SimEngine("e0", loop, EngineConfig(num_blocks=64, block_size=4, max_loras=2, lora_load_s=0.5),
                       PROFILES["cpu"])
    order = ["a", "b", "a", "c", "b", None, "c"]
    queue = list(enumerate(order))

    def send_next(*_):
        if queue:
            i, name = queue.pop(0)
            engine.submit(SimRequest(f"r{i}", [1, 2, 3, 4, 5, i], [7, 8], lora_name=name, on_done=send_next))
    send_next()
    loop.run()
    # a, b loaded; a hit; c evicts b (a was used later); b evicts a; base; c hit
    assert (engine.stats.lora_loads, engine.stats.lora_requests, engine.stats.lora_hits) == (4, 6, 2)
    assert list(engine.slots) == ["b", "c"]
    assert engine.lora_slots() == AdapterSlots(2, frozenset("bc"))
    assert engine.stats.busy_s >= 4 * 0.5   # each load adds its time to its step


def test_llmd_lora_affinity_tiers():
    def slots(running="", waiting="", max_loras=2):
        return AdapterSlots(max_loras, frozenset(running), frozenset(running), frozenset(waiting))
    assert lora_score("a", slots(running="ab")) == 1.0
    assert lora_score("a", slots(running="b")) == 0.8           # room: 1 busy of 2
    assert lora_score("a", slots(running="b", waiting="a")) == 0.6
    assert lora_score("a", slots(running="bc")) == 0.0
    assert lora_score(None, slots()) == lora_score("a", None) == 0.0


def test_zipf_adapters_are_seeded_and_skewed():
    spec = WorkloadSpec(sessions=400, adapters=20, adapter_zipf=1.0)
    names = [s.lora_name for s in sessions(spec)]
    assert names == [s.lora_name for s in sessions(spec)]
    counts = {n: names.count(n) for n in set(names)}
    assert counts["adapter-01"] == max(counts.values()) and counts["adapter-01"] > 3 * counts.get("adapter-10", 0)
    # the same sessions as without adapters, each under one adapter
    plain = list(sessions(replace(spec, adapters=0)))
    assert [s.prompt(0) for s in plain] == [s.prompt(0) for s in sessions(spec)] and plain[0].lora_name is None


def test_adapter_loads_per_policy():
    fleet = FleetConfig(engines=8, engine=EngineConfig(num_blocks=512, max_loras=4))
    spec = WorkloadSpec(kind="petcare", sessions=120, rate=8.0, think_s=0.5, turns=(2, 4), answer_tokens=(8, 16),
                        adapters=30)
    runs = {name: simulate(fleet, spec, PolicySpec(name)) for name in ("ideal", "prefix", "llm-d", "round-robin")}
    loads = {name: r.adapter_loads for name, r in runs.items()}
    assert runs["prefix"].row() == simulate(fleet, spec, PolicySpec("prefix")).row()
    assert loads["ideal"] <= loads["prefix"] < loads["llm-d"] < loads["round-robin"], loads
    hits = {name: r.adapter_hit_rate for name, r in runs.items()}
    assert hits["prefix"] > hits["llm-d"] > hits["round-robin"], hits

"""Adapter affinity on real engines (docs/gateway.md "LoRA adapters"): 4 `pagedkube serve`
processes serve the same 12 adapters with 4 slots each (16 slots, no engine can hold all 12);
the official openai client selects adapters by `model` through the gateway. Each adapter is
loaded once, on an engine with a free slot, and every repeat lands where it is resident: no
further load (the engines' pagedkube_engine_lora_slot_loads_total). A round-robin gateway in
front of the same engines, sent the same repeats, loads exactly what an LRU of 4 slots per
engine predicts for its rotation: far more."""
from __future__ import annotations

import random
import time
from collections import OrderedDict

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from lora_adapters import trained_adapters
from pagedkube.builtin import builtin_model_dir

PROMPT = "My dog drinks a lot of water after a walk. Should I worry about it?"
MAX_LORAS = 4
SCRAPE_WAIT_S = 1.0   # five of the test gateway's 0.2 s scrapes: its view of the slots catches up


def slots_of(url: str) -> tuple[set[str], float]:
    """(resident adapters, slot loads so far) from one engine's /metrics."""
    resident, loads = set(), 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == "pagedkube_engine_lora_resident":
                resident.add(s.labels["lora_name"])
            elif s.name == "pagedkube_engine_lora_slot_loads_total":
                loads += s.value
    return resident, loads


def test_repeats_land_where_the_adapter_is_resident(processes, engine_model_args, wait_until):
    trained = trained_adapters("tiny", builtin_model_dir())
    # 12 adapters: the three trained ones, each under four names (a name is its own adapter to the
    # engine: its own slot and its own blocks)
    names = {f"{kind}-{i}": trained[kind] for kind in ("dogs", "cats", "diet") for i in range(4)}
    modules = [f"{name}={path}" for name, path in names.items()]
    engines = [processes.engine(*engine_model_args, "--enable-lora", "--max-lora-rank", "16", "--max-loras",
                                str(MAX_LORAS), "--max-cpu-loras", "12", "--lora-modules", *modules)
               for _ in range(4)]
    processes.wait_ready(*engines)
    urls = [e.url for e in engines]
    gw = processes.gateway(urls)
    processes.wait_ready(gw)
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120)
    wait_until(lambda: set(names) <= {m.id for m in c.models.list().data})
    assert {m.id for m in c.models.list().data} == set(names) | {"tiny"}

    def ask(client: openai.OpenAI, model: str) -> str:
        r = client.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0)
        assert r.parse().model == model
        return r.headers["x-pagedkube-endpoint"]

    def total_loads() -> float:
        return sum(slots_of(u)[1] for u in urls)

    # First request of each: a free slot somewhere, so nothing is evicted; one load each.
    for name in names:
        ask(c, name)
        time.sleep(SCRAPE_WAIT_S)
    held = {u: slots_of(u)[0] for u in urls}
    holder = {name: u for u, resident in held.items() for name in resident}
    assert sorted(n for resident in held.values() for n in resident) == sorted(names)   # each on one engine
    assert all(len(resident) <= MAX_LORAS for resident in held.values())
    assert total_loads() == len(names)

    # Repeats, in a seeded shuffle: every one lands on its adapter's engine; not one more load.
    repeats = [name for name in names for _ in range(3)]
    random.Random(31).shuffle(repeats)
    for name in repeats:
        assert ask(c, name) == holder[name], name
    assert total_loads() == len(names)

    # The same repeats through round-robin: engine i % 4 of the sorted list, each an LRU of 4 slots,
    # the least recently used first (the engine's order after the repeats above).
    rr = processes.gateway(urls, "--routing", "round-robin")
    processes.wait_ready(rr)
    rc = openai.OpenAI(base_url=f"{rr.url}/v1", api_key="unused", max_retries=0, timeout=120)
    wait_until(lambda: set(names) <= {m.id for m in rc.models.list().data})
    lru = {u: OrderedDict.fromkeys(sorted(held[u], key=lambda n: max(i for i, r in enumerate(repeats) if r == n)))
           for u in urls}
    expected = 0
    for i, name in enumerate(repeats):
        url = sorted(urls)[i % len(urls)]
        if name in lru[url]:
            lru[url].move_to_end(name)
        else:
            expected += 1
            if len(lru[url]) == MAX_LORAS:
                lru[url].popitem(last=False)
            lru[url][name] = None
        assert ask(rc, name) == url
    round_robin = total_loads() - len(names)
    print(f"loads: {len(names)} for all {len(names) + len(repeats)} requests through adapter affinity; "
          f"round-robin {round_robin:g} for the {len(repeats)} repeats")
    assert round_robin == expected and round_robin > 2 * len(names)

"""LoRA adapters through the gateway, real engines: the openai client selects an adapter by
`model`; a request goes only to engines that serve its adapter (their /v1/models), repeats
land where the adapter's blocks are (the gateway hashes the prompt with the adapter's name, as
the engine does), and /v1/models through the gateway lists every adapter with its parent."""
from __future__ import annotations

import httpx
import openai
import pytest

from lora_adapters import trained_adapters
from pagedkube.builtin import builtin_model_dir

PROMPT = "A dog needs a walk twice a day and fresh water at all times. " * 3 + "How much water does a puppy need?"


def test_adapters_route_to_the_engines_that_serve_them(processes, engine_model_args, wait_until):
    adapters = trained_adapters("tiny", builtin_model_dir())
    lora = ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2"]
    a = processes.engine(*engine_model_args, *lora, "--lora-modules", f"dogs={adapters['dogs']}",
                         f"diet={adapters['diet']}")
    b = processes.engine(*engine_model_args, *lora, "--lora-modules", f"cats={adapters['cats']}",
                         f"diet={adapters['diet']}")
    processes.wait_ready(a, b)
    gw = processes.gateway([a.url, b.url])
    processes.wait_ready(gw)
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120)
    wait_until(lambda: {"dogs", "cats", "diet"} <= {m.id for m in c.models.list().data})
    cards = {m.id: m for m in c.models.list().data}
    assert cards["dogs"].parent == cards["cats"].parent == "tiny" and cards["tiny"].parent is None

    def ask(model: str):
        r = c.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0)
        return r.headers["x-pagedkube-endpoint"], r.headers["x-pagedkube-route"], r.parse()

    for _ in range(3):
        assert ask("dogs")[0] == a.url                  # only engine a serves dogs
        assert ask("cats")[0] == b.url
    endpoint, _, first = ask("diet")                     # both serve diet: prefix affinity picks
    wait_until(lambda: httpx.get(endpoint + "/v1/cache/events", params={"after": 0}).json()["events"])
    again_endpoint, route, again = ask("diet")
    assert again_endpoint == endpoint and route == "affinity"
    assert again.usage.prompt_tokens_details.cached_tokens > 0 and again.model == "diet"


def test_an_adapter_loaded_at_run_time_answers_through_the_gateway_at_once(processes, engine_model_args,
                                                                           wait_until):
    """The gateway re-reads the engines' /v1/models when a request names a model it has not seen
    (it reads them every ~10 s otherwise), so an adapter that the gateway's own /v1/models
    already lists (read live) never answers 404 there."""
    adapters = trained_adapters("tiny", builtin_model_dir())
    engine = processes.engine(*engine_model_args, "--enable-lora", "--max-lora-rank", "16",
                              "--allow-runtime-lora-updating")
    processes.wait_ready(engine)
    gw = processes.gateway([engine.url])
    processes.wait_ready(gw)
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120)
    wait_until(lambda: c.completions.create(model="tiny", prompt="Hi", max_tokens=1).choices)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="cats", prompt=PROMPT, max_tokens=2, temperature=0)
    r = httpx.post(f"{engine.url}/v1/load_lora_adapter", json={"lora_name": "cats", "lora_path": str(adapters["cats"])},
                   timeout=60)
    assert r.status_code == 200, r.text
    reply = c.completions.create(model="cats", prompt=PROMPT, max_tokens=2, temperature=0)
    assert reply.model == "cats" and reply.choices[0].text

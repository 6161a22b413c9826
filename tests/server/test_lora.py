"""LoRA adapters through a real `pagedkube serve` process and the official openai client:
--lora-modules (both forms), `model` selecting an adapter, /v1/models with parent, the
adapter in every block hash (engine cache feed = pagedkube.hashing = the gateway's hasher),
runtime load/unload under a 256-client mixed load, vllm:lora_requests_info, and every kind
of bad adapter answered with a 400/404 while the engine keeps serving."""
from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import save_file

from .conftest import ServerProcess, metric_value
from lora_adapters import trained_adapters
from pagedkube import hashing
from pagedkube.builtin import builtin_model_dir
from pagedkube.gateway.routing.keys import routing_input
from pagedkube.tokenizer import Tokenizer

BASE = "tiny-base"
PROMPT = "A dog needs a walk twice a day and fresh water at all times. How much water does a puppy need?"
PROMPTS = ["My dog limps after a walk.", "The cat will not eat", "Is chocolate safe for a puppy?"]


@pytest.fixture(scope="module")
def adapters():
    return trained_adapters("tiny", builtin_model_dir())


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, adapters):
    cats = json.dumps({"name": "cats", "path": str(adapters["cats"]), "base_model_name": BASE})
    proc = ServerProcess(tmp_path_factory.mktemp("lora"), "--served-model-name", BASE, "--max-model-len", "512",
                         "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--max-lora-rank", "16",
                         "--lora-modules", f"dogs={adapters['dogs']}", cats, "--allow-runtime-lora-updating",
                         name="lora").start()
    yield proc
    proc.stop()


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def load(server, name: str, path) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
                      timeout=60)


def unload(server, name: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_models_list_adapters_with_their_parent(lora_server, adapters):
    cards = {m.id: m for m in client_of(lora_server).models.list().data}
    assert list(cards)[:3] == [BASE, "dogs", "cats"]
    assert cards[BASE].parent is None
    assert (cards["dogs"].parent, cards["dogs"].root) == (BASE, str(adapters["dogs"]))
    assert cards["cats"].parent == BASE
    assert client_of(lora_server).models.retrieve("dogs").parent == BASE


def test_model_selects_the_adapter(lora_server):
    c = client_of(lora_server)
    texts = {}
    for model in (BASE, "dogs", "cats"):
        r = c.completions.create(model=model, prompt=PROMPTS[0], max_tokens=8, temperature=0)
        assert r.model == model and r.usage.completion_tokens == 8
        texts[model] = r.choices[0].text
    assert texts["dogs"] != texts[BASE] and texts["cats"] != texts[BASE] and texts["dogs"] != texts["cats"]
    chat = c.chat.completions.create(model="dogs", messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=4)
    assert chat.model == "dogs"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)


def test_no_cross_adapter_prefix_hit(lora_server):
    c = client_of(lora_server)
    prompt = "Cats sleep most of the day. " * 3 + PROMPT
    first = {}
    for model in ("dogs", "cats", BASE):
        r = c.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
        first[model] = r.usage.prompt_tokens_details.cached_tokens
    assert first == {"dogs": 0, "cats": 0, BASE: 0}
    full = {}
    for model in ("dogs", "cats", BASE):
        r = c.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
        full[model] = r.usage.prompt_tokens_details.cached_tokens
    num_prompt = r.usage.prompt_tokens
    assert full == dict.fromkeys(("dogs", "cats", BASE), (num_prompt - 1) // 16 * 16)   # every full block


def test_feed_hashes_equal_the_gateways_for_an_adapter(lora_server):
    """The engine's stored hashes of an adapter's prompt are pagedkube.hashing's with the adapter's
    name, and the gateway's routing keys compute the same chain (base hashes differ)."""
    c = client_of(lora_server)
    prompt = "Fresh water matters more than any food in hot weather. " * 3
    c.completions.create(model="cats", prompt=prompt, max_tokens=1)
    tokenizer = Tokenizer(httpx.get(lora_server.url + "/v1/cache/tokenizer").json()["files"])
    ids = tokenizer.encode(prompt)
    expected = hashing.block_hashes(ids, 16, lora_name="cats")
    held = set()
    for ev in httpx.get(lora_server.url + "/v1/cache/events", params={"after": 0}).json()["events"]:
        held |= set(ev["block_hashes"]) if ev["type"] == "stored" else set()
    assert set(hashing.to_hex(expected)) <= held
    gateway = routing_input(ids, None, block_size=16, seed="", ring_key_blocks=256, cache_salt=None, lora_name="cats")
    assert list(gateway.block_hashes) == expected
    assert not set(expected) & set(hashing.block_hashes(ids, 16))
    assert not set(expected) & set(hashing.block_hashes(ids, 16, lora_name="dogs"))


def test_lora_metrics(lora_server):
    """vLLM's info gauge; ours: the adapters in the two slots, and slot loads, which a repeat does not add to."""
    c = client_of(lora_server)

    def ask(*models: str) -> str:
        for model in models:
            c.completions.create(model=model, prompt=PROMPTS[0], max_tokens=1, temperature=0)
        return httpx.get(lora_server.url + "/metrics").text

    text = ask("dogs", "cats")
    assert metric_value(text, "vllm:lora_requests_info", max_lora="2", running_lora_adapters="",
                        waiting_lora_adapters="") > 1e9
    resident = {s.labels["lora_name"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "pagedkube_engine_lora_resident"}
    assert resident == {"dogs": 1.0, "cats": 1.0}
    loads = metric_value(text, "pagedkube_engine_lora_slot_loads_total", model_name=BASE)
    assert loads >= 2
    again = ask("cats", "dogs", BASE, "dogs")
    assert metric_value(again, "pagedkube_engine_lora_slot_loads_total", model_name=BASE) == loads


@pytest.fixture(scope="module")
def bad_adapters(tmp_path_factory, adapters):
    """One broken adapter per failure the server must name (from the real `cats` adapter)."""
    root = tmp_path_factory.mktemp("bad")
    good = adapters["cats"]
    weights = "adapter_model.safetensors"
    out = {}

    def copy(name):
        shutil.copytree(good, root / name)
        return root / name

    out["corrupt"] = copy("corrupt")
    (out["corrupt"] / weights).write_bytes(b"\x00\x01not a safetensors file")
    out["bad-config"] = copy("bad-config")
    (out["bad-config"] / "adapter_config.json").write_text("{not json")
    out["no-config"] = copy("no-config")
    (out["no-config"] / "adapter_config.json").unlink()
    out["pickled"] = copy("pickled")
    (out["pickled"] / weights).rename(out["pickled"] / "adapter_model.bin")
    out["rank-32"] = copy("rank-32")
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(32, 128),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(128, 32)},
              out["rank-32"] / weights)
    out["other-model"] = copy("other-model")          # hidden 256: an adapter of a bigger model
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 256),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(256, 8)},
              out["other-model"] / weights)
    out["lm-head"] = copy("lm-head")                  # a target the decoder does not adapt
    save_file({"base_model.model.lm_head.lora_A.weight": torch.zeros(8, 128),
               "base_model.model.lm_head.lora_B.weight": torch.zeros(1980, 8)}, out["lm-head"] / weights)
    out["layer-9"] = copy("layer-9")
    save_file({"base_model.model.model.layers.9.mlp.up_proj.lora_A.weight": torch.zeros(8, 128),
               "base_model.model.model.layers.9.mlp.up_proj.lora_B.weight": torch.zeros(384, 8)},
              out["layer-9"] / weights)
    return out


@pytest.mark.parametrize("kind, status, message", [
    ("missing", 404, "is not a directory"),
    ("corrupt", 400, "not a readable safetensors file"),
    ("bad-config", 400, "not valid JSON"),
    ("no-config", 400, "no adapter_config.json"),
    ("pickled", 400, "pickled adapter_model.bin is refused"),
    ("rank-32", 400, "rank 32 of model.layers.0.self_attn.q_proj is above --max-lora-rank 16"),
    ("other-model", 400, "do not fit the model's q_proj"),
    ("lm-head", 400, "is not a LoRA weight of a decoder projection"),
    ("layer-9", 400, "is for layer 9, the model has 4"),
])
def test_bad_adapters_are_refused_and_the_engine_keeps_serving(lora_server, bad_adapters, tmp_path, kind, status,
                                                               message):
    path = bad_adapters.get(kind, tmp_path / "nowhere")
    r = load(lora_server, f"bad-{kind}", path)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    assert f"bad-{kind}" not in {m.id for m in client_of(lora_server).models.list().data}
    ok = client_of(lora_server).completions.create(model="dogs", prompt="hi", max_tokens=2,
                                                   extra_body={"ignore_eos": True})
    assert ok.usage.completion_tokens == 2


def test_load_and_unload_answer_as_vllm(lora_server, adapters):
    assert load(lora_server, "dogs", adapters["dogs"]).status_code == 400        # already loaded
    assert load(lora_server, BASE, adapters["dogs"]).status_code == 400          # the base model's name
    r = httpx.post(f"{lora_server.url}/v1/load_lora_adapter", json={"lora_name": "x"})
    assert r.status_code == 400 and "Both 'lora_name' and 'lora_path'" in r.json()["error"]["message"]
    r = unload(lora_server, "never-loaded")
    assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
    r = load(lora_server, "diet-once", adapters["diet"])
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'diet-once' added successfully.")
    assert unload(lora_server, "diet-once").text == "Success: LoRA adapter 'diet-once' removed successfully."
    r = load(lora_server, "diet-once", adapters["cats"])     # the name's cached blocks are diet's
    assert r.status_code == 400 and "need a new name" in r.json()["error"]["message"]
    assert load(lora_server, "diet-once", adapters["diet"]).status_code == 200   # the same weights again
    assert unload(lora_server, "diet-once").status_code == 200


def test_runtime_endpoints_are_off_by_default(server):
    r = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/tmp"})
    assert r.status_code == 404


def test_load_and_unload_under_256_mixed_clients(lora_server, adapters):
    """256 concurrent clients over the base model and three adapters; meanwhile `diet` is loaded
    and `cats` unloaded while its requests run. Every request ends: those for `cats` already in
    the server finish with their full answer, the ones sent after the unload returned get 404,
    and nothing else fails."""
    url = lora_server.url
    assert load(lora_server, "diet", adapters["diet"]).status_code == 200

    async def main():
        c = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        unloaded = asyncio.Event()
        outcomes: list[tuple[str, str, bool]] = []

        async def one(i: int):
            model = (BASE, "dogs", "cats", "diet")[i % 4]
            after = unloaded.is_set()
            max_tokens = 48 if model == "cats" else 6   # cats runs long enough to be seen running
            try:
                r = await c.completions.create(model=model, prompt=PROMPTS[i % 3], max_tokens=max_tokens,
                                               temperature=0, extra_body={"ignore_eos": True})
                assert r.usage.completion_tokens == max_tokens and r.model == model
                outcomes.append(("ok", model, after))
            except openai.NotFoundError:
                outcomes.append(("404", model, after))

        async def admin():
            async with httpx.AsyncClient(timeout=60) as h:
                while "cats" not in (await h.get(f"{url}/metrics")).text.split("running_lora_adapters=")[1] \
                        .split(",waiting")[0]:
                    assert not first.done(), "the cats requests ended before the server reported them running"
                    await asyncio.sleep(0.02)
                r = await h.post(f"{url}/v1/load_lora_adapter",
                                 json={"lora_name": "fresh", "lora_path": str(adapters["dogs"])})
                assert r.status_code == 200
                r = await h.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "cats"})
                assert r.status_code == 200
                unloaded.set()
                late = await asyncio.gather(*(one(1000 + 4 * k + 2) for k in range(16)))   # cats, after the unload
                fresh = await c.completions.create(model="fresh", prompt=PROMPTS[0], max_tokens=3,
                                                   extra_body={"ignore_eos": True})
                assert fresh.usage.completion_tokens == 3
                return late

        first = asyncio.gather(*(one(i) for i in range(256)))
        await asyncio.wait_for(asyncio.gather(admin(), first), timeout=600)
        await c.close()
        return outcomes

    outcomes = asyncio.run(main())
    assert len(outcomes) == 256 + 16                                          # nothing hangs
    failed = [o for o in outcomes if o[0] != "ok" and o[1] != "cats"]
    assert failed == []                                                       # nothing else fails
    cats = [o for o in outcomes if o[1] == "cats"]
    assert all(o[0] == "404" for o in cats if o[2])                           # after the unload returned
    assert sum(o[0] == "ok" for o in cats) > 0                                # in flight then: finished
    assert "cats" not in {m.id for m in client_of(lora_server).models.list().data}
    assert unload(lora_server, "fresh").status_code == 200

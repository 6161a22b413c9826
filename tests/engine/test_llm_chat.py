"""The vLLM-shaped offline API: `from pagedkube import LLM, SamplingParams` (torch-free until
used), LLM.chat, which is generate on the chat template's rendering, and logprobs as vLLM's
Logprob."""
from __future__ import annotations

import bisect
import subprocess
import sys

import pytest

from pagedkube.tokenizer import Tokenizer

CONVERSATION = [{"role": "system", "content": "You are a vet's assistant."},
                {"role": "user", "content": "My puppy eats grass. Is that bad?"}]


def test_import_from_the_root_package_is_torch_free_until_used():
    code = ("import sys, pagedkube; assert 'torch' not in sys.modules; "
            "from pagedkube import LLM, SamplingParams; assert 'torch' not in sys.modules; "
            "from pagedkube.engine.llm import LLM as L; assert LLM is L; print('ok')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "ok\n"


def test_chat_equals_generate_on_the_rendered_template():
    from pagedkube import LLM, SamplingParams

    llm = LLM("builtin://tiny", device="cpu", dtype="float32", max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=12)
    tokenizer: Tokenizer = llm.get_tokenizer()
    text = tokenizer.render_chat(CONVERSATION, True)
    by_hand = llm.generate([tokenizer.encode(text, add_special_tokens=False)], params)[0]
    [chat] = llm.chat(CONVERSATION, params)
    assert chat.outputs[0].token_ids == by_hand.outputs[0].token_ids and chat.prompt == text
    second = [{"role": "user", "content": "And chocolate?"}]
    batch = llm.chat([CONVERSATION, second], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in batch][0] == by_hand.outputs[0].token_ids
    assert batch[1].prompt == tokenizer.render_chat(second, True)


def test_the_tokenizer_applies_chat_templates_with_transformers_signature():
    from transformers import AutoTokenizer

    from pagedkube.builtin import builtin_model_dir

    ours = Tokenizer.from_pretrained(builtin_model_dir("tiny"))
    theirs = AutoTokenizer.from_pretrained(builtin_model_dir("tiny"))
    for kwargs in ({}, {"add_generation_prompt": True}, {"tokenize": False}, {"tokenize": False,
                                                                               "add_generation_prompt": True}):
        reference = theirs.apply_chat_template(CONVERSATION, **kwargs)
        if isinstance(reference, dict) or hasattr(reference, "input_ids"):   # transformers 5: return_dict
            reference = reference["input_ids"]
        assert ours.apply_chat_template(CONVERSATION, **kwargs) == reference


def test_logprobs_in_vllms_shape():
    """CompletionOutput.logprobs is vLLM's list of {token id: Logprob(logprob, rank, decoded_token)}:
    with every token of the vocabulary asked for, each rank is the token's place in the whole
    distribution, the sampled token's included, even when sampling picked an unlikely one."""
    from pagedkube import LLM, SamplingParams
    from pagedkube.engine import Logprob

    llm = LLM("builtin://tiny", device="cpu", dtype="float32", max_model_len=512)
    vocab = llm.engine.vocab_size
    out = llm.generate(["Good dogs sit when asked."], SamplingParams(temperature=5.0, seed=3, max_tokens=6,
                                                                        logprobs=vocab))[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 6
    tokenizer = llm.get_tokenizer()
    sampled_ranks = []
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert len(entry) == vocab and next(iter(entry)) == token_id
        assert all(isinstance(lp, Logprob) for lp in entry.values())
        ascending = sorted(lp.logprob for lp in entry.values())
        for t, lp in entry.items():    # 1 + the tokens likelier than it (tied ones in any order)
            likelier = vocab - bisect.bisect_right(ascending, lp.logprob)
            tied = bisect.bisect_right(ascending, lp.logprob) - bisect.bisect_left(ascending, lp.logprob)
            assert likelier + 1 <= lp.rank <= likelier + tied if t != token_id else lp.rank == likelier + 1
        assert entry[token_id].decoded_token == tokenizer.decode([token_id], skip_special_tokens=False)
        sampled_ranks.append(entry[token_id].rank)
    assert max(sampled_ranks) > 1          # temperature 5 sampled some unlikely tokens: ranks beyond 1

    few = llm.generate(["Good dogs sit when asked."], SamplingParams(temperature=5.0, seed=3, max_tokens=6,
                                                                        logprobs=2))[0].outputs[0]
    assert few.token_ids == out.token_ids
    for entry, full in zip(few.logprobs, out.logprobs):
        assert all(lp.rank == full[t].rank and lp.logprob == pytest.approx(full[t].logprob) for t, lp in entry.items())

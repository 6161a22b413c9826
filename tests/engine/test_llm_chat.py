"""The vLLM-shaped offline API: `from pagedkube import LLM, SamplingParams` (torch-free until
used) and LLM.chat, which is generate on the chat template's rendering."""
from __future__ import annotations

import subprocess
import sys

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

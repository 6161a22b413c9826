"""Batched multi-LoRA on the real default model, SmolLM2-135M-Instruct, against transformers +
peft in float32, token for token: three adapters trained with peft on slices of the pet-care
corpus (tests/helpers/lora_adapters.py, cached), mixed with base-model requests in one batch,
with chunked prefill and with preemption. test_lora_vs_hf.py runs the same on builtin://tiny."""
from __future__ import annotations

import pytest

from default_model import require_default_model
from lora_adapters import (MAX_NEW, PROMPT_TEXTS, hf_expected, load_tokenizer, mixed_batch, requests_of,
                           trained_adapters)
from pagedkube.engine import LLM, SamplingParams
from pagedkube.model_source import DEFAULT_MODEL, resolve_model_source

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
require_default_model()
SCENARIOS = {
    "chunked-prefill": dict(num_kv_blocks=256, max_num_batched_tokens=8),
    "preemption": dict(num_kv_blocks=12, max_num_batched_tokens=64),
}


@pytest.fixture(scope="module")
def smollm2_case():
    gguf = resolve_model_source(DEFAULT_MODEL).path
    adapters = trained_adapters("smollm2", gguf)
    tok = load_tokenizer(gguf)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in PROMPT_TEXTS]
    return adapters, prompts, hf_expected("smollm2", gguf, adapters, prompts)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_mixed_adapter_batch_matches_peft_on_smollm2(smollm2_case, scenario):
    adapters, prompts, expected = smollm2_case
    llm = LLM(device="cpu", dtype="float32", block_size=4, attention_backend="torch", quantization="none",
              max_model_len=256, enable_lora=True, max_loras=3, max_lora_rank=16, **SCENARIOS[scenario])
    items, batch_prompts, batch_loras = mixed_batch(prompts, requests_of(adapters))
    outs = llm.generate(batch_prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
                        lora_request=batch_loras)
    got = {(key, tuple(p)): o.outputs[0].token_ids for (key, p), o in zip(items, outs)}
    assert got == {k: expected[k] for k in got}
    if scenario == "preemption":
        assert llm.engine.stats().num_preemptions > 0


def test_each_adapter_answers_differently_on_smollm2(smollm2_case):
    adapters, prompts, expected = smollm2_case
    for name in adapters:
        assert any(expected[(name, tuple(p))] != expected[(None, tuple(p))] for p in prompts), name

"""Batched multi-LoRA against Hugging Face + peft, token for token, greedy, float32.

Three real adapters (tests/helpers/lora_adapters.py: trained with peft on three slices of
a pet-care corpus; different ranks, target sets, rsLoRA, rank/alpha patterns) and the
base model answer the same prompts in ONE engine batch, under a token budget that chunks
every prefill and, in another scenario, a pool small enough to preempt. With max_loras=2
and three adapters the scheduler must pass adapters over and the slots must be reused.
The reference is PeftModel.from_pretrained + generate, one prompt at a time (lora_adapters.hf_expected).
"""
from __future__ import annotations

import pytest

from invariants import assert_pool_invariants
from lora_adapters import (CORPUS, MAX_NEW, PROMPT_TEXTS, hf_expected, load_tokenizer, mixed_batch,
                           requests_of, trained_adapters)
from pagedkube.builtin import builtin_model_dir
from pagedkube.engine import LLM, SamplingParams

SCENARIOS = {
    "chunked-prefill": dict(num_kv_blocks=128, max_num_batched_tokens=7),
    "preemption": dict(num_kv_blocks=14, max_num_batched_tokens=64),
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_case():
    base = builtin_model_dir()
    adapters = trained_adapters("tiny", base)
    tok = load_tokenizer(base)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in PROMPT_TEXTS]
    return base, adapters, prompts, hf_expected("tiny", base, adapters, prompts)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_mixed_adapter_batch_matches_peft(tiny_case, scenario):
    base, adapters, prompts, expected = tiny_case
    llm = LLM(str(base), device="cpu", dtype="float32", block_size=4, attention_backend="torch",
              enable_lora=True, max_loras=2, max_cpu_loras=3, max_lora_rank=16, **SCENARIOS[scenario])
    engine = llm.engine
    step_adapters, schedule = [], engine.scheduler.schedule

    def logged_schedule():
        batch = schedule()
        step_adapters.append({item.seq.lora_name for item in batch} - {None})
        return batch

    engine.scheduler.schedule = logged_schedule
    loras = requests_of(adapters)
    items, batch_prompts, batch_loras = mixed_batch(prompts, loras)
    outs = llm.generate(batch_prompts, GREEDY, lora_request=batch_loras)
    got = {(key, tuple(p)): o.outputs[0].token_ids for (key, p), o in zip(items, outs)}
    assert got == {k: expected[k] for k in got}
    stats = llm.engine.stats()
    if scenario == "preemption":
        assert stats.num_preemptions > 0
    assert max(len(a) for a in step_adapters) == 2                  # never more adapters than slots
    assert len(set().union(*step_adapters)) == 3 and stats.num_lora_slot_loads >= 3
    assert_pool_invariants(llm.engine.kv_manager.pool, idle=True)


def test_each_adapter_answers_differently_from_the_base(tiny_case):
    _, adapters, prompts, expected = tiny_case
    for name in adapters:
        differ = [p for p in prompts if expected[(name, tuple(p))] != expected[(None, tuple(p))]]
        assert differ, f"adapter {name} answers every prompt as the base model does"
    assert set(CORPUS) == set(adapters)

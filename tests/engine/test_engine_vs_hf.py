"""The whole engine (LLM -> scheduler -> pool -> runner) against Hugging Face greedy
generate, token for token in float32, for every supported family.

Each scenario squeezes a different part: a tiny token budget forces chunked
prefill, a tiny pool forces preemption, the prefix cache is on or off. The
allocator invariants are asserted after every engine step.

Once more with --quantization int4 (one family, llama: GQA and an untied lm_head): the
packed weights are not Hugging Face's, so there the expected tokens are the engine's
own, each prompt run alone with the whole prompt in one step and no prefix cache; every
scenario must reproduce them exactly as the float engine reproduces Hugging Face's.
"""
from __future__ import annotations

import random

import pytest
import torch

from invariants import assert_pool_invariants, assert_seq_blocks
from model_factory import FAMILIES, load_hf_model, make_tiny_model
from pagedkube.engine import LLM, SamplingParams

BLOCK_SIZE = 4
MAX_NEW = 8
_rng = random.Random(0)
SHARED = [_rng.randrange(3, 500) for _ in range(12)]
PROMPTS = [
    [_rng.randrange(3, 500) for _ in range(3)],
    SHARED + [_rng.randrange(3, 500) for _ in range(8)],     # 20 tokens
    [_rng.randrange(3, 500) for _ in range(9)],
    SHARED + [_rng.randrange(3, 500) for _ in range(5)],     # 17 tokens, same first 3 blocks
]
SCENARIOS = {
    "plain": dict(num_kv_blocks=64),
    "chunked-prefill": dict(num_kv_blocks=64, max_num_batched_tokens=5),
    "preemption": dict(num_kv_blocks=10),
    "no-prefix-cache": dict(num_kv_blocks=64, enable_prefix_caching=False),
}


# (family, quantization): every family in float, and llama once more with int4 weights
CASES = [(family, "none") for family in FAMILIES] + [("llama", "int4")]


@pytest.fixture(scope="module", params=CASES, ids=[f if q == "none" else f"{f}-{q}" for f, q in CASES])
def family_model(request, tmp_path_factory):
    """(model dir, quantization, greedy continuation of each prompt: HF's, or the engine's alone)."""
    family, quantization = request.param
    path = make_tiny_model(family, tmp_path_factory.mktemp(family))
    expected = {}
    if quantization != "none":
        for prompt in PROMPTS:
            alone = LLM(str(path), device="cpu", dtype="float32", block_size=BLOCK_SIZE, attention_backend="torch",
                        num_kv_blocks=64, enable_prefix_caching=False, quantization=quantization)
            expected[tuple(prompt)] = alone.generate([prompt], GREEDY)[0].outputs[0].token_ids
        return path, quantization, expected
    hf = load_hf_model(path)
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
            expected[tuple(prompt)] = out[0, len(prompt):].tolist()
    return path, quantization, expected


def checked_llm(path, quantization: str, **kwargs) -> LLM:
    """An LLM whose every step asserts the allocator invariants and logs its batch."""
    llm = LLM(str(path), device="cpu", dtype="float32", block_size=BLOCK_SIZE, attention_backend="torch",
              quantization=quantization, **kwargs)
    if quantization != "none":
        kernels = {m.kernel.name for m in llm.engine.runner.model.modules() if hasattr(m, "kernel")}
        assert kernels == {"int4pack"}, kernels                 # really the packed weights
    engine = llm.engine
    engine.batches = []
    schedule, step = engine.scheduler.schedule, engine.step

    def logged_schedule():
        batch = schedule()
        engine.batches.append([(item.seq.request_id, item.num_new_tokens, item.sample) for item in batch])
        return batch

    def checked_step():
        outputs = step()
        pool = engine.kv_manager.pool
        holders = engine.scheduler.running + [s for s in engine.scheduler.waiting if s.block_table]
        assert_seq_blocks(pool, holders)
        assert_pool_invariants(pool, idle=not engine.has_unfinished_requests())
        return outputs

    engine.scheduler.schedule, engine.step = logged_schedule, checked_step
    return llm


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_batch_matches_hf(family_model, scenario):
    path, quantization, expected = family_model
    llm = checked_llm(path, quantization, **SCENARIOS[scenario])
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == expected[tuple(prompt)]
        assert out.outputs[0].finish_reason == "length"
    stats = llm.engine.stats()
    if scenario == "chunked-prefill":
        assert any(not sample for batch in llm.engine.batches for _, _, sample in batch)
        assert all(sum(n for _, n, _ in batch) <= 5 for batch in llm.engine.batches)
    if scenario == "preemption":
        assert stats.num_preemptions > 0
    if scenario == "no-prefix-cache":
        assert stats.prefix_cache_hits == 0
    # the same prompts again: the cache serves their full blocks, outputs unchanged
    again = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]
    cached = [o.num_cached_tokens for o in again]
    if scenario == "no-prefix-cache":
        assert cached == [0, 0, 0, 0]
    elif scenario != "preemption":   # the small pool evicts some of them
        assert cached == [0, 16, 8, 16]
    assert llm.engine.kv_manager.num_free_blocks == SCENARIOS[scenario]["num_kv_blocks"]


def test_shared_prefix_hit_and_n_samples(family_model):
    path, quantization, expected = family_model
    llm = checked_llm(path, quantization, num_kv_blocks=64)
    first = llm.generate([PROMPTS[1]], GREEDY)[0]
    second = llm.generate([PROMPTS[3]], SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, n=2))[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 12   # SHARED = 3 blocks
    assert [c.token_ids for c in second.outputs] == [expected[tuple(PROMPTS[3])]] * 2

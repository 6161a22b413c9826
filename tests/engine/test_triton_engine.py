"""The model runner with the Triton attention backend against Hugging Face, in float32.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), so the
whole CUDA attention path of the engine (metadata the runner builds, write_kv,
paged_attention through block tables, chunked prefill mixed with decode)
is checked here without a GPU; on a GPU machine the same test runs compiled.
"""
from __future__ import annotations

import random

import pytest
import torch

from model_factory import load_hf_model, make_tiny_model
from pagedkube.engine.config import EngineConfig
from pagedkube.engine.model_runner import ModelRunner
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.sequence import ScheduledSeq, Sequence

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_BLOCKS = 48
# (family, overrides, block size): head_dim 16 with GQA 2 (the factory's qwen2), and
# head_dim 80 (padded to 128 in the kernel) with GQA 4 and 8-token blocks.
VARIANTS = {
    "qwen2-d16": ("qwen2", {}, 16),
    "llama-d80-gqa4": ("llama", dict(hidden_size=320, num_attention_heads=4, num_key_value_heads=1), 8),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    family, overrides, block_size = VARIANTS[request.param]
    path = make_tiny_model(family, tmp_path_factory.mktemp(request.param), **overrides)
    runner = ModelRunner(EngineConfig(model=str(path), device=DEVICE, dtype="float32", attention_backend="triton",
                                      block_size=block_size, num_kv_blocks=NUM_BLOCKS, max_num_seqs=4))
    assert runner.backend.__name__ == "pagedkube.engine.attention.triton_backend"
    return path, runner, load_hf_model(path).to(DEVICE)


def make_seq(name, token_ids, block_table):
    return Sequence(request_id=name, prompt_token_ids=token_ids, params=SamplingParams(temperature=0.0),
                    block_table=block_table)


def step_logits(runner, batch):
    step = runner.prepare(batch)
    with torch.inference_mode():
        hidden = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        logits = runner.model.compute_logits(hidden)
    return list(logits.split([item.num_new_tokens for item in batch]))


def test_triton_runner_logits_match_hf_chunked_mixed(variant):
    path, runner, hf = variant
    bs = runner.block_size
    rng = random.Random(1)
    vocab = runner.model_config.vocab_size
    blocks = rng.sample(range(NUM_BLOCKS), NUM_BLOCKS)
    lengths = {"a": 2 * bs + 3, "b": 5, "c": 3 * bs - 1}
    seqs = {n: make_seq(n, [rng.randrange(vocab) for _ in range(k)], [blocks.pop() for _ in range(-(-(k + 1) // bs))])
            for n, k in lengths.items()}
    a, b, c = seqs["a"], seqs["b"], seqs["c"]
    got = {n: [] for n in seqs}
    first = [ScheduledSeq(a, bs + 1), ScheduledSeq(b, 5), ScheduledSeq(c, 7)]       # prefill chunks
    for item, logits in zip(first, step_logits(runner, first)):
        got[item.seq.request_id].append(logits)
        item.seq.num_computed_tokens += item.num_new_tokens
    b.append_token(int(got["b"][0][-1].argmax()))
    second = [ScheduledSeq(c, lengths["c"] - 7), ScheduledSeq(b, 1), ScheduledSeq(a, lengths["a"] - bs - 1)]
    for item, logits in zip(second, step_logits(runner, second)):                   # mixed: decode + chunks
        got[item.seq.request_id].append(logits)
    for name, seq in seqs.items():
        with torch.inference_mode():
            expected = hf(torch.tensor([seq.token_ids], device=DEVICE)).logits[0]
        torch.testing.assert_close(torch.cat(got[name]), expected, atol=1e-4, rtol=1e-4)


def test_triton_runner_greedy_matches_hf_generate(variant):
    path, runner, hf = variant
    prompts = [[5, 17, 33, 9, 101, 7, 250, 3, 11, 12, 13, 14, 15, 16, 17, 18, 19], [44, 2, 90], [300, 301, 302]]
    free = list(range(NUM_BLOCKS))
    seqs = [make_seq(f"g{i}", p, []) for i, p in enumerate(prompts)]
    max_new = 5
    for _ in range(max_new):
        batch = [ScheduledSeq(s, s.num_tokens - s.num_computed_tokens) for s in seqs]
        for s in seqs:
            while len(s.block_table) * runner.block_size < s.num_tokens:
                s.block_table.append(free.pop())
        for item, out in zip(batch, runner.execute(batch)):
            item.seq.num_computed_tokens += item.num_new_tokens
            item.seq.append_token(out.token_id)
    for s, prompt in zip(seqs, prompts):
        with torch.inference_mode():
            expected = hf.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=max_new, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert s.output_token_ids == expected


def test_triton_llm_generate_matches_hf_cold_and_cached(tmp_path):
    """LLM.generate end to end on the Triton backend: chunked prefill (16-token budget) mixed
    with decodes, then the same prompts again served from the prefix cache."""
    from pagedkube.engine import LLM, SamplingParams
    path = make_tiny_model("qwen2", tmp_path / "qwen2")
    hf = load_hf_model(path).to(DEVICE)
    shared = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
    prompts = [shared + [40, 41, 42], shared + [50], [300, 301, 302, 303, 304]]
    max_new = 4
    with torch.inference_mode():
        expected = [hf.generate(torch.tensor([p], device=DEVICE), max_new_tokens=max_new, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    llm = LLM(model=str(path), device=DEVICE, dtype="float32", attention_backend="triton", block_size=8,
              num_kv_blocks=32, max_num_batched_tokens=16, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    for attempt in ("cold", "cached"):
        outs = llm.generate(prompts, params)
        assert [o.outputs[0].token_ids for o in outs] == expected, attempt
    assert [o.num_cached_tokens for o in outs] == [16, 16, 0]

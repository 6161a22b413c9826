"""The whole engine on CUDA (Triton attention) against Hugging Face on the same random model.

- float32: greedy tokens equal HF's, token for token, through LLM.generate with chunked
  prefill mixed with decodes, a context long enough for split-K decode, and a second
  pass served from the prefix cache.
- bfloat16: every token's logits of a mixed chunked step stay within twice HF's own bf16
  error (HF bf16 vs HF fp32) plus 0.05 of HF's fp32 logits.

Skipped without CUDA. Run on a GPU machine with `pytest -m gpu` (bench/gpu_all.sh does).
"""
from __future__ import annotations

import random

import pytest
import torch

from model_factory import load_hf_model, make_tiny_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# Qwen2.5-0.5B's attention shape (14 query heads, 2 KV heads: GQA 7, head_dim 64) and a
# Llama with head_dim 128 and GQA 4, shrunk to 2 layers and a 512-token vocabulary.
MODELS = {
    "qwen2-0.5b-heads": ("qwen2", dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                       intermediate_size=1024, max_position_embeddings=2048)),
    "llama-d128": ("llama", dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=1,
                                 intermediate_size=1024, max_position_embeddings=2048)),
}
MAX_NEW = 16


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 claims exact greedy tokens: keep cuBLAS in true fp32 on both sides."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture(scope="module", params=list(MODELS))
def model_dir(request, tmp_path_factory):
    family, overrides = MODELS[request.param]
    return make_tiny_model(family, tmp_path_factory.mktemp(request.param), **overrides)


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (3, 17, 64, 150)]
    prompts += [shared + [rng.randrange(3, vocab) for _ in range(n)] for n in (1, 9, 33)]  # shared prefix
    prompts.append([rng.randrange(3, vocab) for _ in range(1200)])     # long: split-K decode
    return prompts


def _hf_greedy(hf, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        ids = torch.tensor([prompt], device="cuda")
        out = hf.generate(ids, max_new_tokens=MAX_NEW, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_gpu_auto_backend_is_triton(model_dir):
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.model_runner import ModelRunner
    runner = ModelRunner(EngineConfig(model=str(model_dir), device="cuda", num_kv_blocks=64))
    assert runner.backend.__name__ == "pagedkube.engine.attention.triton_backend"


def test_gpu_engine_greedy_fp32_matches_hf(model_dir):
    from pagedkube.engine import LLM, SamplingParams
    hf = load_hf_model(model_dir).to("cuda")
    prompts = _prompts(hf.config.vocab_size)
    expected = [_hf_greedy(hf, p) for p in prompts]
    llm = LLM(model=str(model_dir), device="cuda", dtype="float32", block_size=16, num_kv_blocks=512,
              max_num_batched_tokens=256, max_num_seqs=8, attention_backend="triton")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    for attempt in ("cold", "prefix-cached"):
        outs = llm.generate(prompts, params)
        got = [o.outputs[0].token_ids for o in outs]
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g == e, f"{attempt} prompt {i} (len {len(prompts[i])}): {g} != {e}"
    assert any(o.num_cached_tokens > 0 for o in outs)


def test_gpu_engine_bf16_logits_close_to_hf(model_dir):
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.model_runner import ModelRunner
    from pagedkube.engine.sampling_params import SamplingParams
    from pagedkube.engine.sequence import ScheduledSeq, Sequence
    runner = ModelRunner(EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16",
                                      attention_backend="triton", block_size=16, num_kv_blocks=256))
    hf32 = load_hf_model(model_dir).to("cuda")
    hf16 = load_hf_model(model_dir).to("cuda", torch.bfloat16)
    rng = random.Random(1)
    vocab = runner.model_config.vocab_size
    blocks = rng.sample(range(256), 256)
    lengths = [700, 45, 9]
    seqs = [Sequence(request_id=str(i), prompt_token_ids=[rng.randrange(vocab) for _ in range(n)],
                     params=SamplingParams(temperature=0.0), block_table=[blocks.pop() for _ in range(-(-n // 16))])
            for i, n in enumerate(lengths)]
    chunks = [[600, 20, 9], [100, 25, 0]]          # step 1: prefill chunks; step 2: the rest, mixed
    got = {s.request_id: [] for s in seqs}
    for chunk in chunks:
        batch = [ScheduledSeq(s, n) for s, n in zip(seqs, chunk) if n]
        step = runner.prepare(batch)
        with torch.inference_mode():
            hidden = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
            logits = runner.model.compute_logits(hidden).float()
        for item, part in zip(batch, logits.split([it.num_new_tokens for it in batch])):
            got[item.seq.request_id].append(part)
            item.seq.num_computed_tokens += item.num_new_tokens
    agree = hf_agree = positions = 0
    for s in seqs:
        ours = torch.cat(got[s.request_id])
        with torch.inference_mode():
            ids = torch.tensor([s.token_ids], device="cuda")
            ref = hf32(ids).logits[0].float()
            hf_bf16 = hf16(ids).logits[0].float()
        hf_err = (hf_bf16 - ref).abs().max().item()
        our_err = (ours - ref).abs().max().item()
        assert our_err <= 2 * hf_err + 0.05, (s.request_id, our_err, hf_err)
        agree += (ours.argmax(-1) == ref.argmax(-1)).sum().item()
        hf_agree += (hf_bf16.argmax(-1) == ref.argmax(-1)).sum().item()
        positions += len(ref)
    # Argmax agreement with the float32 reference, over all 754 positions: per sequence, one bf16
    # near-tie flip in the 9-token one moves it by 0.11 (seen on an H200: 8/9 against HF's 9/9).
    assert agree / positions >= hf_agree / positions - 0.05, (agree, hf_agree, positions)

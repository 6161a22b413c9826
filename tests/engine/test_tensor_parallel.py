"""Tensor parallelism (engine/distributed/) against TP=1, with real worker processes over gloo.

Every comparison runs one mixed batch through LLM(tensor_parallel_size=N) and LLM() with the
same flags: prompts of 4 to ~200 tokens, three of them sharing a long head (prefix-cache hits
inside the batch), one with n=2, a token budget of 32 (every longer prompt is prefilled in
chunks) and a KV pool too small for the batch (preemption); then the same prompts again (hits
from the first round). The claim is that nothing but the arithmetic moves between processes:

- greedy tokens equal TP=1's, token for token;
- the scheduler's own numbers (preemptions, prefix-cache queries and hits, free blocks) equal
  TP=1's, since the scheduler, block tables and prefix cache exist only on rank 0;
- logprobs (of the sampled token and the top 5) within LOGPROB_ATOL of TP=1's in float32: the
  row-parallel all-reduce sums partial products in another order than one matmul does.

Structured outputs (a JSON schema, a choice) and seeded sampling with n=2 give TP=1's text too:
sampling and the grammar bitmask run on rank 0 only, on logits gathered from every rank.

Models: the built-in tiny (4 heads, 2 KV heads: TP=2), the built-in tiny rewritten with its 2 KV
heads repeated to 4 (the same function, so TP=4 is compared with the built-in at TP=1), and
SmolLM2-135M (9 heads, 3 KV heads: TP=3 is its only size besides 1).
"""
from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.distributed.checks import check_tensor_parallel, compatible_sizes
from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.sharding import slice_columns, slice_rows
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.quant.formats import dequantize
from pagedkube.engine.quant.quantize import quantize_int4, quantize_int8
from pagedkube.model_source import resolve_model_source

pytestmark = pytest.mark.timeout(1200)

# float32 logprobs of TP=N against TP=1: the largest difference measured is 1.2e-5 (built-in tiny,
# TP=2); 1e-3 leaves room for deeper models and other CPUs' summation orders
LOGPROB_ATOL = 1e-3
BUILTIN = resolve_model_source("builtin://tiny").path
HEAD = ("A dog should see a vet once a year for a check-up, vaccines and a look at the teeth. "
        "Puppies need more visits: every few weeks until they are four months old. ")
PROMPTS = [HEAD + "How often should an old dog go?", "Hi", HEAD + "What about cats?",
           "My dog barks at night. What should I do about it when the neighbours complain?",
           HEAD + HEAD + "And rabbits?", "Can dogs eat apples?"]
CHATS = ["How often should I walk my puppy?", "How long can my puppy hold its bladder?",
         "How do I house train my puppy?", "My puppy keeps having accidents in the house. What am I doing wrong?"]
FLAGS = dict(device="cpu", dtype="float32", max_model_len=512, max_num_batched_tokens=32, num_kv_blocks=16,
             block_size=16, enable_prefix_caching=True)


def params() -> list[SamplingParams]:
    greedy = dict(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)
    return [SamplingParams(**greedy, n=2 if i == 1 else 1) for i in range(len(PROMPTS))]


def run(model: str, tp: int, **flags) -> dict:
    llm = LLM(model, tensor_parallel_size=tp, **{**FLAGS, **flags})
    try:
        rounds = [llm.generate(PROMPTS, params(), use_tqdm=False) for _ in range(2)]
        stats = llm.engine.stats()
    finally:
        llm.engine.shutdown()
    return {"tokens": [[c.token_ids for c in o.outputs] for r in rounds for o in r],
            "logprobs": [[c.logprobs for c in o.outputs] for r in rounds for o in r],
            "cached": [o.num_cached_tokens for r in rounds for o in r],
            "stats": (stats.num_preemptions, stats.prefix_cache_queries, stats.prefix_cache_hits,
                      stats.num_free_blocks, stats.num_kv_blocks)}


def assert_same(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    assert got["cached"] == want["cached"] and got["stats"] == want["stats"]
    preemptions, _, hits, free, total = want["stats"]
    assert preemptions > 0 and hits > 0 and free == total      # the batch did preempt and hit; nothing leaked
    for got_req, want_req in zip(got["logprobs"], want["logprobs"]):
        for got_sample, want_sample in zip(got_req, want_req):
            for g, w in zip(got_sample, want_sample):
                assert g.keys() == w.keys()
                assert max(abs(g[t].logprob - w[t].logprob) for t in w) <= LOGPROB_ATOL
                assert [g[t].rank for t in w] == [w[t].rank for t in w]


@pytest.fixture(scope="module")
def tiny_tp1() -> dict:
    return run(str(BUILTIN), 1)


@pytest.fixture(scope="module")
def tiny_kv4(tmp_path_factory) -> str:
    """The built-in tiny with each of its 2 KV heads repeated twice: 4 KV heads, the same function."""
    out = tmp_path_factory.mktemp("tiny-kv4")
    for f in BUILTIN.iterdir():
        shutil.copy(f, out / f.name)
    config = json.loads((BUILTIN / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // heads
    weights = load_file(str(BUILTIN / "model.safetensors"))
    for name, t in weights.items():
        if ".k_proj." in name or ".v_proj." in name:
            per_head = t.view(kv_heads, head_dim, *t.shape[1:])
            weights[name] = per_head.repeat_interleave(heads // kv_heads, dim=0).reshape(heads * head_dim,
                                                                                          *t.shape[1:]).clone()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "num_key_value_heads": heads}))
    return str(out)


def test_tp2_builtin_tiny_matches_tp1(tiny_tp1):
    assert_same(run(str(BUILTIN), 2), tiny_tp1)


def test_tp4_builtin_tiny_with_4_kv_heads_matches_tp1(tiny_kv4, tiny_tp1):
    assert run(tiny_kv4, 1)["tokens"] == tiny_tp1["tokens"]   # the rewrite kept the function
    assert_same(run(tiny_kv4, 4), tiny_tp1)


def chat_answers(tp: int, quantization: str) -> list[list[int]]:
    llm = LLM(str(BUILTIN), tensor_parallel_size=tp, quantization=quantization,
              **{**FLAGS, "num_kv_blocks": 64})
    try:
        outs = llm.chat([[{"role": "user", "content": q}] for q in CHATS],
                        SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)
    finally:
        llm.engine.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_tp2_packed_weights_match_tp1(quantization):
    """Projections quantized whole and cut along their groups: every rank holds TP=1's numbers.
    The packed CPU kernels return bf16, so each rank's partial sum is rounded before the
    all-reduce (TP=1 rounds the whole sum once): greedy tokens agree where the model has a clear
    choice, which is why this compares the chat answers the tiny model was trained on rather
    than the junk continuations of the mixed batch, where near-ties decide."""
    want = chat_answers(1, quantization)
    assert chat_answers(2, quantization) == want
    assert all(len(answer) > 10 for answer in want)


@pytest.mark.slow
def test_tp3_smollm2_matches_tp1():
    from default_model import require_default_model

    require_default_model()
    model = str(resolve_model_source(None).path)
    assert compatible_sizes(ModelConfig.from_pretrained(model)) == [1, 3]
    flags = dict(quantization="none")
    assert_same(run(model, 3, **flags), run(model, 1, **flags))


def test_structured_outputs_under_tp2_match_tp1():
    """The grammar bitmask is applied on rank 0, to the logits gathered from both ranks."""
    from pagedkube.engine import StructuredOutputsParams

    schema = {"type": "object", "properties": {"dog": {"type": "string", "maxLength": 8},
                                               "walks": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["dog", "walks"]}
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema)),
              SamplingParams(temperature=0.0, max_tokens=8,
                             structured_outputs=StructuredOutputsParams(choice=["sit", "stay", "come here"])),
              SamplingParams(temperature=0.8, seed=7, max_tokens=12, n=2)]
    answers = {}
    for tp in (1, 2):
        llm = LLM(str(BUILTIN), tensor_parallel_size=tp, **FLAGS)
        try:
            outs = llm.generate(["Describe the dog as JSON:", "Command:", "Walk the dog"], params, use_tqdm=False)
        finally:
            llm.engine.shutdown()
        answers[tp] = [[c.text for c in o.outputs] for o in outs]
    assert answers[2] == answers[1]
    assert set(json.loads(answers[1][0][0])) == {"dog", "walks"} and answers[1][1][0] in ("sit", "stay", "come here")


def test_sizes_that_cannot_split_the_model_fail_before_anything_starts():
    cfg = ModelConfig.from_pretrained(BUILTIN)
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 must divide the model's KV heads \(2\); "
                                         r"sizes that do: \[1, 2\]"):
        check_tensor_parallel(cfg, 4)
    with pytest.raises(ValueError, match="must divide the model's attention heads"):
        LLM(str(BUILTIN), device="cpu", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="decode_capture 'on' is not supported with tensor_parallel_size > 1"):
        LLM(str(BUILTIN), device="cpu", tensor_parallel_size=2, decode_capture="on")


def test_packed_weights_cut_along_their_groups():
    torch.manual_seed(0)
    w = torch.randn(48, 256)
    for q in (quantize_int8(w), quantize_int4(w)):
        full = dequantize(q)
        assert torch.equal(dequantize(slice_rows(q, 16, 32)), full[16:32])
        assert torch.equal(dequantize(slice_columns(q, 128, 256)), full[:, 128:256])


def test_a_hung_worker_fails_the_step_after_the_timeout():
    """A stopped worker (SIGSTOP) never joins the next all-reduce: WorkerFailed, not a hang."""
    llm = LLM(str(BUILTIN), tensor_parallel_size=2, distributed_timeout=3.0, **FLAGS)
    worker = llm.engine.runner.tp.procs[0]
    try:
        assert llm.generate(["Hi"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
        os.kill(worker.pid, signal.SIGSTOP)
        with pytest.raises(WorkerFailed, match="tensor-parallel"):
            llm.generate(["Hi"], SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        llm.engine.shutdown()

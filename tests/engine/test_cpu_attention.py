"""The CPU decode attention kernel (engine/attention/cpu_attention.cpp) and its backend
(engine/attention/cpu_backend.py) against torch_ref, the per-sequence oracle.

The kernel reads each decoding sequence's context through its block table, in float32 from a
float32, float16 or bfloat16 cache, up to its length: its output must be the float64
reference's to float32 accuracy for every cache dtype, grouped-query shape (9 heads over 3, as
the default model; 8 over 2; 4 over 4; 14 over 2, a group the kernel splits 3+3+1), head size
(64, 128, 40: not a multiple of 32) and length (1, a block's edge either side, long contexts).
Bad tables and lengths are errors, never reads outside the pool. Skipped only where no C++
toolchain builds the kernels (or the CPU lacks AVX2/FMA/F16C).
"""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.attention import torch_backend, torch_ref

from attention_steps import make_step
from cpu_kernels import require_cpu_kernels
from default_model import require_default_model


@pytest.fixture(scope="module")
def ops():
    return require_cpu_kernels()


def _pool(dtype: torch.dtype, seq_lens: list[int], heads: tuple[int, int], head_dim: int, block_size: int = 16,
          seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 7
    q_heads, kv_heads = heads
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen)
    width = max(-(-n // block_size) for n in seq_lens) + 2            # wider than any sequence needs
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int64)
    used = 0
    for b, n in enumerate(seq_lens):
        blocks = -(-n // block_size)
        tables[b, :blocks] = order[used:used + blocks]
        used += blocks
    query = torch.randn(len(seq_lens), q_heads, head_dim, generator=gen)
    return query, k, v, tables, torch.tensor(seq_lens, dtype=torch.int64)


def _reference(query, k, v, tables, lens, scale):
    """softmax(q k^T) v per sequence in float64, from the cache's own values."""
    out = torch.empty(query.shape, dtype=torch.float64)
    block_size, kv_heads = k.shape[1], k.shape[2]
    group = query.shape[1] // kv_heads
    for b, n in enumerate(lens.tolist()):
        slots = [int(tables[b, t // block_size]) * block_size + t % block_size for t in range(n)]
        keys = k.flatten(0, 1)[slots].double().repeat_interleave(group, dim=1)      # [n, Hq, D]
        values = v.flatten(0, 1)[slots].double().repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", query[b].double(), keys) * scale, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", weights, values)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "head_dim"), [((9, 3), 64), ((8, 2), 128), ((4, 4), 40), ((14, 2), 64)])
def test_kernel_computes_the_reference(ops, dtype, heads, head_dim):
    seq_lens = [1, 15, 16, 17, 100, 1000]
    query, k, v, tables, lens = _pool(dtype, seq_lens, heads, head_dim)
    scale = head_dim ** -0.5
    got = ops.decode_attention(query, k, v, tables, lens, scale)
    expected = _reference(query, k, v, tables, lens, scale)
    assert got.dtype == torch.float32 and got.shape == query.shape
    # float32 sums over up to 1,000 positions and the kernel's exponential: float32 accuracy
    assert float((got.double() - expected).abs().max() / expected.abs().max()) < 2e-6


@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize(("heads", "seq_lens"), [((9, 3), [1]), ((9, 3), [63]), ((9, 3), [129]), ((9, 3), [1000]),
                                                 ((9, 3), [2048]), ((4, 4), [700]), ((14, 2), [5, 1000]),
                                                 ((8, 1), [200, 64, 3]), ((8, 1), [300, 1])])
def test_few_sequences_split_their_context_and_merge_to_the_reference(ops, threads, heads, seq_lens):
    """Fewer (sequence, KV head) pairs than twice the threads: each context is split into parts
    (at least 64 positions each; a short sequence's later parts are empty) merged by their
    softmax statistics. The result is the whole context's attention, to float32 accuracy."""
    query, k, v, tables, lens = _pool(torch.float16, seq_lens, heads, 64, seed=len(seq_lens))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = ops.decode_attention(query, k, v, tables, lens, 0.125)
    finally:
        torch.set_num_threads(before)
    expected = _reference(query, k, v, tables, lens, 0.125)
    assert float((got.double() - expected).abs().max() / expected.abs().max()) < 2e-6


def test_bad_lengths_and_tables_are_errors(ops):
    query, k, v, tables, lens = _pool(torch.float16, [20, 40], (9, 3), 64)
    width = tables.shape[1] * k.shape[1]
    for bad in ([0, 40], [20, width + 1]):
        with pytest.raises(RuntimeError, match="seq_lens"):
            ops.decode_attention(query, k, v, tables, torch.tensor(bad), 0.125)
    outside = tables.clone()
    outside[1, 2] = k.shape[0]                                          # a block past the pool, within length 40
    with pytest.raises(RuntimeError, match="block_tables"):
        ops.decode_attention(query, k, v, outside, lens, 0.125)
    with pytest.raises(RuntimeError, match="float32"):
        ops.decode_attention(query.bfloat16(), k, v, tables, lens, 0.125)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("row_dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_what_torch_writes(ops, cache_dtype, row_dtype):
    """The cache write (store_kv): the same bits as torch_backend.write_kv (index_copy_ after .to(),
    rounding to nearest even), rows taken from strided views of a fused qkv output as the model
    passes them, every other slot untouched."""
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(32, 16, 3, 64, generator=gen).to(cache_dtype)
    v_cache = torch.randn(32, 16, 3, 64, generator=gen).to(cache_dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    qkv = (torch.randn(70, 960, generator=gen) * 300).to(row_dtype)     # values that round in float16
    key, value = qkv[:, 576:768].view(70, 3, 64), qkv[:, 768:].view(70, 3, 64)
    slots = torch.randperm(32 * 16, generator=gen)[:70]                  # 70 rows: more than one thread's share
    ops.store_kv(key, value, k_cache, v_cache, slots)
    torch_backend.write_kv(key, value, expected_k, expected_v, slots)
    bits = torch.int32 if cache_dtype == torch.float32 else torch.int16
    assert torch.equal(k_cache.view(bits), expected_k.view(bits))
    assert torch.equal(v_cache.view(bits), expected_v.view(bits))


def test_store_kv_refuses_a_slot_outside_the_pool(ops):
    k_cache = torch.zeros(4, 16, 3, 64, dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.ones(2, 3, 64)
    for bad in (64, -1):
        with pytest.raises(RuntimeError, match="slot_mapping"):
            ops.store_kv(key, key, k_cache, v_cache, torch.tensor([3, bad]))
    assert not k_cache.any() and not v_cache.any()                       # checked before any write
    with pytest.raises(RuntimeError, match="does not match"):
        ops.store_kv(torch.ones(2, 2, 64), torch.ones(2, 2, 64), k_cache, v_cache, torch.tensor([0, 1]))


@pytest.mark.parametrize("q_lens, seq_lens", [
    ([1, 1, 1, 1], [1, 9, 33, 17]),                       # decode only
    ([1, 7, 1, 12, 1], [21, 7, 5, 30, 64]),               # mixed: chunked prefill + decodes
    ([1], [37]),                                          # one decode
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backend_matches_torch_ref(ops, q_lens, seq_lens, dtype):
    from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
    query, k_cache, v_cache, meta = make_step(q_lens, seq_lens, 8, 2, 16, torch.float32, seed=5)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    expected = torch_ref.paged_attention(query, k_cache.float(), v_cache.float(), meta, 0.25)
    got = CpuKernelBackend(ops).paged_attention(query, k_cache, v_cache, meta, 0.25)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # and the torch backend's own decode pass, unchanged by the decode= parameter
    torch.testing.assert_close(torch_backend.paged_attention(query, k_cache.float(), v_cache.float(), meta, 0.25),
                               expected, atol=1e-5, rtol=1e-5)


def test_a_head_size_the_kernel_cannot_take_goes_through_torch(ops):
    from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
    query, k_cache, v_cache, meta = make_step([1, 1], [9, 30], 4, 2, 12, torch.float32, seed=7)   # 12: not 8-wide
    expected = torch_ref.paged_attention(query, k_cache, v_cache, meta, 0.25)
    got = CpuKernelBackend(ops).paged_attention(query, k_cache, v_cache, meta, 0.25)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_runner_picks_the_kernel_where_it_is_built(ops):
    from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
    from pagedkube.engine.runner_setup import select_backend
    cpu = torch.device("cpu")
    assert isinstance(select_backend("auto", cpu, ops), CpuKernelBackend)
    assert select_backend("torch", cpu, ops) is torch_backend          # asked for by name: torch's
    assert select_backend("auto", cpu, None) is torch_backend          # no kernels loaded (the float path)


def test_the_gguf_default_decodes_with_the_kernel_as_with_torch(ops):
    """The default model's greedy tokens, capture off, with the kernel and with torch's decode pass."""
    from pagedkube.engine import LLM, SamplingParams
    from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
    require_default_model()
    prompts = ["Walk the dog twice a day because", "A healthy diet for a puppy", "My beagle keeps barking at", "Hi"]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outs = {}
    for backend in ("auto", "torch"):
        llm = LLM(device="cpu", attention_backend=backend, decode_capture="off", max_model_len=256)
        assert isinstance(llm.engine.runner.backend, CpuKernelBackend) == (backend == "auto")
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs["auto"] == outs["torch"]


def test_a_captured_step_attends_with_the_kernel_as_eager_does(ops):
    """torch.compile's whole-step capture (engine/decode_capture.py) traces the kernel as the
    operator pagedkube::decode_attention: the default model's greedy tokens, captured and eager."""
    from pagedkube.engine import LLM, SamplingParams
    from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
    require_default_model()
    prompts = ["Walk the dog twice a day because", "My beagle keeps barking at"]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    outs = {}
    for capture in ("on", "off"):
        llm = LLM(device="cpu", decode_capture=capture, decode_capture_sizes=(2,), max_model_len=256)
        assert isinstance(llm.engine.runner.backend, CpuKernelBackend)
        outs[capture] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        if capture == "on":
            assert llm.engine.runner.decode_capture.num_captured_steps > 0
    assert outs["on"] == outs["off"]

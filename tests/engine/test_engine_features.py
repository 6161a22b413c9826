"""The engine's cache feed, stats, seeded n > 1 sampling, and its torch-free core."""
from __future__ import annotations

import subprocess
import sys

import pytest

from invariants import assert_pool_invariants
from model_factory import make_tiny_model
from pagedkube.engine import LLM, SamplingParams
from pagedkube.hashing import block_hashes, to_hex

PROMPT = list(range(20, 38))   # 18 tokens: 4 full blocks of 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"), vocab_size=512)


def make_llm(path, **kw):
    return LLM(str(path), device="cpu", dtype="float32", block_size=4, attention_backend="torch", **kw)


def test_cache_feed_carries_the_gateway_hashes(model_dir):
    llm = make_llm(model_dir, num_kv_blocks=32, hash_seed="s1")
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), cache_salt="tenant-a")
    feed = llm.engine.kv_events.events_after(0)
    stored = [h for e in feed["events"] if e["type"] == "stored" for h in e["block_hashes"]]
    # the prompt's 4 full blocks; 18 prompt + 1 output token computed = 19: no 5th full block
    assert stored == to_hex(block_hashes(PROMPT, 4, seed="s1", cache_salt="tenant-a"))
    assert feed["latest_seq"] == len(feed["events"]) and not feed["reset"]
    stats = llm.engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
    assert (stats.num_kv_blocks, stats.num_free_blocks) == (32, 32)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (18, 0)
    again = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), cache_salt="tenant-a")[0]
    other = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), cache_salt="tenant-b")[0]
    assert (again.num_cached_tokens, other.num_cached_tokens) == (16, 0)
    assert llm.engine.stats().prefix_cache_hits == 16


@pytest.mark.parametrize("quantization", ["none", "int4"])   # int4: the same with packed weights
def test_seeded_n_samples_reproducible_under_preemption(model_dir, quantization):
    params = SamplingParams(n=3, temperature=1.0, top_k=50, seed=7, max_tokens=10, ignore_eos=True)
    roomy = make_llm(model_dir, num_kv_blocks=64, quantization=quantization).generate([PROMPT, PROMPT[:9]], params)
    tight_llm = make_llm(model_dir, num_kv_blocks=12, max_num_batched_tokens=6, quantization=quantization)
    tight = tight_llm.generate([PROMPT, PROMPT[:9]], params)
    assert tight_llm.engine.stats().num_preemptions > 0
    assert_pool_invariants(tight_llm.engine.kv_manager.pool, idle=True)
    for a, b in zip(roomy, tight):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        assert len({tuple(c.token_ids) for c in a.outputs}) == 3       # the samples differ
        assert [c.index for c in a.outputs] == [0, 1, 2]


def test_core_imports_no_torch():
    code = ("import sys; import pagedkube.engine.llm_engine, pagedkube.engine.scheduler, "
            "pagedkube.engine.kv_events, pagedkube.engine.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)

"""LoRA's small parts: --lora-modules parsing, LoRARequest and config checks, the scheduler's
adapter limit (torch-free), and the engine refusing adapters it cannot serve (ValueError)."""
from __future__ import annotations

import pytest

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.lora.modules import LoRAModule, parse_lora_module
from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import Sequence


def test_lora_modules_both_forms():
    assert parse_lora_module("vet=/a/b") == LoRAModule("vet", "/a/b")
    assert parse_lora_module('{"name": "cat", "path": "/c", "base_model_name": "smol"}') == \
        LoRAModule("cat", "/c", "smol")
    for bad, message in [("novalue", "name=path"), ("=/p", "adapter name"), ("a=", "path"),
                         ('{"name": "x"}', "JSON module"), ('{"name": "x", "path": "/p", "rank": 4}', "JSON module"),
                         ("{oops", "not valid JSON"), ("bad name=/p", "adapter name")]:
        with pytest.raises(ValueError, match=message):
            parse_lora_module(bad)


def test_lora_request_and_config_are_checked():
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("a", 0, "/p")
    with pytest.raises(ValueError, match="lora_name"):
        LoRARequest("", 1, "/p")
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig(enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="max_lora_rank"):
        EngineConfig(max_lora_rank=0)
    with pytest.raises(ValueError, match="decode_capture 'on'"):
        EngineConfig(enable_lora=True, decode_capture="on")


def seq(i: int, lora: str | None) -> Sequence:
    request = None if lora is None else LoRARequest(lora, ord(lora[0]), f"/{lora}")
    return Sequence(f"r{i}", [1, 2, 3, 4, 5], SamplingParams(max_tokens=4), lora_request=request)


def test_scheduler_runs_at_most_max_loras_adapters_and_passes_over_the_rest():
    kv = KVCacheManager(num_blocks=64, block_size=4)
    sched = Scheduler(kv, max_num_seqs=16, max_num_batched_tokens=1000, max_model_len=64, max_loras=2)
    seqs = [seq(0, "a"), seq(1, "b"), seq(2, "c"), seq(3, None), seq(4, "a"), seq(5, "c")]
    for s in seqs:
        sched.add_request([s])
    first = [item.seq.request_id for item in sched.schedule()]
    assert first == ["r0", "r1", "r3", "r4"]                  # c is passed over, base and a's second run
    assert [s.request_id for s in sched.waiting] == ["r2", "r5"]   # in their order, at the front
    for s in seqs[:2] + seqs[4:5]:                             # a and b finish
        sched.finish(s, s.status.FINISHED_STOPPED)
    second = [item.seq.request_id for item in sched.schedule()]
    assert second == ["r3", "r2", "r5"]
    assert {s.lora_name for s in sched.running} == {None, "c"}


def test_hashes_differ_per_adapter_and_base_hashes_are_unchanged():
    from pagedkube import hashing
    tokens = list(range(32))
    base = hashing.block_hashes(tokens, 16, cache_salt="t")
    assert base == hashing.block_hashes(tokens, 16, cache_salt="t", lora_name=None)
    a, b = (hashing.block_hashes(tokens, 16, cache_salt="t", lora_name=n) for n in ("a", "b"))
    assert len({*base, *a, *b}) == 6                          # every block differs
    # the documented encoding: 0xff "lora" u32le(len(salt_i)) salt_i NAME in every block
    assert hashing.extra_keys(0, "t", "a") == b"\xfflora\x01\x00\x00\x00ta"
    assert hashing.extra_keys(1, "t", "a") == b"\xfflora\x00\x00\x00\x00a"
    assert a[1] == hashing.hash_block(a[0], tokens[16:], b"\xfflora\x00\x00\x00\x00a")


def test_engine_refuses_adapters_it_cannot_serve(tmp_path):
    from pagedkube.engine import LLM

    plain = LLM("builtin://tiny", device="cpu", num_kv_blocks=32)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        plain.generate([[5, 6, 7]], SamplingParams(max_tokens=2), lora_request=LoRARequest("a", 1, str(tmp_path)))
    llm = LLM("builtin://tiny", device="cpu", num_kv_blocks=32, enable_lora=True, max_lora_rank=8)
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), lora_request=LoRARequest("a", 1, str(tmp_path)))
    with pytest.raises(ValueError, match="not a directory"):
        llm.engine.add_lora(LoRARequest("a", 1, str(tmp_path / "missing")))
    assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids   # still serving
    with pytest.raises(ValueError, match="2 lora_requests for 1 prompts"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), lora_request=[None, None])

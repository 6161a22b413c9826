"""Native decode (engine/native_decode.py, engine/quant/native_decode.cpp): every decode-only
step as one C++ call, against the eager engine running the same kernels (the reference).

On tiny GGUF files of the Llama and Qwen2 (q/k/v biases) layouts, Q4_1, which load on the
default path (the calibration's Q4 kernels, our attention backend, a float16 KV cache): the
same greedy ids as eager and logprobs to float32 summation order, for one sequence, for 3, and
for 12 (past the 8 rows the decode kernels take: the prefill kernels then run inside the C++
step), under preemption (a pool too small for the batch) and prefix-cache hits. Then the
default model itself on the pet-care chats, `auto` choosing native there and only there, and
bad inputs to the C++ step as errors. Skipped only where no C++ toolchain builds the kernels
(or the CPU lacks AVX2/FMA/F16C).
"""
from __future__ import annotations

import pytest
import torch
from cpu_kernels import require_cpu_kernels
from default_model import DOGS, QUESTIONS, SYSTEM, require_default_model
from gguf_factory import write_tiny_gguf

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.llm import LLM
from pagedkube.engine.native_decode import NativeDecode, why_not_native
from pagedkube.engine.quant import calibrate
from pagedkube.engine.runner_setup import resolve_decode_capture
from pagedkube.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_cpu_kernels()


def prompts(count: int, base: int = 9) -> list[list[int]]:
    return [[3 + (i * 13 + j * 7) % 250 for j in range(base + 11 * i)] for i in range(count)]


def run(llm: LLM, batch: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    outs = []
    for out in llm.generate(batch, GREEDY, use_tqdm=False):
        c = out.outputs[0]
        outs.append((c.token_ids, [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]))
    return outs


def assert_same(native, eager) -> None:
    """The same ids; logprobs close. The decode kernel (q4i16) rounds x to int16 per group, so the
    float32-order differences of one step (below) can flip a rounding, 2^-16 of a group's largest
    |x|; over 24 tokens of a random tiny model that drifts a logprob by up to ~4e-4."""
    for (ids, lps), (ref_ids, ref_lps) in zip(native, eager, strict=True):
        assert ids == ref_ids
        assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < 2e-3


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf", request.param, "Q4_1")
    llms = {mode: LLM(str(path), device="cpu", decode_capture=mode, max_model_len=512) for mode in ("native", "off")}
    return path, llms


def test_native_runs_every_decode_step_and_gives_the_eager_ids(tiny):
    _, llms = tiny
    native = llms["native"].engine.runner.decode_capture
    assert isinstance(native, NativeDecode)
    assert llms["off"].engine.runner.decode_capture is None
    for batch in (prompts(1), prompts(3), prompts(12)):
        before = native.num_captured_steps
        assert_same(run(llms["native"], batch), run(llms["off"], batch))
        # every step after the prefill decodes natively (23 for one sequence, more for staggered batches)
        assert native.num_captured_steps - before >= GREEDY.max_tokens - 1


def test_one_native_step_is_the_eager_step_to_float32_order(tmp_path, monkeypatch):
    """With the exact Q4 kernel (q4fused) in both, each decode step's output and K/V rows equal
    the eager step's on the same inputs and cache up to float32 summation order: the RMSNorm
    sums and SiLU's exponential are the only arithmetic the C++ step does differently."""
    monkeypatch.setattr(calibrate, "NEAR_EXACT", frozenset())
    path = write_tiny_gguf(tmp_path / "llama.gguf", "llama", "Q4_1", seed=3)
    llm = LLM(str(path), device="cpu", decode_capture="native", max_model_len=512)
    runner = llm.engine.runner
    native = runner.decode_capture
    native_run, checked = native.run, []

    def both(step):
        if step.meta.max_query_len != 1:
            return None
        before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        with torch.inference_mode():
            ref = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        ref_kv = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        for (k, v), (k0, v0) in zip(runner.kv_caches, before):
            k.copy_(k0)
            v.copy_(v0)
        out = native_run(step)
        assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
        for (k, v), (rk, rv) in zip(runner.kv_caches, ref_kv):     # float16 rows: one rounding apart at most
            torch.testing.assert_close(k, rk, rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(v, rv, rtol=1e-3, atol=1e-3)
        checked.append(step.meta.num_seqs)
        return out
    monkeypatch.setattr(native, "run", both)
    llm.generate(prompts(3), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert checked and max(checked) == 3


def test_native_needs_no_pad_block_and_writes_the_eager_cache_rows(tiny):
    _, llms = tiny
    native, eager = llms["native"].engine.runner, llms["off"].engine.runner
    assert native.kv_caches[0][0].shape == eager.kv_caches[0][0].shape
    assert native.kv_caches[0][0].shape[0] == native.num_kv_blocks          # no capture pad block
    assert native.kv_caches[0][0].dtype == torch.float16


def test_native_under_preemption_and_prefix_hits(tiny):
    path, _ = tiny
    # 8 sequences growing to ~100 tokens in 24 blocks of 16: the scheduler must preempt
    small = {mode: LLM(str(path), device="cpu", decode_capture=mode, max_model_len=512, num_kv_blocks=24)
             for mode in ("native", "off")}
    batch = prompts(8, base=30)
    batch += [batch[0][:40] + [7, 8, 9], batch[1] + [4]]                 # shared prefixes: cache hits
    assert_same(run(small["native"], batch), run(small["off"], batch))
    assert small["native"].engine.runner.decode_capture.num_captured_steps > 0


def test_native_is_refused_where_it_does_not_apply(tiny):
    path, _ = tiny
    with pytest.raises(ValueError, match="decode_capture 'native' does not apply to this model"):
        LLM(str(path), device="cpu", decode_capture="native", quantization="none", max_model_len=512)
    with pytest.raises(ValueError, match="decode_capture 'native' does not run LoRA"):
        EngineConfig(model=str(path), decode_capture="native", enable_lora=True)


def test_auto_takes_native_only_where_it_applies(tiny, monkeypatch):
    path, llms = tiny
    monkeypatch.delenv("PAGEDKUBE_DECODE_CAPTURE", raising=False)
    cpu = torch.device("cpu")
    config = EngineConfig(model=str(path))
    assert resolve_decode_capture(config, cpu, why_not_native=None) == "native"
    assert resolve_decode_capture(config, cpu, tensor_parallel=True, why_not_native=None) == "off"
    assert resolve_decode_capture(config, cpu, why_not_native="no kernels") in ("background", "off")
    auto = LLM(str(path), device="cpu", max_model_len=512)
    assert isinstance(auto.engine.runner.decode_capture, NativeDecode)
    # the float path (torch's kernels, no calibration) is not the C++ step's
    runner = llms["off"].engine.runner
    float_llm = LLM(str(path), device="cpu", quantization="none", decode_capture="off", max_model_len=512)
    reason = why_not_native(float_llm.engine.runner.model, None)
    assert reason is not None and "not loaded" in reason
    assert why_not_native(runner.model, runner.backend.ops) is None


def test_bad_inputs_to_the_cpp_step_are_errors_not_reads(tiny):
    _, llms = tiny
    runner = llms["native"].engine.runner
    decoder = runner.decode_capture.decoder
    hidden = torch.zeros(1, runner.model_config.hidden_size)
    ok = dict(slot_mapping=torch.tensor([0]), seq_lens=torch.tensor([1], dtype=torch.int32),
              block_tables=torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="outside the rotary table"):
        decoder.step(hidden.clone(), torch.tensor([10 ** 6]), *ok.values())
    with pytest.raises(RuntimeError, match="outside the pool"):
        decoder.step(hidden.clone(), torch.tensor([0]), torch.tensor([10 ** 9]), ok["seq_lens"], ok["block_tables"])
    with pytest.raises(RuntimeError, match="hidden: float32"):
        decoder.step(hidden.double(), torch.tensor([0]), *ok.values())
    # the engine still serves afterwards
    assert_same(run(llms["native"], prompts(2)), run(llms["off"], prompts(2)))


def test_the_default_model_decodes_natively_with_the_eager_ids():
    require_default_model()
    chats = [[{"role": "system", "content": SYSTEM},
              {"role": "user", "content": f"{dog} {question}"}] for dog, question in zip(DOGS, QUESTIONS)][:6]
    params = SamplingParams(max_tokens=32, temperature=0.0)
    outs = {}
    for mode in ("native", "off"):
        llm = LLM(decode_capture=mode, max_model_len=1024)
        if mode == "native":
            assert isinstance(llm.engine.runner.decode_capture, NativeDecode)
        outs[mode] = [o.outputs[0].token_ids for o in llm.chat(chats, params, use_tqdm=False)]
        del llm
    assert outs["native"] == outs["off"]

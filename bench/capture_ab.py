"""Two captured decode steps side by side in one process: one-client step time, rounds interleaved.

Each --variant builds its own engine on the default model (GGUF, decode capture `on`, bucket 1)
with one change, then the engines take turns: a 256-token prompt and --tokens greedy tokens
each, per round; the step time is the median engine step of the round's decode. Variants:

    default        the code as it is
    no-asserts     Inductor's size and alignment asserts left out of the generated code (1% faster
                   on the AVX2 path; on an AVX-512 CPU at max_model_len 2048 that program
                   corrupted the heap, so the engine keeps them)
    torch-write    the cache write through torch_backend's operator, not our store_kv
    exact-q4       projections only from exact kernels: the int16-activation Q4 kernel (q4i16)
                   left out of the calibration's candidates
    scalar         Inductor's elementwise code without vectors (`cpp.simdlen` 8, a width in bits
                   no ISA has: what the engine ran on 2026-12-04 by mistake, meaning 8 lanes)
    shared         Inductor's code as a shared cache needs it (engine/inductor_cache.py, the
                   engine image's): x86-64-v3, not -march=native
    torch-threads  Inductor's own loops on torch's thread count, not one thread
    dynamic-threads  shared, with the thread count read when a kernel runs
                   (cpp.dynamic_threads) instead of one thread
    cpp-wrapper    Inductor's C++ wrapper (`cpp_wrapper`): the graph's kernels called from C++,
                   not from a generated Python function
    native         no capture: the step as one call into our C++ library (engine/native_decode.py,
                   what `auto` runs on this model)

Medians of the rounds per variant; compare variants of one run only (the machine drifts).

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python bench/capture_ab.py \\
        --variant torch-write --variant default --threads 2 --rounds 16
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch


@contextlib.contextmanager
def variant(name: str):
    """The change `name` makes while its engine is built (the runner picks its backend and the
    compile reads its options then; the engine keeps both)."""
    from pagedkube.engine.attention import cpu_backend, torch_backend
    import pagedkube.engine.decode_capture as capture
    import pagedkube.engine.inductor_cache as inductor_cache
    import pagedkube.engine.quant.calibrate as calibrate
    compile_, backend, near_exact = torch.compile, cpu_backend.CpuKernelBackend, calibrate.NEAR_EXACT
    simd_bits, options = inductor_cache.CPU_SIMD_BITS, inductor_cache.compile_options
    if name == "no-asserts":
        def compile_without_asserts(fn, **kw):
            options = {**kw.pop("options", {}), "size_asserts": False, "alignment_asserts": False}
            return compile_(fn, options=options, **kw)
        capture.torch.compile = compile_without_asserts
    elif name == "exact-q4":
        calibrate.NEAR_EXACT = frozenset()
    elif name == "shared":
        inductor_cache.compile_options = lambda portable=None: options(True)
    elif name == "torch-threads":
        inductor_cache.compile_options = lambda portable=None: {**options(), "cpp.threads": -1}
    elif name == "dynamic-threads":
        inductor_cache.compile_options = lambda portable=None: {**options(True), "cpp.threads": -1,
                                                                "cpp.dynamic_threads": True}
    elif name == "scalar":
        inductor_cache.CPU_SIMD_BITS = 8
    elif name == "cpp-wrapper":
        def compile_with_cpp_wrapper(fn, **kw):
            return compile_(fn, options={**kw.pop("options", {}), "cpp_wrapper": True}, **kw)
        capture.torch.compile = compile_with_cpp_wrapper
    elif name == "torch-write":
        class TorchWrite(backend):
            def write_kv(self, *args):
                torch_backend.write_kv(*args)
        cpu_backend.CpuKernelBackend = TorchWrite       # runner_setup.select_backend imports it by name
    elif name not in ("default", "native"):
        raise SystemExit(f"unknown variant {name!r}")
    try:
        yield
    finally:
        capture.torch.compile, cpu_backend.CpuKernelBackend, calibrate.NEAR_EXACT = compile_, backend, near_exact
        inductor_cache.CPU_SIMD_BITS, inductor_cache.compile_options = simd_bits, options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.llm_engine import LLMEngine
    from pagedkube.engine.sampling_params import SamplingParams
    engines = {}
    for name in args.variant:
        with variant(name):
            engines[name] = LLMEngine(EngineConfig(model="smollm2-135m-instruct", max_model_len=1024,
                                                   enable_prefix_caching=False,
                                                   decode_capture="native" if name == "native" else "on",
                                                   decode_capture_sizes=(1,)))
    prompt = [(7 * i + 3) % 40000 + 5 for i in range(256)]

    def round_ms(engine, tokens: int) -> float:
        engine.add_request(f"r{time.monotonic_ns()}", prompt,
                           SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
        engine.step_deltas()                                    # the prefill
        steps = []
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step_deltas()
            steps.append(time.perf_counter() - t)
        return statistics.median(steps[2:]) * 1e3

    for engine in engines.values():
        round_ms(engine, 16)                                    # warm
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            times[name].append(round_ms(engine, args.tokens))
    print(json.dumps({name: {"median_ms": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
                      for name, v in times.items()}, indent=1))


if __name__ == "__main__":
    main()

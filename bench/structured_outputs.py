"""What constrained decoding costs the engine: decode-step time with 0%, 30% and 100% of a batch
constrained, as a ratio of the unconstrained step, at batch 1 and 32, on the default model; and
schema compile time over the validity test's schema set, cold and from the cache.

A constrained row follows a schema that cannot end within the run (an array of at least 200
small integers), so every row decodes every step; unconstrained rows ignore EOS. Rounds are
interleaved (0%, 30%, 100%, 0%, ...) and each configuration's median round is reported.

    .venv/bin/python bench/structured_outputs.py                  # smollm2-135m-instruct
    .venv/bin/python bench/structured_outputs.py --model builtin://tiny --rounds 5

Recorded in docs/benchmarks.md, "Structured outputs: cost in the engine".
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.structured.params import StructuredOutputsParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from schema_factory import schema_set  # noqa: E402

ENDLESS = StructuredOutputsParams(json={"type": "array", "minItems": 200,
                                        "items": {"type": "integer", "minimum": 0, "maximum": 99}})


def step_time(llm: LLM, batch: int, share: float, steps: int, round_id: int) -> float:
    """Mean seconds per decode step of `batch` sequences, `share` of them constrained."""
    engine = llm.engine
    constrained = round(batch * share)
    for i in range(batch):
        params = SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True,
                                structured_outputs=ENDLESS if i < constrained else None)
        engine.add_request(f"r{round_id}-{i}", f"Dog {i} of round {round_id}: list the walks as numbers.", params)
    engine.step_deltas()                     # the prefills (every prompt fits one step)
    engine.step_deltas()                     # first decode: grammars' first masks, warm caches
    start = time.perf_counter()
    for _ in range(steps):
        engine.step_deltas()
    elapsed = (time.perf_counter() - start) / steps
    while engine.has_unfinished_requests():
        engine.step_deltas()
    return elapsed


def compile_times(llm: LLM, count: int) -> tuple[list[float], list[float]]:
    from pagedkube.engine.structured.grammars import GrammarCompiler

    engine = llm.engine
    compiler = GrammarCompiler(engine.tokenizer.files["tokenizer.json"], engine.vocab_size, engine.eos_token_ids)
    cold, cached = [], []
    for schema in schema_set(count):
        params = StructuredOutputsParams(json=schema)
        start = time.perf_counter()
        try:
            compiler.compile(params).result()
        except ValueError:
            continue
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiler.compile(params).result()
        cached.append(time.perf_counter() - start)
    compiler.close()
    return cold, cached


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--schemas", type=int, default=105)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(args.model, device="cpu", max_model_len=1024)
    print(f"model {llm.engine.model_name}, {args.threads} threads, load average {os.getloadavg()[0]:.2f}")
    for batch in (1, 32):
        times: dict[float, list[float]] = {0.0: [], 0.3: [], 1.0: []}
        for r in range(args.rounds):
            for share in times:
                times[share].append(step_time(llm, batch, share, args.steps, r))
        base = statistics.median(times[0.0])
        row = ", ".join(f"{int(share * 100)}% {statistics.median(t) / base:.3f}x" for share, t in times.items())
        print(f"batch {batch:2}: unconstrained step {base * 1e3:.1f} ms; constrained share -> step time {row} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
    cold, cached = compile_times(llm, args.schemas)
    print(f"compile over {len(cold)} schemas: cold p50 {pct(cold, .5) * 1e3:.1f} ms, p99 {pct(cold, .99) * 1e3:.1f} ms; "
          f"cached p50 {pct(cached, .5) * 1e6:.0f} us, p99 {pct(cached, .99) * 1e6:.0f} us "
          f"(load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()

"""Time to first token with a cached 1,000-token prefix vs the same request cold.

A random Qwen2-shaped model of realistic proportions (hidden 512, 8 layers, GQA
8/2 heads, vocab 32k: ~39M parameters) runs on the engine with the prefix cache
on. For each trial a fresh random 1,000-token prefix is used:

    cold:  prefix + suffix A         (nothing cached: the whole prompt is computed)
    warm:  prefix + suffix B         (the prefix's 62 full blocks are hits)

TTFT = the time of LLM.generate with max_tokens=1 (a single step does the
prefill and samples the first token), as wall time and as this process's CPU
time (on a shared machine the wall time mostly measures the neighbours; torch
runs one thread by default here so CPU time is not inflated by spinning
workers). Prints medians and the ratios; the ratio, not the absolute time, is
the result (docs/benchmarks.md).

    .venv/bin/python bench/prefix_cache.py [--trials 5] [--device cpu] [--threads 1]
    .venv/bin/python bench/prefix_cache.py --model smollm2-135m-instruct   # a real model (GGUF)
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path


def make_model(path: Path, seed: int) -> Path:
    import torch
    import transformers as tf
    config = tf.Qwen2Config(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                            num_key_value_heads=2, vocab_size=32000, max_position_embeddings=4096,
                            tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = tf.Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def timed(llm, prompt, params) -> tuple[float, float, int]:
    start, start_cpu = time.perf_counter(), time.process_time()
    out = llm.generate([prompt], params)[0]
    return time.perf_counter() - start, time.process_time() - start_cpu, out.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    parser.add_argument("--suffix-tokens", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--model", default=None,
                        help="a real model instead of the random one: a name, GGUF file or directory")
    args = parser.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from pagedkube.engine import LLM, SamplingParams

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            path, num_params = args.model, None
        else:
            path, num_params = make_model(Path(tmp) / "qwen2-39m", seed=0)
        llm = LLM(str(path), device=args.device, dtype="float32", num_kv_blocks=512,
                  max_num_batched_tokens=2048)
        if num_params is None:
            num_params = sum(p.numel() for p in llm.engine.runner.model.parameters())
        params = SamplingParams(temperature=0.0, max_tokens=1)

        def tokens(n):
            return [rng.randrange(100, min(32000, llm.engine.vocab_size)) for _ in range(n)]

        timed(llm, tokens(64), params)   # warm-up: first-call allocations
        cold, warm = [], []
        for _ in range(args.trials):
            prefix = tokens(args.prefix_tokens)
            *t_cold, cached_cold = timed(llm, prefix + tokens(args.suffix_tokens), params)
            *t_warm, cached_warm = timed(llm, prefix + tokens(args.suffix_tokens), params)
            assert cached_cold == 0 and cached_warm == args.prefix_tokens // llm.engine.block_size * llm.engine.block_size
            cold.append(t_cold)
            warm.append(t_warm)
        stats = llm.engine.stats()
    print(f"model: {args.model or 'random Qwen2'} {num_params / 1e6:.1f}M params, float32, {args.device}, {args.threads} thread(s); "
          f"prompt {args.prefix_tokens}+{args.suffix_tokens} tokens, {args.trials} trials")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"cached: {cached_warm} tokens from the cache (hits {stats.prefix_cache_hits} / "
          f"queries {stats.prefix_cache_queries} tokens over the run)")
    for i, clock in enumerate(("wall", "cpu")):
        c, w = statistics.median(t[i] for t in cold) * 1e3, statistics.median(t[i] for t in warm) * 1e3
        print(f"{clock:4s} TTFT median: cold {c:8.1f} ms, cached {w:7.1f} ms, speedup {c / w:5.1f}x")


if __name__ == "__main__":
    main()

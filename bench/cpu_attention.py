"""The CPU decode attention kernel (engine/attention/cpu_attention.cpp) against torch's decode pass
(engine/attention/torch_backend.py: a float32 gather of the context, then scaled_dot_product_attention
under a mask), one layer of the default model's shape: 9 query heads over 3 KV heads of 64, a
float16 cache (the GGUF default's) or --cache-dtype float32, one decoding sequence (--seqs more),
its blocks scattered over a 4,096-block pool. Each is timed as the fastest of --rounds rounds of
30 calls, the two taking turns; the ratio is torch's time over the kernel's.

    .venv/bin/python bench/cpu_attention.py [--contexts 256,512,1024,2048] [--threads 1]
"""
from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from pagedkube.engine.attention.torch_backend import decode_attention
from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.quant.q4_fused import q4_ext

BLOCK_SIZE, POOL_BLOCKS, KV_HEADS, Q_HEADS, HEAD_DIM = 16, 4096, 3, 9, 64
CALLS = 30


def fastest(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.perf_counter() - start) / CALLS)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="256,512,1024,2048")
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cache-dtype", default="float16", choices=["float16", "float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ops = q4_ext(cache_root())
    if ops is None or not ops.has_attention():
        raise SystemExit("our CPU kernels are not built here (a C++ toolchain and AVX2/FMA/F16C are needed)")
    dtype = getattr(torch, args.cache_dtype)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(POOL_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(POOL_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.seqs} sequence(s), {args.cache_dtype} cache")
    for context in map(int, args.contexts.split(",")):
        width = -(-context // BLOCK_SIZE)
        tables = torch.stack([torch.randperm(POOL_BLOCKS, generator=gen)[:width] for _ in range(args.seqs)])
        lens = torch.full((args.seqs,), context, dtype=torch.int64)
        valid = (torch.arange(width * BLOCK_SIZE)[None, :] < lens[:, None])[:, None, None, :]
        query = torch.randn(args.seqs, Q_HEADS, HEAD_DIM, generator=gen)
        calls = {"torch": partial(decode_attention, query, k, v, tables.reshape(-1), valid, HEAD_DIM ** -0.5),
                 "kernel": partial(ops.decode_attention, query, k, v, tables, lens, HEAD_DIM ** -0.5)}
        diff = float((calls["torch"]() - calls["kernel"]()).abs().max())
        best = {name: float("inf") for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                best[name] = min(best[name], fastest(fn, 1))
        print(f"context {context}: torch {1e6 * best['torch']:.0f} us, kernel {1e6 * best['kernel']:.0f} us per layer; "
              f"torch / kernel {best['torch'] / best['kernel']:.2f}x; max abs difference {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()

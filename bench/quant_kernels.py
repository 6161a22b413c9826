"""Triton W8A16 / W4A16 matmuls against the bf16 dense matmul of the same weight (cuBLAS).

    python bench/quant_kernels.py --device cuda [--out results.jsonl]
    python bench/quant_kernels.py --interpret      # tiny CPU smoke run of this script (numbers meaningless)

Shapes: SmolLM2-135M's projections (hidden 576, intermediate 1536: qkv 960x576, o 576x576,
gate_up 3072x576, down 576x1536) and a 7B-class MLP (gate_up 28672x4096, down 4096x14336),
at M = 1, 16 and 256 tokens, group size 32 (GGUF's Q4_0/Q4_1/Q8_0 block). Achieved bandwidth =
bytes of weights (+ scales, mins) read / time; at M = 1 a matmul is bound by that read, so the
int4 kernel should approach ~3.5x the bf16 one (2 bytes vs 0.5 + 8/32 bytes per weight).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
MLP_7B = [(28672, 4096), (4096, 14336)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda"])
    p.add_argument("--interpret", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1, tiny shapes")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256])
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--out", default=None, help="append one JSON line per measurement to this file")
    return p.parse_args(argv)


def weights(n, k, group, torch, device, gen):
    from pagedkube.engine.quant.formats import Int4Weight, Int8Weight
    q8 = torch.randint(-128, 128, (n, k), generator=gen, device=device, dtype=torch.int8)
    scales = torch.rand(n, k // group, generator=gen, device=device) * 1e-3
    q4 = torch.randint(0, 256, (n, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    return Int8Weight(q8, scales, group), Int4Weight(q4, scales, -8 * scales, group)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
    import torch
    device = "cpu" if args.interpret else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("bench/quant_kernels.py needs CUDA: no CUDA device here. Run it on a GPU machine "
              "(bench/gpu_all.sh), or pass --interpret for a tiny CPU smoke run.")
        return 0
    from pagedkube.engine.quant.formats import dequantize
    from pagedkube.engine.quant.triton_w4a16 import w4a16_matmul
    from pagedkube.engine.quant.triton_w8a16 import w8a16_matmul
    shapes, tokens = (SMOLLM2 + MLP_7B, args.tokens) if not args.interpret else ([(96, 64)], [1, 17])
    if device == "cuda":
        from triton.testing import do_bench
        bench = lambda fn: do_bench(fn, warmup=25, rep=100)   # noqa: E731  (ms, L2 flushed between calls)
    else:
        def bench(fn):
            fn()
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
    gen = torch.Generator(device=device).manual_seed(0)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)"
    meta = dict(device=name, group_size=args.group_size, date=time.strftime("%Y-%m-%d"))
    print(f"# {json.dumps(meta)}")
    out = open(args.out, "a") if args.out else None
    for n, k in shapes:
        w8, w4 = weights(n, k, args.group_size, torch, device, gen)
        dense = dequantize(w8).to(torch.bfloat16)
        scale_bytes = w8.scales.numel() * 4
        for m in tokens:
            x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
            row = dict(n=n, k=k, m=m)
            for label, fn, nbytes in (("bf16", lambda: x @ dense.T, n * k * 2),
                                      ("w8a16", lambda: w8a16_matmul(x, w8), n * k + scale_bytes),
                                      ("w4a16", lambda: w4a16_matmul(x, w4), n * k // 2 + 2 * scale_bytes)):
                ms = bench(fn)
                row[f"{label}_us"] = round(ms * 1e3, 1)
                row[f"{label}_gbps"] = round(nbytes / ms / 1e6, 1)
            row["w8a16_speedup"] = round(row["bf16_us"] / row["w8a16_us"], 2)
            row["w4a16_speedup"] = round(row["bf16_us"] / row["w4a16_us"], 2)
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps({**meta, **row}) + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

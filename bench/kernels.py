"""Paged attention kernels vs torch SDPA on contiguous KV of the same sequences.

    python bench/kernels.py --device cuda [--out results.jsonl]
    python bench/kernels.py --interpret          # tiny CPU smoke run of this script (numbers meaningless)

Decode: batch B, every sequence with a context of C tokens, one query each; our
kernel reads K/V from a pool whose blocks are scattered at random, SDPA reads the
same K/V laid out contiguously [B, Hkv, C, D] (GQA via enable_gqa). Achieved
bandwidth = bytes of K and V read / time (the floor any decode kernel must pay);
the fraction of peak uses the device's nominal HBM bandwidth (--peak-gbps).
Prefill: B cold prompts of L tokens, causal; reported as time and TFLOP/s.
Defaults are Qwen2.5-0.5B's attention shape (14 query heads, 2 KV heads, head_dim 64),
bf16, batch 64 with 4k contexts (the issue's decode target: >= 70% of peak HBM).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Nominal HBM bandwidth in GB/s by device name (vendor datasheets).
PEAK_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0,
             "A100": 1555.0, "L40S": 864.0, "L4": 300.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda"])
    p.add_argument("--interpret", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1, tiny shapes")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--num-q-heads", type=int, default=14)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--decode-batch", type=int, default=64)
    p.add_argument("--decode-context", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--prefill-batch", type=int, default=4)
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--peak-gbps", type=float, default=None, help="nominal HBM GB/s (default: by device name)")
    p.add_argument("--out", default=None, help="append one JSON line per measurement to this file")
    return p.parse_args(argv)


def make_pool(batch, context, args, torch, device, dtype, gen):
    """K/V for `batch` sequences of `context` tokens: the paged pool (scattered blocks) and contiguous copies."""
    bs = args.block_size
    blocks_per_seq = -(-context // bs)
    num_blocks = batch * blocks_per_seq + 1
    shape = (num_blocks, bs, args.num_kv_heads, args.head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen, device=device)[:batch * blocks_per_seq]
    block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    # contiguous [B, Hkv, C, D] views of the same sequences for SDPA
    k = k_cache[block_tables.long()].reshape(batch, blocks_per_seq * bs, args.num_kv_heads, args.head_dim)
    v = v_cache[block_tables.long()].reshape(batch, blocks_per_seq * bs, args.num_kv_heads, args.head_dim)
    k = k[:, :context].transpose(1, 2).contiguous()
    v = v[:, :context].transpose(1, 2).contiguous()
    return k_cache, v_cache, block_tables, k, v


def make_meta(q_lens, seq_lens, block_tables, torch, device):
    from pagedkube.engine.attention.metadata import AttentionMetadata
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables, max_query_len=max(q_lens), max_seq_len=max(seq_lens))


def timer(device):
    """fn -> milliseconds per call (triton's do_bench on CUDA: L2 flushed between calls)."""
    if device == "cuda":
        from triton.testing import do_bench
        return lambda fn: do_bench(fn, warmup=25, rep=200)

    def cpu_time(fn):
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return cpu_time


def bench_decode(args, context, torch, device, dtype, gen, peak, bench, emit):
    import torch.nn.functional as F
    from pagedkube.engine.attention import triton_backend
    batch = args.decode_batch
    k_cache, v_cache, block_tables, k, v = make_pool(batch, context, args, torch, device, dtype, gen)
    meta = make_meta([1] * batch, [context] * batch, block_tables, torch, device)
    query = torch.randn(batch, args.num_q_heads, args.head_dim, generator=gen, device=device,
                        dtype=torch.float32).to(dtype)
    scale = args.head_dim ** -0.5
    q_sdpa = query.unsqueeze(2)                                           # [B, Hq, 1, D]
    sdpa = lambda: F.scaled_dot_product_attention(q_sdpa, k, v, scale=scale, enable_gqa=True)
    auto_splits = triton_backend.choose_num_splits(batch, args.num_kv_heads, 1, context,
                                                   triton_backend._sm_count(torch.device(device)))
    ours = lambda splits=None: triton_backend.paged_attention(query, k_cache, v_cache, meta, scale,
                                                              num_splits=splits)
    err = (ours().float() - sdpa().squeeze(2).float()).abs().max().item()
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * k.element_size()
    t_sdpa = bench(sdpa)
    for label, splits in (("paged auto", None), ("paged 1 split", 1)):
        t = bench(lambda: ours(splits))
        gbps = kv_bytes / (t * 1e-3) / 1e9
        emit(dict(kind="decode", impl=label, splits=auto_splits if splits is None else 1, batch=batch,
                  context=context, ms=t, sdpa_ms=t_sdpa, speedup_vs_sdpa=t_sdpa / t, gbps=gbps,
                  frac_peak=gbps / peak if peak else None, sdpa_gbps=kv_bytes / (t_sdpa * 1e-3) / 1e9,
                  max_abs_err=err))


def bench_prefill(args, torch, device, dtype, gen, bench, emit):
    import torch.nn.functional as F
    from pagedkube.engine.attention import triton_backend
    batch, length = args.prefill_batch, args.prefill_len
    k_cache, v_cache, block_tables, k, v = make_pool(batch, length, args, torch, device, dtype, gen)
    meta = make_meta([length] * batch, [length] * batch, block_tables, torch, device)
    query = torch.randn(batch * length, args.num_q_heads, args.head_dim, generator=gen, device=device,
                        dtype=torch.float32).to(dtype)
    scale = args.head_dim ** -0.5
    q_sdpa = query.view(batch, length, args.num_q_heads, args.head_dim).transpose(1, 2)
    sdpa = lambda: F.scaled_dot_product_attention(q_sdpa, k, v, is_causal=True, scale=scale, enable_gqa=True)
    ours = lambda: triton_backend.paged_attention(query, k_cache, v_cache, meta, scale)
    ref = sdpa().transpose(1, 2).reshape(batch * length, args.num_q_heads, args.head_dim)
    err = (ours().float() - ref.float()).abs().max().item()
    flops = 4 * batch * args.num_q_heads * args.head_dim * length * length / 2     # causal half of QK^T and PV
    t, t_sdpa = bench(ours), bench(sdpa)
    emit(dict(kind="prefill", impl="paged", batch=batch, length=length, ms=t, sdpa_ms=t_sdpa,
              speedup_vs_sdpa=t_sdpa / t, tflops=flops / (t * 1e-3) / 1e12,
              sdpa_tflops=flops / (t_sdpa * 1e-3) / 1e12, max_abs_err=err))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
        args.decode_batch, args.decode_context = 2, [40, 520]   # 520: auto split-K (2 splits)
        args.prefill_batch, args.prefill_len = 1, 24
        args.block_size = 8
    import torch
    device = "cpu" if args.interpret else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("bench/kernels.py needs CUDA: no CUDA device here. Run it on a GPU machine "
              "(bench/gpu_all.sh), or pass --interpret for a tiny CPU smoke run.")
        return 0
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)"
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
    bench = timer(device)
    meta = dict(device=name, dtype=args.dtype, heads=f"{args.num_q_heads}q/{args.num_kv_heads}kv",
                head_dim=args.head_dim, block_size=args.block_size, peak_gbps=peak,
                date=time.strftime("%Y-%m-%d"))
    print(f"# {json.dumps(meta)}")
    out = open(args.out, "a") if args.out else None

    def emit(row):
        row = {**meta, **row}
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k not in meta}
        print(json.dumps(shown))
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    for context in args.decode_context:
        bench_decode(args, context, torch, device, dtype, gen, peak, bench, emit)
    bench_prefill(args, torch, device, dtype, gen, bench, emit)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

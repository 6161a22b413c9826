"""Resident memory (and one-client decode speed) of the engine with fp32, int8 and int4 weights.

Each mode runs in its own fresh process (so one mode's freed memory cannot hide
another's): load the default model (smollm2-135m-instruct, the Q4_1 GGUF) with a small
KV pool (so the weights dominate), greedy-generate a pet-care answer of --tokens tokens
one client at a time, and report the process's resident set size after the run (VmRSS)
and its peak (VmHWM, the load's high-water mark), plus decode tokens/s. The fp32
reference (--quantization none) runs in the same script, so the ratios hold on a shared
machine even where the absolute speeds do not.

    .venv/bin/python bench/quant_memory.py                       # every mode, 2 threads
    .venv/bin/python bench/quant_memory.py --modes none:float32,auto:bfloat16

Record the table in docs/benchmarks.md ("Quantized weights: memory").
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

# quantization:dtype, the fp32 dequantized reference first
DEFAULT_MODES = "none:float32,auto:float32,int8:float32,int4:float32,auto:bfloat16,int8:bfloat16,int4:bfloat16"
KV_BLOCKS = 64        # 1024 tokens of KV: ~4 MB in fp32 for SmolLM2, small beside any weights
QUESTION = "My dog keeps scratching his ears. What should I do?"


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(quantization: str, dtype: str, tokens: int, threads: int, model: str | None) -> dict:
    import torch

    torch.set_num_threads(threads)
    from pagedkube.engine import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model, device="cpu", dtype=dtype, quantization=quantization, num_kv_blocks=KV_BLOCKS,
              attention_backend="torch")
    load_s = time.perf_counter() - t0
    ids = llm.get_tokenizer().encode_chat([{"role": "user", "content": QUESTION}])
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=2))          # warm-up
    t0 = time.perf_counter()
    llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=1))
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    llm.generate(ids, params)
    total_s = time.perf_counter() - t0
    kernels = sorted({m.kernel.name for m in llm.engine.runner.model.modules() if hasattr(m, "kernel")})
    return dict(quantization=quantization, dtype=dtype, load_s=round(load_s, 2),
                rss_mib=round(_status_kib("VmRSS") / 1024, 1), peak_mib=round(_status_kib("VmHWM") / 1024, 1),
                decode_tok_s=round((tokens - 1) / max(total_s - prefill_s, 1e-9), 2), kernels=kernels)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated quantization:dtype")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        q, dt = args.child.split(":")
        print(json.dumps(child(q, dt, args.tokens, args.threads, args.model)))
        return 0
    rows = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--child", mode, "--tokens", str(args.tokens), "--threads", str(args.threads)]
        if args.model:
            cmd += ["--model", args.model]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    print("\n| quantization | dtype | kernels | RSS after (MiB) | peak (MiB) | vs first | decode tok/s | vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['quantization']} | {r['dtype']} | {', '.join(r['kernels']) or 'nn.Linear'} | {r['rss_mib']} | "
              f"{r['peak_mib']} | {r['rss_mib'] / base['rss_mib']:.2f} | {r['decode_tok_s']} | "
              f"{r['decode_tok_s'] / base['decode_tok_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

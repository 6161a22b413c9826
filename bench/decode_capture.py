"""Whole decode-step capture against eager (issue 20 item 4): inter-token latency and tokens/s.

Two engines on the same model in one process, --decode-capture off and on (torch.compile of the
decode step per batch bucket on CPU, CUDA graphs on CUDA), and for each, rounds interleaved:

- one client: a --prompt-tokens prompt, --tokens greedy tokens; ITL = the engine step's time
  for each decode step (median), tok/s = output tokens / the request's whole time (prefill too);
- --clients together (default 8, the largest default bucket): the same per step, batch = clients.

The captured engine's compile (or capture) time per bucket is printed at start: run with a fresh
TORCHINDUCTOR_CACHE_DIR (the default here: a temporary directory) to time a cold compile.
Times are wall time and this thread's CPU time (with --threads 1, CPU time is what the step costs
on a shared machine). Ratios are captured / eager of the same run.

    .venv/bin/python bench/decode_capture.py --threads 1                 # the default model, CPU
    .venv/bin/python bench/decode_capture.py --device cuda --threads 8   # bench/gpu_all.sh
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2)


class Probe:
    def __init__(self, args, capture: str):
        from pagedkube.engine.config import EngineConfig
        from pagedkube.engine.llm_engine import LLMEngine
        t = time.perf_counter()
        self.engine = LLMEngine(EngineConfig(
            model=args.model, device=args.device, dtype=args.dtype, quantization=args.quantization,
            max_model_len=args.prompt_tokens + args.tokens + 64, enable_prefix_caching=False,
            decode_capture=capture, decode_capture_sizes=tuple(args.sizes)))
        self.capture = capture
        runner = self.engine.runner
        self.start_s = round(time.perf_counter() - t, 1)
        self.compile_s = runner.decode_capture.compile_seconds if runner.decode_capture else {}
        self.dtype = str(runner.dtype).removeprefix("torch.")
        self.sync = (lambda: __import__("torch").cuda.synchronize()) if runner.device.type == "cuda" else (lambda: None)
        vocab = self.engine.vocab_size
        self.prompts = [[(7 * i + 13 * c + 3) % (vocab - 10) + 5 for i in range(args.prompt_tokens)]
                        for c in range(args.clients)]
        self.rounds = 0

    def round(self, clients: int, tokens: int) -> dict:
        from pagedkube.engine.sampling_params import SamplingParams
        engine = self.engine
        self.rounds += 1
        for c in range(clients):
            engine.add_request(f"r{self.rounds}-{c}", self.prompts[c],
                               SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
        walls, cpus = [], []
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            w, c = time.perf_counter(), time.thread_time()
            engine.step_deltas()
            self.sync()
            walls.append(time.perf_counter() - w)
            cpus.append(time.thread_time() - c)
        total = time.perf_counter() - t0
        decode_w, decode_c = walls[-(tokens - 1):], cpus[-(tokens - 1):]   # the steps after the prefill's
        return {"capture": self.capture, "clients": clients, "itl_ms": _ms(decode_w), "itl_cpu_ms": _ms(decode_c),
                "tok_s": round(clients * tokens / total, 1),
                "decode_tok_s": round(clients * len(decode_w) / sum(decode_w), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time is the step's cost)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8], help="capture buckets (default 1 and 8)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-cache", action="store_true", help="keep Inductor's cache (default: a fresh one, cold compile)")
    args = ap.parse_args()
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    import torch
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, model {args.model}, device {args.device}", flush=True)
    probes = [Probe(args, "off"), Probe(args, "on")]
    for p in probes:
        print(json.dumps({"capture": p.capture, "dtype": p.dtype, "engine_start_s": p.start_s,
                          "compile_s_per_bucket": p.compile_s}), flush=True)
    results: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        for clients in (1, args.clients):
            for p in probes:
                row = p.round(clients, args.tokens)
                print(f"round {r}", json.dumps(row), flush=True)
                results.setdefault((p.capture, clients), []).append(row)
    print("median over rounds, and captured / eager:")
    for clients in (1, args.clients):
        med = {cap: {k: statistics.median(row[k] for row in results[(cap, clients)])
                     for k in ("itl_ms", "itl_cpu_ms", "tok_s", "decode_tok_s")} for cap in ("off", "on")}
        ratio = {"itl_speedup": round(med["off"]["itl_ms"] / med["on"]["itl_ms"], 2),
                 "itl_cpu_speedup": round(med["off"]["itl_cpu_ms"] / med["on"]["itl_cpu_ms"], 2),
                 "tok_s_ratio": round(med["on"]["tok_s"] / med["off"]["tok_s"], 2)}
        print(json.dumps({"clients": clients, "eager": med["off"], "captured": med["on"], **ratio}), flush=True)
    captured = probes[1].engine.runner.decode_capture
    print(json.dumps({"captured_steps": captured.num_captured_steps if captured else 0}))


if __name__ == "__main__":
    main()

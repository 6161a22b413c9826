"""A tensor-parallel decode step against TP=1: time, the all-reduce share, and bytes per step per rank.

    .venv/bin/python bench/tp_step.py                         # CPU (gloo): TP 1 and 2, batch 1 and 32
    .venv/bin/python bench/tp_step.py --device cuda --dtype bfloat16 --tp 1 2 4 8   # NCCL (bench/gpu_all.sh)

The model is random weights in Qwen2.5-0.5B's layer shape (hidden 896, 14 heads, 2 KV heads,
MLP 4864; TP 2 is the largest size its KV heads allow, so TP 4/8 use --kv-heads 8 --heads 16),
--layers deep, with a 32,000-token vocabulary (--hidden, --heads and --kv-heads change the shape). For each TP size one engine is built; for each
batch size B it prefills B prompts of --prompt-tokens, then times --steps decode steps
(engine.step_deltas, B tokens each) and reports the median. On rank 0 the group's counters
(engine/distributed/group.py) give the wall time inside all-reduces (waiting for the slower
rank included) and the bytes this rank sent per step: all-reduces (2 per layer + the
embedding's, B x hidden each), the logits' gather (B x vocab / N) and the step's broadcast.
Bytes per step per rank is the number that carries over to NVLink or a network; the CPU times
are what 2 cores shared by N processes give. Record in docs/benchmarks.md, "Tensor parallelism".
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def make_model(path: Path, hidden: int, layers: int, heads: int, kv_heads: int) -> Path:
    import torch
    import transformers as tf

    config = tf.Qwen2Config(hidden_size=hidden, intermediate_size=4864, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=32000,
                            max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=0.02)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return path


def measure(engine, batch: int, prompt_tokens: int, steps: int, warmup: int) -> dict:
    from pagedkube.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 2, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, [(7 * i + j) % 31000 + 100 for j in range(prompt_tokens)], params)
    while engine.stats().num_waiting:            # prefill (and the first token) of every prompt
        engine.step_deltas()
    for _ in range(warmup):
        engine.step_deltas()
    group = engine.runner.tp_group
    before = _counters(group)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step_deltas()
        times.append(time.perf_counter() - start)
    after = _counters(group)
    for request_id in ids:
        engine.abort_request(request_id)
    step_s = statistics.median(times)
    moved = {k: (after[k] - before[k]) / steps for k in after}
    return {"batch": batch, "step_ms": round(step_s * 1e3, 2),
            "all_reduce_share": round(moved["all_reduce_seconds"] * steps / sum(times), 3) if group else 0.0,
            "all_reduces_per_step": moved["num_all_reduces"],
            "bytes_per_step_per_rank": int(moved["all_reduce_bytes"] + moved["gather_bytes"]
                                           + moved["broadcast_bytes"]),
            "all_reduce_bytes": int(moved["all_reduce_bytes"]), "gather_bytes": int(moved["gather_bytes"]),
            "broadcast_bytes": int(moved["broadcast_bytes"])}


def _counters(group) -> dict[str, float]:
    from dataclasses import asdict

    from pagedkube.engine.distributed.group import CommStats

    return asdict(group.stats if group is not None else CommStats())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads, shared out between ranks")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()

    import torch

    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.llm_engine import LLMEngine

    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
                      "cpu": _cpu_model(), "threads": args.threads, "loadavg": Path("/proc/loadavg").read_text().split()[:3],
                      "hidden": args.hidden, "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads}))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", args.hidden, args.layers, args.heads, args.kv_heads)
        for tp in args.tp:
            torch.set_num_threads(args.threads)       # a TP engine shares them out between its ranks
            engine = LLMEngine(EngineConfig(model=str(model), device=args.device, dtype=args.dtype,
                                            tensor_parallel_size=tp, max_num_seqs=max(args.batch),
                                            max_model_len=1024, num_kv_blocks=max(args.batch) * 8))
            try:
                for batch in args.batch:
                    row = {"tp": tp, **measure(engine, batch, args.prompt_tokens, args.steps, args.warmup)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                engine.shutdown()
    base = {r["batch"]: r["step_ms"] for r in rows if r["tp"] == 1}
    print("\n| TP | batch | step ms | vs TP=1 | all-reduce share | all-reduces/step | bytes/step/rank |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['step_ms'] / base[r['batch']]:.2f}x" if r["batch"] in base else "-"
        print(f"| {r['tp']} | {r['batch']} | {r['step_ms']} | {ratio} | {r['all_reduce_share']:.0%} | "
              f"{r['all_reduces_per_step']:.0f} | {r['bytes_per_step_per_rank']:,} |")


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()

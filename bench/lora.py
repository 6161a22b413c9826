"""Multi-LoRA throughput: a closed loop of 32 clients over the base model only, then with 1, 4
and 16 distinct adapters mixed in (every request names one, round-robin), as a ratio of the
base-only throughput in the same process; and adapter load latency.

Model: bench/engine_throughput.py's random 40.5M-parameter Qwen2 shape (float32); adapters:
rank 16 on all seven projections, random A and B (the arithmetic is what is measured), in
PEFT's file format. --max-loras 16, so the 16-adapter run keeps every adapter resident.

    .venv/bin/python bench/lora.py                 # CPU, 1 thread
    .venv/bin/python bench/lora.py --device cuda   # the Triton kernels

On CPU a run is timed in the process's CPU seconds (one torch thread), on CUDA in wall time;
the four configurations run in interleaved rounds and each keeps its best. Prints output tokens/s per run, the ratio to base-only, and the load latencies. Record
results in docs/benchmarks.md, "LoRA adapters".
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine_throughput import CPU_SHAPE, make_model

CLIENTS = 32
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(path: Path, shape: dict, rank: int, seed: int) -> Path:
    """A random rank-`rank` PEFT adapter of every projection of `shape`'s model."""
    gen = torch.Generator().manual_seed(seed)
    h, i = shape["hidden_size"], shape["intermediate_size"]
    head = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head
    sizes = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h), "gate_proj": (i, h),
             "up_proj": (i, h), "down_proj": (h, i)}
    tensors = {}
    for layer in range(shape["num_hidden_layers"]):
        for module, (out_f, in_f) in sizes.items():
            parent = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * in_f ** -0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * 0.01
    path.mkdir(parents=True)
    save_file(tensors, path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                          "target_modules": list(TARGETS), "bias": "none"}))
    return path


def closed_loop(engine, workload, loras) -> tuple[float, int]:
    """CLIENTS requests in flight until the workload is done: (CPU seconds of this process,
    output tokens). CPU time, not wall time: on a shared machine the neighbours take the cores
    away for seconds at a time, and with one torch thread the process's CPU time is its work."""
    from pagedkube.engine import SamplingParams

    todo = list(enumerate(workload))
    in_flight, tokens = set(), 0
    start = time.process_time() if engine.runner.device.type == "cpu" else time.perf_counter()
    while todo or in_flight:
        while todo and len(in_flight) < CLIENTS:
            i, (prompt, n) = todo.pop(0)
            engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                               lora_request=loras[i % len(loras)] if loras else None)
            in_flight.add(f"r{i}")
        for delta in engine.step_deltas():
            tokens += sum(len(s.token_ids) for s in delta.samples)
            if delta.finished:
                in_flight.discard(delta.request_id)
    if engine.runner.device.type != "cpu":
        torch.cuda.synchronize()
        return time.perf_counter() - start, tokens
    return time.process_time() - start, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each run counts")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from pagedkube.engine import LoRARequest
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.llm_engine import LLMEngine

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_model(root / "model", CPU_SHAPE)
        paths = [make_adapter(root / f"a{k}", CPU_SHAPE, args.rank, k) for k in range(16)]
        workload = [([rng.randrange(2, CPU_SHAPE["vocab_size"]) for _ in range(rng.randint(32, 128))],
                     rng.randint(16, 48)) for _ in range(args.requests)]
        engine = LLMEngine(EngineConfig(model=str(model), device=args.device, dtype="float32" if args.device == "cpu"
                                        else "bfloat16", enable_lora=True, max_loras=16, max_lora_rank=args.rank))
        loras = [LoRARequest(f"a{k}", k + 1, str(p)) for k, p in enumerate(paths)]
        reads = []
        for lora in loras:                      # read + check into host memory (add_lora)
            t = time.perf_counter()
            engine.add_lora(lora)
            reads.append(time.perf_counter() - t)
        manager = engine.runner.lora
        copies = []
        for lora in loras:                      # host memory -> a device slot
            t = time.perf_counter()
            manager._slot_of(lora, set())
            if args.device == "cuda":
                torch.cuda.synchronize()
            copies.append(time.perf_counter() - t)
        closed_loop(engine, workload[:8], [])  # warm-up
        results: dict[str, float] = {}
        for _ in range(args.rounds):           # interleaved rounds, best of each: neighbours' load is noise
            for label, n in (("base", 0), ("1 adapter", 1), ("4 adapters", 4), ("16 adapters", 16)):
                seconds, tokens = closed_loop(engine, workload, loras[:n])
                results[label] = max(results.get(label, 0.0), tokens / seconds)
                print(f"{label:12s} {tokens} tokens in {seconds:6.1f} s: {tokens / seconds:7.1f} tok/s", flush=True)
    base = results["base"]
    for label in ("1 adapter", "4 adapters", "16 adapters"):
        print(f"{label:12s} throughput / base-only = {results[label] / base:.3f} (slowdown {base / results[label]:.2f}x)")
    print(f"adapter load: read+check median {statistics.median(reads) * 1e3:.1f} ms, into a slot median "
          f"{statistics.median(copies) * 1e3:.1f} ms (rank {args.rank}, {CPU_SHAPE['num_hidden_layers']} layers x 7)")
    print(f"torch threads {torch.get_num_threads()}, device {args.device}")


if __name__ == "__main__":
    main()

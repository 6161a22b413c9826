"""Where a batch-1 decode step's time goes, and what bf16 activations and capture change.

For each --dtype (default float32 and bfloat16) one engine on the default model runs a
--prompt-tokens prefill and then --steps greedy decode steps of one request, timed per
phase (the engine step, inside it the runner's prepare / model forward / lm_head / sampler,
the rest is scheduler + output processing). Then torch.profiler over --profile-steps more
forwards splits the forward into matmul ops (aten::mm/addmm/linear and the int8/int4 packed
matmuls), the other aten ops, and what no op accounts for (Python, module calls, dispatch).

    .venv/bin/python bench/decode_step.py                              # smollm2-135m-instruct, 2 threads
    .venv/bin/python bench/decode_step.py --dtype float32 --compile    # also the captured step

Medians; run on a shared machine, compare the rows of one run, not runs. Record in
docs/benchmarks.md, "Decode step (CPU)".
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int4pack_mm")


class PhaseTimer:
    """Wraps a bound method so every call's time is appended to times[name]: wall time, or
    with cpu=True this thread's CPU time (with 1 torch thread all the work runs on it, and CPU
    time does not count the time other processes of a shared machine hold the core)."""

    def __init__(self, cpu: bool):
        self.times: dict[str, list[float]] = defaultdict(list)
        self.clock = time.thread_time if cpu else time.perf_counter

    def wrap(self, obj, attr: str, name: str) -> None:
        inner, clock = getattr(obj, attr), self.clock

        def timed(*args, **kwargs):
            t = clock()
            result = inner(*args, **kwargs)
            self.times[name].append(clock() - t)
            return result
        setattr(obj, attr, timed)


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2) if values else float("nan")


def profile_forward(runner, batch, steps: int, clock) -> dict[str, float]:
    """ms per forward: wall (or CPU) time, matmul ops' self time, other ops' self time, the rest."""
    from torch.profiler import ProfilerActivity, profile
    step = runner.prepare(batch)
    with torch.inference_mode():
        runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)   # warm
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = clock()
            for _ in range(steps):
                runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
            wall = (clock() - t) / steps
    matmul = other = 0.0
    for evt in prof.key_averages():
        if not evt.key.startswith("aten::"):
            continue
        if evt.key in MATMUL_OPS:
            matmul += evt.self_cpu_time_total
        else:
            other += evt.self_cpu_time_total
    matmul, other = matmul / steps / 1e3, other / steps / 1e3
    ms = wall * 1e3
    return {"forward_ms": round(ms, 2), "matmul_ms": round(matmul, 2), "other_ops_ms": round(other, 2),
            "outside_ops_ms": round(ms - matmul - other, 2), "matmul_share": round(matmul / ms, 3)}


def run(model: str, dtype: str, args) -> dict:
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.llm_engine import LLMEngine
    from pagedkube.engine.sampling_params import SamplingParams
    from pagedkube.engine.sequence import ScheduledSeq

    extra = {"enforce_eager": False} if args.compile else {}
    t = time.perf_counter()
    engine = LLMEngine(EngineConfig(model=model, dtype=dtype, max_model_len=args.prompt_tokens + args.steps + 64,
                                    **extra))
    load_s = time.perf_counter() - t
    timer = PhaseTimer(cpu=args.cpu_time)
    runner = engine.runner
    timer.wrap(engine, "_step", "engine_step")
    timer.wrap(runner, "execute", "runner_execute")
    timer.wrap(runner, "prepare", "prepare")
    timer.wrap(runner.model, "forward", "forward")
    timer.wrap(runner.model, "compute_logits", "lm_head")
    timer.wrap(runner, "sampler", "sampler")      # execute() only calls it: a plain function stands in
    vocab = engine.vocab_size
    prompt = [(7 * i + 3) % (vocab - 10) + 5 for i in range(args.prompt_tokens)]
    engine.add_request("probe", prompt, SamplingParams(max_tokens=args.steps + 1, temperature=0.0, ignore_eos=True))
    engine.step_deltas()                                   # the prefill
    prefill_ms = timer.times["engine_step"][-1] * 1e3
    for values in timer.times.values():
        values.clear()
    while engine.has_unfinished_requests():
        engine.step_deltas()
    row = {"dtype": dtype, "compile": args.compile, "load_s": round(load_s, 1), "prefill_ms": round(prefill_ms, 1),
           "prefill_tokens": args.prompt_tokens}
    for name in ("engine_step", "runner_execute", "prepare", "forward", "lm_head", "sampler"):
        row[name + "_ms"] = _median_ms(timer.times[name][1:])
    row["outside_runner_ms"] = round(row["engine_step_ms"] - row["runner_execute_ms"], 2)
    row["decode_tok_s"] = round(1e3 / row["engine_step_ms"], 1)
    if args.profile_steps:
        seq = profile_seq(engine, prompt)
        row.update(profile_forward(runner, [ScheduledSeq(seq, 1)], args.profile_steps, timer.clock))
    return row


def profile_seq(engine, prompt):
    """A sequence with the prompt's KV in the pool, rewound one token: each profiled
    forward recomputes the prompt's last token (a decode at position len(prompt) - 1)."""
    from pagedkube.engine.sampling_params import SamplingParams
    engine.add_request("profile", prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.step_deltas()
    seq = next(s for s in engine.scheduler.running if s.request_id == "profile")
    seq.num_computed_tokens = len(prompt) - 1
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", action="append", help="repeatable; default float32 and bfloat16")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (2: this machine's cores)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with this thread's CPU time (use with --threads 1 on a shared machine)")
    ap.add_argument("--compile", action="store_true", help="run the engine with enforce_eager=False")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = "thread CPU time" if args.cpu_time else "wall time"
    print(f"torch {torch.__version__}, {args.threads} threads, {clock}, model {args.model}")
    for dtype in args.dtype or ["float32", "bfloat16"]:
        print(run(args.model, dtype, args), flush=True)


if __name__ == "__main__":
    main()

"""Where a batch-1 decode step's time goes, and what bf16 activations and packed weights change.

For each --quantization x --dtype (default float32 and bfloat16) one engine on the model runs a
--prompt-tokens prefill and then --steps greedy decode steps of one request, timed per
phase (the engine step, inside it the runner's prepare / model forward / lm_head / sampler,
the rest is scheduler + output processing). Then torch.profiler over --profile-steps more
forwards splits the forward into matmul ops (aten::mm/addmm/linear and the int8/int4 packed
matmuls), the other aten ops, and what no op accounts for (Python, module calls, dispatch).

    .venv/bin/python bench/decode_step.py                              # smollm2-135m-instruct, 2 threads
    .venv/bin/python bench/decode_step.py --threads 1 --cpu-time --quantization auto --quantization int4

Rounds are interleaved across the engines and each engine's best round is reported; on a
shared machine compare the rows of one run, not runs. Record in
docs/benchmarks.md, "Decode step (CPU)".
"""
from __future__ import annotations

import argparse
import json
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


def profile_forward(runner, batch, steps: int) -> dict[str, float]:
    """Shares of a forward's wall time under torch.profiler: matmul ops' self time, the other
    aten ops' self time, and the rest (Python, module calls, dispatch above the ops). Shares, not
    ms: the profiler's clock is wall time, which a shared machine inflates."""
    from torch.profiler import ProfilerActivity, profile
    step = runner.prepare(batch)
    with torch.inference_mode():
        runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)   # warm
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            for _ in range(steps):
                runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
            wall_us = (time.perf_counter() - t) * 1e6
    matmul = other = 0.0
    calls = 0
    for evt in prof.key_averages():
        if not evt.key.startswith("aten::"):
            continue
        if evt.key in MATMUL_OPS:
            matmul += evt.self_cpu_time_total
        else:
            other += evt.self_cpu_time_total
        calls += evt.count
    return {"matmul_share": round(matmul / wall_us, 3), "other_ops_share": round(other / wall_us, 3),
            "outside_ops_share": round(1 - (matmul + other) / wall_us, 3),
            "aten_calls_per_forward": calls // steps}


class Probe:
    """One engine (one quantization and dtype) with its phases timed. On CUDA only the
    engine step is synchronised (the sampler reads its tokens back); the phases inside are
    launch times."""

    def __init__(self, model: str, dtype: str, args, quantization: str | None = None):
        from pagedkube.engine.config import EngineConfig
        from pagedkube.engine.llm_engine import LLMEngine

        extra = {} if quantization is None else {"quantization": quantization}
        t = time.perf_counter()
        self.engine = LLMEngine(EngineConfig(model=model, device=args.device, dtype=dtype,
                                             max_model_len=args.prompt_tokens + args.steps + 64,
                                             enable_prefix_caching=False,     # every round prefills
                                             decode_capture="off",            # the eager step, phase by phase
                                             **extra))
        self.label = {"quantization": quantization, "dtype": dtype, "load_s": round(time.perf_counter() - t, 1)}
        self.timer = PhaseTimer(cpu=args.cpu_time)
        engine, runner = self.engine, self.engine.runner
        self.timer.wrap(engine, "_step", "engine_step")
        self.timer.wrap(runner, "execute", "runner_execute")
        self.timer.wrap(runner, "prepare", "prepare")
        self.timer.wrap(runner.model, "forward", "forward")
        self.timer.wrap(runner.model, "compute_logits", "lm_head")
        self.timer.wrap(runner, "sampler", "sampler")      # execute() only calls it: a plain function stands in
        vocab = engine.vocab_size
        self.prompt = [(7 * i + 3) % (vocab - 10) + 5 for i in range(args.prompt_tokens)]
        self.rounds = 0

    def round(self, steps: int) -> dict:
        """One request: its prefill, then `steps` decode steps; medians of this round."""
        from pagedkube.engine.sampling_params import SamplingParams
        engine, times = self.engine, self.timer.times
        self.rounds += 1
        engine.add_request(f"probe{self.rounds}", self.prompt,
                           SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True))
        for values in times.values():
            values.clear()
        engine.step_deltas()                                   # the prefill
        row = {**self.label, "prefill_ms": round(times["engine_step"][-1] * 1e3, 1),
               "prefill_tokens": len(self.prompt)}
        for values in times.values():
            values.clear()
        while engine.has_unfinished_requests():
            engine.step_deltas()
        for name in ("engine_step", "runner_execute", "prepare", "forward", "lm_head", "sampler"):
            row[name + "_ms"] = _median_ms(times[name][1:])
        row["outside_runner_ms"] = round(row["engine_step_ms"] - row["runner_execute_ms"], 2)
        row["decode_tok_s"] = round(1e3 / row["engine_step_ms"], 1)
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
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", action="append", help="repeatable; default float32 and bfloat16")
    ap.add_argument("--quantization", action="append",
                    help="repeatable (engine --quantization values); default: the engine's default")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (2: this machine's cores)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, interleaved across the engines")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with this thread's CPU time (use with --threads 1 on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = "thread CPU time" if args.cpu_time else "wall time"
    print(f"torch {torch.__version__}, {args.threads} threads, {clock}, model {args.model}, device {args.device}")
    probes = [Probe(args.model, dtype, args, quant) for quant in args.quantization or [None]
              for dtype in args.dtype or ["float32", "bfloat16"]]
    best: dict[int, dict] = {}
    for r in range(args.rounds):
        for i, probe in enumerate(probes):
            row = probe.round(args.steps)
            print(f"round {r}", row, flush=True)
            if i not in best or row["engine_step_ms"] < best[i]["engine_step_ms"]:
                best[i] = row
    print("best round per engine (lowest decode step median):")
    for i, probe in enumerate(probes):
        row = best[i]
        if args.profile_steps:
            from pagedkube.engine.sequence import ScheduledSeq
            seq = profile_seq(probe.engine, probe.prompt)
            row.update(profile_forward(probe.engine.runner, [ScheduledSeq(seq, 1)], args.profile_steps))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

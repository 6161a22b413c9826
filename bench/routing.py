"""Routing benchmark: prefix-aware routing vs round-robin and least-load.

    .venv/bin/python bench/routing.py [--engines 4] [--kv-blocks 320] [--sessions 32] [--concurrency 32]
                                      [--think-ms 500] [--load-bound 1.5] [--seed 0]
                                      [--policies round-robin,least-load,prefix] [--prefix-variant NAME:FLAGS]
                                      [--routers 1,2] [--vllm-router]
                                      [--only overhead|WORKLOAD] [--out build/bench/routing]

Starts N engines (`pagedkube serve`, built-in model, a small KV pool each) and
one gateway per policy over them (the prefix router once per --load-bound),
plus one engine with N times the pool (the "ideal" cache: everything on one
engine, no routing), and runs the workloads of bench/workloads.py once per
policy. With --routers 1,2 the prefix router also runs as two gateway replicas,
and with --vllm-router vLLM's router (policy cache_aware) runs with each replica
count on the same engines (bench/routers.py; requests split at random). Each turn waits for a seeded exponential user think time first (the
same for every policy), so sessions arrive independently: with --think-ms 0
the closed loop keeps arrivals in lockstep, and round-robin's counter then
sends a session back to its previous engine more often than chance. Each
policy run uses its own cache_salt, so it starts from a cold cache on the same
engines (salted blocks never match).

Reports per workload and policy: prefix-cache hit rate (from the engines'
vllm:prefix_cache_{hits,queries}_total), TTFT p50/p99 (client-side, streaming),
throughput, and max/mean in-flight load across engines (sampled from the
gateway's pagedkube_gateway_endpoint_in_flight). Then the gateway's own
overhead: the same requests straight to a null engine (answers at once, serves
the built-in tokenizer and an empty cache feed) and through a gateway in front
of it; the difference of the p50 latencies is routing (render, tokenize, hash,
pick) plus proxying.

Writes results.json and routing.png to --out; docs/benchmarks.md quotes them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pagedkube.gateway.routing.pending import pending_ttl_for  # noqa: E402
from routers import (Setup, engine_loads, gateway_loads, have_vllm_router, replica,  # noqa: E402
                     start_vllm_router, wait_router)
from routing_overhead import overhead  # noqa: E402
from routing_procs import MODEL, REPO, Procs, decisions, free_port, in_flight, percentile, scrape, wait_ready  # noqa: E402
from workloads import Workload, long_document_qa, no_shared_prefix, petcare_chat  # noqa: E402

POLICIES = ("round-robin", "least-load", "prefix")


def think_time(seed: int, session_id: str, turn: int, mean_s: float) -> float:
    """A user's pause before sending turn `turn` (for turn 0: the session's arrival
    offset): exponential with mean `mean_s`, the same for every policy's run."""
    return random.Random(f"{seed}/{session_id}/{turn}").expovariate(1 / mean_s) if mean_s > 0 else 0.0


async def run_workload(url: str | list[str], workload: Workload, salt: str, concurrency: int, think_s: float = 0.0,
                       seed: int = 0) -> dict:
    """Runs every session (turns in order, each with the real replies so far),
    `concurrency` sessions at a time, each turn after the user's think time,
    each request to one of `url`'s router replicas (routers.replica).
    Returns client-side timings."""
    urls = [url] if isinstance(url, str) else url
    queue: asyncio.Queue = asyncio.Queue()
    for session in workload.sessions:
        queue.put_nowait(session)
    ttfts, latencies, output_tokens = [], [], 0
    stayed = moved = 0  # later turns on the engine of the session's previous turn, or not
    turns: list[dict] = []  # per request: where it went, why, and what the engine had cached

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal output_tokens, stayed, moved
        while not queue.empty():
            session = queue.get_nowait()
            previous = None
            for turn in range(session.num_turns):
                await asyncio.sleep(think_time(seed, session.session_id, turn, think_s))
                body = {"model": MODEL, "messages": session.messages(turn), "max_tokens": session.max_tokens,
                        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                        "cache_salt": salt}
                start, first, text = time.perf_counter(), None, []
                target = urls[replica(seed, session.session_id, turn, len(urls))]
                async with client.stream("POST", target + "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
                    engine = r.headers.get("x-pagedkube-endpoint")
                    record = {"session": session.session_id, "turn": turn, "engine": engine,
                              "reason": r.headers.get("x-pagedkube-route")}
                    if previous is not None and engine is not None:
                        stayed, moved = stayed + (engine == previous), moved + (engine != previous)
                    previous = engine
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[6:])
                        if event["choices"] and first is None:
                            first = time.perf_counter()
                        text += [c["delta"].get("content") or "" for c in event["choices"]]
                        if event.get("usage"):
                            usage = event["usage"]
                            output_tokens += usage["completion_tokens"]
                            record["prompt_tokens"] = usage["prompt_tokens"]
                            record["cached_tokens"] = usage["prompt_tokens_details"]["cached_tokens"]
                end = time.perf_counter()
                ttfts.append((first or end) - start)
                latencies.append(end - start)
                session.replies.append("".join(text))
                turns.append(record)

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return {"wall_s": time.perf_counter() - started, "ttft": ttfts, "latency": latencies,
            "output_tokens": output_tokens,
            "usage_cached_tokens": sum(t.get("cached_tokens", 0) for t in turns),
            "usage_prompt_tokens": sum(t.get("prompt_tokens", 0) for t in turns),
            "same_engine_as_previous_turn": stayed / (stayed + moved) if stayed + moved else float("nan"),
            "turns": turns}


async def sample_loads(sample: Callable[[], dict] | None, stop: asyncio.Event, samples: list[dict]) -> None:
    while not stop.is_set():
        if sample is not None:
            samples.append(await asyncio.to_thread(sample))
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


def load_stats(samples: list[dict], bound: float) -> dict:
    """max/mean in-flight across engines, per sample (over samples with at least
    one request per engine on average: below that, one request alone makes
    max/mean = n), and over the run (each engine's mean in-flight count)."""
    ratios, violations = [], 0
    for sample in samples:
        values = list(sample["loads"].values())
        total = sum(values)
        if not values or total < len(values):
            continue
        ratios.append(max(values) / (total / len(values)))
        if max(values) > math.ceil(bound * total / len(values)):
            violations += 1
    # Over the whole run: each engine's mean in-flight count, then max over mean of those.
    engines = {e for sample in samples for e in sample["loads"]}
    averages = [statistics.fmean(s["loads"].get(e, 0) for s in samples) for e in engines]
    overall = max(averages) / statistics.fmean(averages) if averages and sum(averages) else float("nan")
    return {"max_over_mean_of_run": overall,
            "max_over_mean_avg": statistics.fmean(ratios) if ratios else float("nan"),
            "max_over_mean_p50": statistics.median(ratios) if ratios else float("nan"),
            "max_over_mean_peak": max(ratios, default=float("nan")), "samples": len(ratios),
            "samples_over_bound": violations,
            "other_requests_mean": statistics.fmean(s["others"] for s in samples) if samples else float("nan")}


def _summed(values: list[dict]) -> dict:
    out: dict = {}
    for one in values:
        for k, v in one.items():
            out[k] = out.get(k, 0) + v
    return out


async def measure(setup: Setup, engines: list[str], workload: Workload, salt: str,
                  concurrency: int, think_s: float, seed: int) -> dict:
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    predicted = ("pagedkube_gateway_predicted_cached_tokens_total", "pagedkube_gateway_realized_cached_tokens_total")
    before = [scrape(e, *names) for e in engines]
    reasons_before = _summed([decisions(g) for g in setup.ours])
    predicted_before = _summed([scrape(g, *predicted) for g in setup.ours])
    stop, samples = asyncio.Event(), []
    sampler = asyncio.create_task(sample_loads(setup.loads, stop, samples))
    run = await run_workload(setup.urls, workload, salt, concurrency, think_s, seed)
    stop.set()
    await sampler
    after = [scrape(e, *names) for e in engines]
    reasons = {k: v - reasons_before.get(k, 0) for k, v in _summed([decisions(g) for g in setup.ours]).items()}
    predicted_after = _summed([scrape(g, *predicted) for g in setup.ours])
    guessed, got = (predicted_after.get(n, 0) - predicted_before.get(n, 0) for n in predicted)
    queries = sum(a[names[0]] - b[names[0]] for a, b in zip(after, before))
    hits = sum(a[names[1]] - b[names[1]] for a, b in zip(after, before))
    return {
        "requests": workload.num_requests,
        "hit_rate": hits / queries if queries else float("nan"),
        "ttft_p50_ms": 1000 * percentile(run["ttft"], 50), "ttft_p99_ms": 1000 * percentile(run["ttft"], 99),
        "latency_p50_ms": 1000 * percentile(run["latency"], 50),
        "requests_per_s": workload.num_requests / run["wall_s"],
        "output_tokens_per_s": run["output_tokens"] / run["wall_s"],
        "usage_cached_fraction": run["usage_cached_tokens"] / max(1, run["usage_prompt_tokens"]),
        "routing_decisions": {k: v for k, v in sorted(reasons.items()) if v},
        # Of the cached tokens the gateway predicted, how many the engines reported (both over all requests).
        "realized_over_predicted": got / guessed if guessed else float("nan"),
        "same_engine_as_previous_turn": run["same_engine_as_previous_turn"],
        **load_stats(samples, setup.bound),
        "turns": run["turns"],
    }


def shortfall_by_reason(policy: dict, ideal: dict) -> dict:
    """Cached tokens the policy's engines reported short of the ideal's on the
    same turns (usage.cached_tokens), summed by the policy's routing reason:
    where a router's gap to the ideal cache comes from (an `overflow` turn lost
    its session's engine; an `affinity` turn found less than the ideal did,
    mostly evicted blocks)."""
    ideal_cached = {(t["session"], t["turn"]): t.get("cached_tokens", 0) for t in ideal["turns"]}
    out: dict[str, dict] = {}
    for t in policy["turns"]:
        entry = out.setdefault(t["reason"] or "none", {"turns": 0, "tokens_short": 0})
        entry["turns"] += 1
        entry["tokens_short"] += ideal_cached.get((t["session"], t["turn"]), 0) - t.get("cached_tokens", 0)
    return out


def workloads(seed: int, concurrency: int, sessions: int = 16) -> list[tuple[Workload, int]]:
    """(workload, sessions in flight). Document questions arrive a few at a time:
    all 16 at once would be one cold wave that no router can serve from cache."""
    return [(petcare_chat(num_sessions=sessions, turns=8, seed=seed, max_tokens=32), concurrency),
            (long_document_qa(num_documents=4, questions_per_document=6, sentences=20, seed=seed), 4),
            (no_shared_prefix(num_prompts=16, seed=seed), concurrency)]


# -- main ------------------------------------------------------------------------------------

def chart(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(next(iter(results["runs"].values())))
    wl = list(results["runs"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(names)
    for i, policy in enumerate(names):
        axes[0].bar([j + i * width for j in range(len(wl))], [results["runs"][w][policy]["hit_rate"] for w in wl],
                    width, label=policy)
        axes[1].bar([j + i * width for j in range(len(wl))],
                    [results["runs"][w][policy]["ttft_p50_ms"] for w in wl], width, label=policy)
    for ax, title in zip(axes, ("prefix-cache hit rate", "TTFT p50 (ms)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(wl))], wl)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{results['engines']} engines x {results['kv_blocks']} KV blocks vs one engine x "
                 f"{results['engines'] * results['kv_blocks']} (ideal)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def bench(args: argparse.Namespace, procs: Procs) -> dict:
    # The built-in tiny model, as in every run recorded in docs/benchmarks.md (serve's default is now a GGUF).
    common = ["-m", "pagedkube", "serve", "--model", "builtin://tiny", "--device", args.device,
              "--served-model-name", MODEL, "--max-model-len", "1024", "--max-num-seqs", "16"]
    engines = [procs.start(f"engine{i}", [*common, "--num-kv-blocks", str(args.kv_blocks)])
               for i in range(args.engines)]
    ideal = procs.start("ideal", [*common, "--num-kv-blocks", str(args.kv_blocks * args.engines)])
    wait_ready(engines + [ideal])
    # (policy name, --routing, load bound, extra gateway flags): the prefix router once per bound.
    setups = [(p, p, args.load_bound[0], []) for p in args.policies if p != "prefix"]
    if "prefix" in args.policies:
        setups += [("prefix" if i == 0 else f"prefix c={c:g}", "prefix", c, [])
                   for i, c in enumerate(args.load_bound)]
    for variant in args.prefix_variant:
        name, _, flags = variant.partition(":")
        setups.append((name, "prefix", args.load_bound[0], flags.split()))
    chosen: dict[str, Setup] = {}
    for name, routing, c, extra in setups:
        for r in (args.routers if routing == "prefix" and name == "prefix" else [1]):
            label = name if r == 1 else f"{name} x{r}"
            # As the operator deploys them: several replicas run without the pending record.
            replicas = ["--pending-ttl", "0"] if routing == "prefix" and pending_ttl_for(r) == 0 else []
            urls = [procs.start(f"gateway-{label.replace(' ', '-')}-{i}",
                                ["-m", "pagedkube", "gateway", "--endpoints", ",".join(engines), "--routing", routing,
                                 "--load-bound", str(c), "--route-headers", *replicas, *extra]) for i in range(r)]
            chosen[label] = Setup(label, urls, ours=urls, bound=c, loads=gateway_loads(urls, in_flight))
    if args.vllm_router and have_vllm_router():
        for r in args.routers:
            label = "vllm-router" if r == 1 else f"vllm-router x{r}"
            urls = [start_vllm_router(procs, engines, f"{label.replace(' ', '-')}-{i}", free_port) for i in range(r)]
            chosen[label] = Setup(label, urls, bound=args.load_bound[0], loads=engine_loads(engines, scrape))
    ideal_gateway = procs.start("gateway-ideal", ["-m", "pagedkube", "gateway", "--endpoints", ideal,
                                                  "--route-headers"])
    chosen["ideal"] = Setup("ideal", [ideal_gateway], ours=[ideal_gateway], bound=args.load_bound[0])
    wait_ready([u for setup in chosen.values() for u in setup.ours], tokenizer=True)
    for setup in chosen.values():
        if not setup.ours:
            for url in setup.urls:
                wait_router(url)
    runs: dict = {}
    for workload, concurrency in workloads(args.seed, args.concurrency, args.sessions):
        if args.only and args.only != workload.name:
            continue
        runs[workload.name] = {}
        for policy, setup in chosen.items():
            targets = [ideal] if policy == "ideal" else engines
            salt = f"{policy}-{workload.name}-{args.seed}"
            result = await measure(setup, targets, workload.fresh(), salt, concurrency, args.think_ms / 1000, args.seed)
            result["concurrency"], result["load_bound"], result["routers"] = concurrency, setup.bound, len(setup.urls)
            runs[workload.name][policy] = result
            print(f"{workload.name:18s} {policy:14s} hit {result['hit_rate']:.3f}  ttft p50 "
                  f"{result['ttft_p50_ms']:.0f} ms p99 {result['ttft_p99_ms']:.0f} ms  "
                  f"{result['requests_per_s']:.1f} req/s  max/mean run {result['max_over_mean_of_run']:.2f} samples {result['max_over_mean_avg']:.2f} "
                  f"(p50 {result['max_over_mean_p50']:.2f}, {result['samples_over_bound']}/{result['samples']} samples over the bound)  "
                  f"{result['routing_decisions']}  realized/predicted {result['realized_over_predicted']:.2f}  others {result['other_requests_mean']:.2f}  same engine as the previous turn "
                  f"{result['same_engine_as_previous_turn']:.2f}", flush=True)
        for result in runs[workload.name].values():
            result["shortfall_vs_ideal"] = shortfall_by_reason(result, runs[workload.name]["ideal"])
        print(f"{workload.name}: cached tokens short of the ideal, by routing reason: "
              + "; ".join(f"{p} {r['shortfall_vs_ideal']}" for p, r in runs[workload.name].items() if p != "ideal"),
              flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--kv-blocks", type=int, default=320, help="KV blocks per engine (the ideal has N times)")
    parser.add_argument("--concurrency", type=int, default=32, help="sessions in flight at once")
    parser.add_argument("--sessions", type=int, default=32, help="petcare_chat sessions (8 turns each)")
    parser.add_argument("--load-bound", type=lambda v: [float(c) for c in v.split(",")], default=[1.5],
                        help="c for the prefix router; a list runs it once per value (default 1.5; "
                             "the baselines and the overhead run use the first)")
    parser.add_argument("--policies", type=lambda v: v.split(","), default=list(POLICIES),
                        help=f"the gateway's policies to run (default {','.join(POLICIES)})")
    parser.add_argument("--prefix-variant", action="append", default=[], metavar="NAME:FLAGS",
                        help="also run the prefix router with these gateway flags, e.g. 'floor4:--load-floor 4' "
                             "(later flags win: 'old:--load-bound 1.25 --load-floor 0 --ring-key-blocks 16' "
                             "reruns the defaults before the simulator, docs/benchmarks.md)")
    parser.add_argument("--routers", type=lambda v: [int(r) for r in v.split(",")], default=[1],
                        help="router replicas for `prefix` and vllm-router, e.g. 1,2 (requests split at random)")
    parser.add_argument("--vllm-router", action="store_true",
                        help="also run vLLM's router (vllm-router from PyPI, policy cache_aware) on the same engines")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(REPO / "build" / "bench" / "routing"))
    parser.add_argument("--think-ms", type=float, default=500.0,
                        help="mean user think time before each turn (exponential, seeded; 0: a closed loop)")
    parser.add_argument("--only", choices=["overhead", "petcare_chat", "long_document_qa", "no_shared_prefix"],
                        help="run only this part (overhead: the gateway against a null engine, printed; "
                             "a workload name: that workload, no overhead run)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = Procs(out)
    if args.only == "overhead":
        try:
            over = overhead(procs, args.seed)
        finally:
            procs.stop_all()
        print(json.dumps(over))
        return 0
    try:
        runs = asyncio.run(bench(args, procs))
        over = overhead(procs, args.seed) if args.only is None else None
    finally:
        procs.stop_all()
    if over is not None:
        print(f"gateway overhead p50 {over['overhead_p50_ms']:.2f} ms (routing alone {over['routing_only_p50_ms']:.2f} ms)")
    results = {"engines": args.engines, "kv_blocks": args.kv_blocks, "concurrency": args.concurrency,
               "load_bound": args.load_bound, "seed": args.seed, "think_ms": args.think_ms,
               "sessions": args.sessions, "device": args.device,
               "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs, "overhead": over}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    chart(results, out / "routing.png")
    print(f"wrote {out / 'results.json'} and {out / 'routing.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fleet simulator: sweeps routing policies over a simulated fleet (bench/sim).

    .venv/bin/python -P bench/simulate.py [--workload petcare] [--engines 16] [--replicas 1,2]
        [--rate 0.125,2.5] [--sessions 40] [--policies ideal,round-robin,least-load,cache-aware,prefix]
        [--load-bound 1.5] [--load-floor 8] [--affinity-depth 0] [--ring-key-blocks 256]
        [--pending-ttl auto] [--pending-min-blocks 16] [--pending-max-load 1]
        [--profile h100-8b] [--kv-blocks 1024] [--feed-delay 0.005] [--scrape-interval 1]
        [--seed 0] [--trace-load] [--out build/bench/sim]
        [--adapters 50 --adapter-zipf 1.0 --max-loras 8 --lora-load-ms 5]

Every list flag is swept (the cartesian product; the prefix knobs only for
`prefix`). --rate and --sessions are per engine, so a sweep over --engines
keeps the load per engine. Deterministic for a seed. Writes results.csv (one
row per run, with hit rate / ideal of the same fleet and load) and sim.png:
hit rate as a share of the ideal per policy, one panel per load and replica
count. docs/benchmarks.md "Simulator: routing at fleet scale" explains the model and quotes the runs.
With --adapters N every session runs under one of N LoRA adapters (Zipf popularity) on
engines of --max-loras slots; each run also reports its adapter loads and adapter hit rate
(docs/benchmarks.md "Simulator: LoRA adapters").
"""
from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_FLOOR  # noqa: E402
from pagedkube.gateway.routing.pending import DEFAULT_PENDING_MAX_LOAD, DEFAULT_PENDING_MIN_BLOCKS  # noqa: E402

from sim.cache_aware import CacheAwareConfig  # noqa: E402
from sim.engine import DEFAULT_LORA_LOAD_S, EngineConfig  # noqa: E402
from sim.fleet import FleetConfig, RunResult, simulate  # noqa: E402
from sim.gateway import POLICIES, PolicySpec  # noqa: E402
from sim.timing import PROFILES  # noqa: E402
from sim.workloads import KINDS, WorkloadSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _list(kind):
    return lambda v: [kind(x) for x in v.split(",")]


def _depth(v: str) -> int | None:
    return None if v == "head" else int(v)


def _ttl(v: str) -> float | None:
    return None if v == "auto" else float(v)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=KINDS, default="petcare")
    p.add_argument("--engines", type=_list(int), default=[16])
    p.add_argument("--replicas", type=_list(int), default=[1, 2], help="gateway (router) replicas")
    p.add_argument("--rate", type=_list(float), default=[0.125, 2.5],
                   help="new sessions per second per engine (Poisson; 0: all at once)")
    p.add_argument("--sessions", type=int, default=40, help="sessions per engine")
    p.add_argument("--think-s", type=float, default=10.0, help="mean user think time between turns")
    p.add_argument("--answer-tokens", type=_list(int), default=[20, 40], help="min,max answer length")
    p.add_argument("--policies", type=_list(str), default=list(POLICIES))
    p.add_argument("--load-bound", type=_list(float), default=[1.5])
    p.add_argument("--load-floor", type=_list(int), default=[DEFAULT_LOAD_FLOOR])
    p.add_argument("--affinity-depth", type=_list(_depth), default=[0], help="0 (any prefix), N or head")
    p.add_argument("--ring-key-blocks", type=_list(int), default=[256])
    p.add_argument("--pending-ttl", type=_list(_ttl), default=[None],
                   help="seconds a routed prompt's blocks count as held on its engine before its feed reports "
                        "them (the gateway's --pending-ttl; 0: no pending record; auto: as the operator deploys "
                        "it, on with one router and off with several)")
    p.add_argument("--pending-min-blocks", type=_list(int), default=[DEFAULT_PENDING_MIN_BLOCKS],
                   help="shortest pending run that draws a request")
    p.add_argument("--pending-max-load", type=_list(int), default=[DEFAULT_PENDING_MAX_LOAD],
                   help="most requests an engine may have for its pending run to draw a request")
    p.add_argument("--cache-threshold", type=float, default=CacheAwareConfig().cache_threshold)
    p.add_argument("--balance-abs", type=int, default=CacheAwareConfig().balance_abs_threshold)
    p.add_argument("--balance-rel", type=float, default=CacheAwareConfig().balance_rel_threshold)
    p.add_argument("--profile", choices=sorted(PROFILES), default="h100-8b")
    p.add_argument("--kv-blocks", type=int, default=1024, help="KV blocks per engine (16 tokens each)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--feed-delay", type=_list(float), default=[0.005],
                   help="seconds until a cache event reaches a gateway")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="0: every gateway sees every load exactly")
    p.add_argument("--seed", type=_list(int), default=[0])
    p.add_argument("--trace-load", action="store_true",
                   help="also report how well each load unit predicts TTFT (Spearman's rho of TTFT with the chosen "
                        "engine's requests, and with its prompt tokens still to prefill); slower")
    p.add_argument("--adapters", type=int, default=0, help="LoRA adapters the sessions draw from (0: none)")
    p.add_argument("--adapter-zipf", type=float, default=1.0, help="Zipf exponent of the adapters' popularity")
    p.add_argument("--adapter-affinity", type=_list(lambda v: {"on": True, "off": False}[v]), default=[True],
                   help="on,off: prefix with and without the adapter tiers (off: adapters hash apart, nothing more)")
    p.add_argument("--max-loras", type=int, default=8, help="adapter slots per engine (with --adapters)")
    p.add_argument("--lora-load-ms", type=float, default=DEFAULT_LORA_LOAD_S * 1e3,
                   help="time one adapter load adds to its engine step")
    p.add_argument("--out", default=str(REPO / "build" / "bench" / "sim"))
    args = p.parse_args(argv)
    for name in args.policies:
        if name not in POLICIES:
            p.error(f"--policies: unknown policy {name!r} (one of {', '.join(POLICIES)})")
    return args


def policy_specs(args: argparse.Namespace) -> list[PolicySpec]:
    ca = CacheAwareConfig(args.cache_threshold, args.balance_abs, args.balance_rel)
    specs = []
    for name in args.policies:
        if name != "prefix":
            specs.append(PolicySpec(name, cache_aware=ca))
            continue
        for c, floor, depth, key, ttl, min_blocks, max_load, tiers in itertools.product(
                args.load_bound, args.load_floor, args.affinity_depth, args.ring_key_blocks, args.pending_ttl,
                args.pending_min_blocks, args.pending_max_load, args.adapter_affinity):
            specs.append(PolicySpec("prefix", load_bound=c, load_floor=floor, affinity_depth=depth,
                                    ring_key_blocks=key, pending_ttl=ttl, pending_min_blocks=min_blocks,
                                    pending_max_load=max_load, adapter_affinity=tiers))
    return specs


def sweep(args: argparse.Namespace, on_run=None) -> list[RunResult]:
    """Every run of the sweep; `on_run(results so far)` after each (partial CSVs
    of long sweeps survive an interrupted run)."""
    results = []
    lo, hi = args.answer_tokens
    for seed, engines, replicas, rate, delay in itertools.product(args.seed, args.engines, args.replicas, args.rate,
                                                                  args.feed_delay):
        fleet = FleetConfig(engines=engines, replicas=replicas, time_model=PROFILES[args.profile],
                            engine=EngineConfig(num_blocks=args.kv_blocks, max_num_seqs=args.max_num_seqs,
                                                max_loras=args.max_loras if args.adapters else None,
                                                lora_load_s=args.lora_load_ms / 1e3),
                            feed_delay_s=delay, scrape_interval_s=args.scrape_interval, seed=seed,
                            trace_load=args.trace_load)
        spec = WorkloadSpec(kind=args.workload, sessions=args.sessions * engines, rate=rate * engines, seed=seed,
                            think_s=args.think_s, answer_tokens=(lo, hi), adapters=args.adapters,
                            adapter_zipf=args.adapter_zipf)
        group = []
        for policy in policy_specs(args):
            started = time.perf_counter()
            result = simulate(fleet, spec, policy)
            group.append(result)
            if on_run is not None:
                on_run(results + _with_ideal(group))
            print(f"seed {seed} engines {engines} R {replicas} rate {rate:g}/engine delay {delay:g}: "
                  f"{result.policy:44s} hit {result.hit_rate:.3f} session-hit {result.session_hit_rate:.3f} "
                  f"TTFT p50/p99 {result.ttft_p50_s * 1e3:.0f}/{result.ttft_p99_s * 1e3:.0f} ms "
                  f"max/mean {result.max_mean_run:.2f} overflow {result.overflow_share:.3f} "
                  f"disagree {result.disagreement:.3f}{_rho(result)}{_lora(result)} "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)
        results += _with_ideal(group)
    return results


def _rho(result: RunResult) -> str:
    if math.isnan(result.ttft_rho_backlog_own):
        return ""   # not traced
    return (f" TTFT rho: requests {result.ttft_rho_requests:.2f} backlog {result.ttft_rho_backlog:.2f}"
            f" backlog+own {result.ttft_rho_backlog_own:.2f}")


def _lora(result: RunResult) -> str:
    if math.isnan(result.adapter_hit_rate):
        return ""
    return f" adapter loads {result.adapter_loads} adapter hit {result.adapter_hit_rate:.3f}"


def _with_ideal(group: list[RunResult]) -> list[RunResult]:
    ideal = next((r.hit_rate for r in group if r.policy == "ideal"), float("nan"))
    return [replace(r, ideal_hit_rate=ideal) for r in group]


def write_csv(results: list[RunResult], path: Path) -> None:
    rows = [r.row() for r in results]
    for row in rows:
        row["of_ideal"] = row["hit_rate"] / row["ideal_hit_rate"] if row["ideal_hit_rate"] else float("nan")
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def chart(results: list[RunResult], path: Path) -> None:
    """One question: what share of the ideal hit rate each policy keeps, per load
    and replica count (and its TTFT p99 above the bar)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.engines, r.replicas, r.rate) for r in results})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, (engines, replicas, rate) in zip(axes[0], panels):
        rows = [r for r in results if (r.engines, r.replicas, r.rate) == (engines, replicas, rate)]
        labels = [r.policy.replace(" floor=", "\nfloor=") for r in rows]
        shares = [r.hit_rate / r.ideal_hit_rate for r in rows]
        bars = ax.bar(range(len(rows)), shares, color=["#999" if r.policy == "ideal" else "#3a7" if
                                                       r.policy.startswith("prefix") else "#c63" for r in rows])
        for bar, r in zip(bars, rows):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.01, f"{r.ttft_p99_s * 1e3:.0f}",
                    ha="center", fontsize=7)
        ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7)
        ax.set_title(f"{engines} engines, {replicas} router(s), {rate:g} sessions/s", fontsize=9)
        ax.set_ylim(0, 1.12)
    axes[0][0].set_ylabel("hit rate / ideal (numbers: TTFT p99 ms)")
    fig.suptitle(f"{results[0].workload}, profile {results[0].profile}, seed {results[0].seed}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = sweep(args, on_run=lambda so_far: write_csv(so_far, out / "results.csv"))
    write_csv(results, out / "results.csv")
    chart(results, out / "sim.png")
    print(f"wrote {out / 'results.csv'} and {out / 'sim.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The autoscaler's signal and scale-in under a steady, a ramping and a bursty load, simulated
(bench/sim/autoscale.py): the in-flight signal with its drain against the old waiting signal.

    .venv/bin/python -P bench/simulate_autoscale.py [--hours 2] [--seeds 0,1,2] [--scale-down-window 300]

Prints one row per load and signal (the mean over the seeds): goodput in output tokens/s,
requests lost, replica changes per hour, the share of autoscaler ticks with fewer serving
engines than the work in flight needs to run, p99 queueing, mean replicas. Deterministic for
its seeds; docs/benchmarks.md "Autoscaling: the in-flight signal" quotes it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pagedkube.gateway.autoscaler.policy import AutoscalerConfig  # noqa: E402

from sim.autoscale import AutoscaledFleet, FleetModel, loads  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--scale-down-window", type=float, default=300.0)
    p.add_argument("--out", default="build/bench/simulate-autoscale.json")
    args = p.parse_args()
    model = FleetModel()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    started = time.monotonic()
    for load in loads(model, args.hours):
        for signal in ("waiting", "in-flight"):
            config = AutoscalerConfig(min_replicas=1, max_replicas=6, target_queue_depth=4,
                                      engine_capacity=model.max_num_seqs, scale_down_window=args.scale_down_window,
                                      signal=signal)
            runs = [AutoscaledFleet(config, model, load, seed).run() for seed in seeds]
            row = {k: (statistics.mean(getattr(r, k) for r in runs) if isinstance(v, (int, float)) else v)
                   for k, v in asdict(runs[0]).items()}
            rows.append(row)
    print(f"{'load':8} {'signal':9} {'goodput tok/s':>13} {'lost':>6} {'changes/h':>9} {'under':>6} "
          f"{'queue p99 s':>11} {'replicas':>8}")
    for r in rows:
        print(f"{r['load']:8} {r['signal']:9} {r['goodput_tokens_s']:13.1f} {r['lost']:6.1f} "
              f"{r['replica_changes_per_h']:9.1f} {r['under_needed_share']:6.1%} {r['queue_p99_s']:11.1f} "
              f"{r['mean_replicas']:8.2f}")
    print(f"({len(rows) * len(seeds)} runs of {args.hours:g} simulated hours in {time.monotonic() - started:.1f} s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": asdict(model), "seeds": seeds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One client, interleaved: pagedkube (GGUF default) and llama-server on the same file, both up,
driven in turns, so the machine's drift between runs falls on both alike.

bench/cpu_peers.py runs each server through every client level, one server after the other; at
one client its figure is two sessions (~250 tokens) from minutes apart, and on a shared machine
two such runs of the same build differ by 15% or more. Here both servers start (pagedkube's
decode buckets compiled before any round; llama-server idle meanwhile), then --rounds rounds,
each one cpu_peers round of one client (two pet-care sessions, 3-5 streamed turns of 32 tokens)
against pagedkube and then against llama-server, or the other way round in odd rounds. An idle
server takes no CPU (llama-server's threads wait on a condition; pagedkube's core on its pipe).
Per server: the median over rounds of tok/s and of ITL p50, and the median of the per-round
ratios; load average before and after.

    .venv/bin/python bench/one_client.py --isa avx2 --threads 2 --rounds 10

Needs llama-server built for the ISA (bench/llama_server.py). Record in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_peers
import llama_server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--isa", choices=sorted(llama_server.ISA_FLAGS), default="native")
    ap.add_argument("--logdir", type=Path, default=Path("/tmp"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cpu_peers.THREADS = args.threads
    if args.isa == "avx2":        # before any import of torch, as cpu_peers does
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    from pagedkube.model_source import resolve_model_source
    source = resolve_model_source(args.model)
    gguf, name = source.path, source.name
    ours_port, peer_port = cpu_peers.free_port(), cpu_peers.free_port()
    log = args.logdir / "one-client-pagedkube.log"
    launched = time.monotonic()
    ours, _ = cpu_peers.start(cpu_peers.pagedkube_command(gguf, ours_port, name, 8, "gguf"), ours_port, "/ready", log,
                              {**os.environ, "PAGEDKUBE_DECODE_CAPTURE": "auto"})
    procs = [ours]
    try:
        argv, env = llama_server.command(gguf, peer_port, args.threads, slots=8, isa=args.isa)
        peer, _ = cpu_peers.start([*argv, "--alias", name], peer_port, "/health",
                                  args.logdir / "one-client-llama-server.log", env)
        procs.append(peer)
        urls = {"pagedkube": f"http://127.0.0.1:{ours_port}", "llama-server": f"http://127.0.0.1:{peer_port}"}
        for url in urls.values():
            asyncio.run(cpu_peers.warm_up(url, name))
        cpu_peers.wait_for_log(log, cpu_peers.CAPTURE_READY, launched)
        result: dict = {"isa": args.isa, "threads": args.threads, "cpu": cpu_peers.cpu_model(),
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                        "load_before": os.getloadavg()[0], "rounds": []}
        for r in range(args.rounds):
            order = list(urls) if r % 2 == 0 else list(reversed(urls))
            row = {}
            for server in order:
                out = asyncio.run(cpu_peers.drive(urls[server], name, 1))
                row[server] = {"tok_s": round(out["tok_s"], 1), "itl_p50_ms": round(out["itl_p50_ms"], 2)}
            row["ratio"] = round(row["pagedkube"]["tok_s"] / row["llama-server"]["tok_s"], 3)
            result["rounds"].append(row)
            print(json.dumps(row), flush=True)
        result["load_after"] = os.getloadavg()[0]
        rows = result["rounds"]
        for server in urls:
            result[server] = {key: statistics.median(row[server][key] for row in rows) for key in ("tok_s", "itl_p50_ms")}
        result["ratio_median"] = statistics.median(row["ratio"] for row in rows)
        result["rounds_ahead"] = sum(row["ratio"] >= 1.0 for row in rows)
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        for proc in procs:
            cpu_peers.stop(proc)


if __name__ == "__main__":
    main()

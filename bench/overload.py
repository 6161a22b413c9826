"""The engine server past its capacity: open-loop Poisson arrivals from 0.5x to 4x.

First a closed-loop run finds the capacity: --clients streaming clients back to
back for --seconds, completed requests per second. Then, for each load factor
(default 0.5 1 1.5 2 3 4), requests arrive as a Poisson process at factor x
capacity for --seconds, each one streamed (so TTFT is measured) with its own
timeout; nobody waits for an answer before sending the next request (open
loop: offered load does not fall as the server slows, as it does not in
production). Per level: goodput (successful requests/s and output tokens/s),
TTFT p50/p99 of the successful ones, and every failure by reason (HTTP status
and error code, or a client timeout). The engine must degrade by queueing or
rejecting (503 queue_full), never by failing (5xx other than 503, broken
streams) or hanging.

    .venv/bin/python bench/overload.py                  # built-in model, CPU
    .venv/bin/python bench/overload.py --max-num-seqs 8 --max-waiting 32   # a small engine: rejections

Results: a table on stdout, bench/out/overload.json; docs/benchmarks.md "Overload".
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import make_prompts, percentile  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one(http: httpx.AsyncClient, prompt: str, output_len: int, timeout: float) -> dict:
    """One streamed request: {'ok', 'ttft', 'tokens'} or {'ok': False, 'reason'}."""
    start = time.monotonic()
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        async with asyncio.timeout(timeout):
            async with http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    try:
                        code = json.loads(await r.aread())["error"].get("code")
                    except (ValueError, KeyError, TypeError):
                        code = None
                    return {"ok": False, "reason": f"{r.status_code} {code or ''}".strip()}
                ttft, tokens, done = None, 0, False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    event = json.loads(line[6:])
                    if "error" in event:
                        return {"ok": False, "reason": f"stream error {event['error'].get('code')}"}
                    if event.get("choices") and ttft is None:
                        ttft = time.monotonic() - start
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                if not done:
                    return {"ok": False, "reason": "stream cut"}
                return {"ok": True, "ttft": ttft, "tokens": tokens}
    except TimeoutError:
        return {"ok": False, "reason": "client timeout"}
    except httpx.HTTPError as exc:
        return {"ok": False, "reason": type(exc).__name__}


async def capacity(url: str, prompts: list[str], clients: int, seconds: float, output_len: int) -> float:
    """Completed requests per second with `clients` back-to-back streaming clients."""
    done = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=None) as http:
        async def worker(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < deadline:
                if (await one(http, prompts[i % len(prompts)], output_len, 600))["ok"]:
                    done += 1
                i += clients
        start = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        return done / (time.monotonic() - start)


async def open_loop(url: str, prompts: list[str], rate: float, seconds: float, output_len: int,
                    timeout: float, seed: int) -> dict:
    rng = random.Random(seed)
    tasks = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:
        start = time.monotonic()
        t, i = 0.0, 0
        while t < seconds:
            await asyncio.sleep(max(0.0, start + t - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(http, prompts[i % len(prompts)], output_len, timeout)))
            i += 1
            t += rng.expovariate(rate)
        results = await asyncio.gather(*tasks)
        wall = time.monotonic() - start
    ok = [r for r in results if r["ok"]]
    reasons = collections.Counter(r["reason"] for r in results if not r["ok"])
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    return {"offered_rps": rate, "sent": len(results), "ok": len(ok), "goodput_rps": len(ok) / wall,
            "goodput_tok_s": sum(r["tokens"] for r in ok) / wall, "ttft_p50": percentile(ttfts, 0.5),
            "ttft_p99": percentile(ttfts, 0.99), "failures": dict(reasons), "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--factors", type=float, nargs="+", default=[0.5, 1, 1.5, 2, 3, 4])
    ap.add_argument("--seconds", type=float, default=20.0, help="per level")
    ap.add_argument("--clients", type=int, default=32, help="closed-loop clients of the capacity run")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=60.0, help="a request not done in this many s failed")
    ap.add_argument("--max-waiting", type=int, default=None, help="the server's --max-waiting (default: its own)")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="the server's --max-num-seqs (default: its own)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    ap.add_argument("--out", default="bench/out/overload.json")
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "pagedkube", "serve", "--port", str(port), "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    if args.max_waiting is not None:
        cmd += ["--max-waiting", str(args.max_waiting)]
    if args.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(args.max_num_seqs)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    server = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not become ready")
            time.sleep(0.5)
        prompts = make_prompts(2000)
        cap = asyncio.run(capacity(url, prompts, args.clients, args.seconds, args.output_len))
        print(f"capacity: {cap:.2f} requests/s ({args.clients} closed-loop clients, {args.output_len} tokens each)")
        rows = []
        print(f"{'load':>5} {'offered/s':>9} {'sent':>5} {'ok':>5} {'good/s':>7} {'tok/s':>7} "
              f"{'ttft p50':>8} {'ttft p99':>8}  failures")
        for k, factor in enumerate(args.factors):
            row = asyncio.run(open_loop(url, prompts, factor * cap, args.seconds, args.output_len, args.timeout,
                                        seed=k))
            row["factor"] = factor
            rows.append(row)
            print(f"{factor:>5.1f} {row['offered_rps']:>9.2f} {row['sent']:>5} {row['ok']:>5} "
                  f"{row['goodput_rps']:>7.2f} {row['goodput_tok_s']:>7.0f} {row['ttft_p50']:>8.2f} "
                  f"{row['ttft_p99']:>8.2f}  {row['failures'] or '-'}", flush=True)
            healthy = httpx.get(f"{url}/health", timeout=30).status_code
            if healthy != 200:
                print(f"/health answered {healthy} after load {factor}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"capacity_rps": cap, "levels": rows, "args": vars(args)}, indent=2))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

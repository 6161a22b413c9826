"""Engine server under load: concurrent streaming clients vs offline LLM.generate.

For each concurrency level C (default 1, 8, 32, 64) the script runs C streaming
clients against a real `pagedkube serve` process, each client sending its share
of the level's requests one after another (POST /v1/completions, stream=True,
greedy, EOS ignored so every request makes exactly --output-len tokens). It
records time to first token, inter-token latency (gap between content chunks, as
vLLM's benchmark_serving does) and output tokens/s over the level's wall time.
Right after each level, in the same script and while the server sits idle (it
costs no CPU then), the offline engine (`LLM.generate`) runs the same prompts
with max_num_seqs = C: the same batch size, without HTTP. The ratio server /
offline is the server's cost. With --repeats R every level is measured R times,
server and offline alternating, so that a machine whose speed drifts (a shared
VM) moves both halves of each pair; the table gives the median of the R ratios
and their range.

    .venv/bin/python bench/serve_load.py                       # CPU, built-in model, 1 torch thread
    .venv/bin/python bench/serve_load.py --device cuda --model DIR --threads 0

Results: a table on stdout and bench/out/serve_load.json; record them in
docs/benchmarks.md, "Engine server (CPU)". Target: >= 85% of offline throughput
at 32 clients.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

TOPICS = ["feed my cat", "walk my dog", "clean a fish tank", "trim a rabbit's nails", "train a puppy",
          "bathe a hamster", "choose a bird cage", "brush a horse", "calm an anxious dog", "help an old cat"]


def make_prompts(num: int, seed: int = 0) -> list[str]:
    """Distinct prompts (different first words, so the prefix cache does not help one level more)."""
    rng = random.Random(seed)
    return [f"Question {i} from owner {rng.randrange(10**6)}: how should I {rng.choice(TOPICS)} "
            f"and how often, in {rng.choice(['spring', 'summer', 'autumn', 'winter'])}?" for i in range(num)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def one_request(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], prompt: str,
                      output_len: int) -> dict:
    """One streaming completion over a kept-alive connection.

    The load generator shares the CPU with the server on a small machine, so it is
    a minimal HTTP/1.1 client (chunked transfer, SSE split by hand, JSON parsed
    only for the usage chunk) rather than httpx, which costs as much CPU per chunk
    as the server itself."""
    reader, writer = conn
    body = json.dumps({"prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    start = time.perf_counter()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    status = await reader.readline()
    assert b" 200 " in status, status
    while (await reader.readline()) != b"\r\n":
        pass
    first, last, gaps, tokens, buf = None, None, [], 0, b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            break
        buf += (await reader.readexactly(size + 2))[:-2]
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if not event.startswith(b"data: {"):
                continue
            if b'"choices":[]' in event:
                tokens = json.loads(event[6:])["usage"]["completion_tokens"]
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
    return {"ttft": first - start, "itl": gaps, "tokens": tokens}


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """User + system CPU time of a process and (tree) its live descendants (Linux /proc):
    the server is two processes, the HTTP process and its engine-core process."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir() if tree else ():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


async def run_level(url: str, prompts: list[str], concurrency: int, output_len: int,
                    server_pid: int | None = None) -> dict:
    queue = list(prompts)
    results: list[dict] = []
    host, port = url.rsplit("//", 1)[1].split(":")

    async def worker() -> None:
        conn = await asyncio.open_connection(host, int(port))
        try:
            while queue:
                results.append(await one_request(conn, queue.pop(), output_len))
        finally:
            conn[1].close()

    server_cpu = cpu_seconds(server_pid) if server_pid else 0.0
    http_cpu = cpu_seconds(server_pid, tree=False) if server_pid else 0.0
    client_cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    client_cpu = time.process_time() - client_cpu
    server_cpu = (cpu_seconds(server_pid) - server_cpu) if server_pid else float("nan")
    http_cpu = (cpu_seconds(server_pid, tree=False) - http_cpu) if server_pid else float("nan")
    itl = [g for r in results for g in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    assert tokens == len(prompts) * output_len, (tokens, len(prompts), output_len)
    return {"requests": len(results), "output_tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "server_cpu_s": server_cpu, "client_cpu_s": client_cpu, "tok_per_server_cpu_s": tokens / server_cpu,
            "http_cpu_ms_per_token": 1000 * http_cpu / tokens,
            "ttft_p50_ms": 1e3 * percentile([r["ttft"] for r in results], 0.5),
            "ttft_p99_ms": 1e3 * percentile([r["ttft"] for r in results], 0.99),
            "itl_p50_ms": 1e3 * percentile(itl, 0.5), "itl_p99_ms": 1e3 * percentile(itl, 0.99)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "pagedkube", "serve", "--port", str(port), "--device", args.device,
           "--max-num-seqs", str(max(args.levels)), "--max-model-len", str(args.max_model_len),
           "--max-waiting", "-1", "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    if args.engine_in_process:
        cmd += ["--engine-in-process"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("server did not become ready")


def run_offline(args: argparse.Namespace, prompts: list[str], concurrency: int) -> dict:
    from pagedkube.engine import LLM, SamplingParams
    llm = LLM(model=args.model, device=args.device, max_num_seqs=concurrency, max_model_len=args.max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    cpu = time.process_time()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"output_tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "cpu_s": cpu, "tok_per_cpu_s": tokens / cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in server and offline (0 = default)")
    parser.add_argument("--engine-in-process", action="store_true",
                        help="serve with the engine in a thread of the HTTP process (the old layout)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="measure each level this many times, server and offline alternating (median ratio)")
    parser.add_argument("--out", default="bench/out/serve_load.json")
    args = parser.parse_args()

    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        import torch
        torch.set_num_threads(args.threads)
    level_prompts = {c: make_prompts(max(c * args.requests_per_client, args.min_requests), seed=c)
                     for c in args.levels}

    proc, url = start_server(args, env)
    pairs: dict[int, list[tuple[dict, dict]]] = {c: [] for c in args.levels}
    try:
        asyncio.run(run_level(url, make_prompts(4, seed=999), 2, 4))  # warm-up
        for r in range(args.repeats):
            for c in args.levels:
                served = asyncio.run(run_level(url, level_prompts[c], c, args.output_len, proc.pid))
                offline = run_offline(args, level_prompts[c], c)
                pairs[c].append((served, offline))
                print(f"C={c:3d} run {r + 1}: server {served['tok_s']:8.1f} tok/s, offline {offline['tok_s']:8.1f} "
                      f"tok/s, {served['tok_s'] / offline['tok_s']:.0%}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)

    print("\n| clients | requests | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | server tok/s | offline tok/s "
          "| server / offline (median, range) | tok per CPU-s: server / offline | HTTP process CPU ms / token |")
    print("|---|---|---|---|---|---|---|---|---|")
    server, offline = {}, {}
    for c in args.levels:
        ratios = sorted(sv["tok_s"] / of["tok_s"] for sv, of in pairs[c])
        s_, o = min(pairs[c], key=lambda p: abs(p[0]["tok_s"] / p[1]["tok_s"] - statistics.median(ratios)))
        server[c], offline[c] = [p[0] for p in pairs[c]], [p[1] for p in pairs[c]]
        spread = f" ({ratios[0]:.0%}-{ratios[-1]:.0%})" if len(ratios) > 1 else ""
        print(f"| {c} | {s_['requests']} | {s_['ttft_p50_ms']:.1f} / {s_['ttft_p99_ms']:.1f} | "
              f"{s_['itl_p50_ms']:.1f} / {s_['itl_p99_ms']:.1f} | {s_['tok_s']:.1f} | {o['tok_s']:.1f} | "
              f"**{statistics.median(ratios):.0%}**{spread} | {s_['tok_per_server_cpu_s']:.0f} / {o['tok_per_cpu_s']:.0f} | {s_['http_cpu_ms_per_token']:.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "server": server, "offline": offline}, indent=2))


if __name__ == "__main__":
    main()

"""Launch to HTTP 200: how long `pagedkube serve` takes to answer GET /v1/models, default model.

    python bench/startup.py [--rounds 3] [--threads 2] [-- extra serve flags]

Each round starts a fresh server process (warm caches: the GGUF conversion, the kernel
timings and the built Q4 kernel are made by the first start and reused), polls every 50 ms
until /v1/models answers 200 (and reads the resident memory of its process tree then), and stops it; the server's own log lines give where the time
went (its timestamps). Prints each round, the best and the median, with the load average
before and after: on a shared machine compare runs made together.
Record in docs/benchmarks.md, "Start-up".
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from cpu_peers import free_port, stop


def tree_rss_mib(pid: int) -> float:
    """Resident memory of the server and its children (the engine core runs in its own process)."""
    import psutil
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def launch_to_ready(extra: list[str], threads: int, log: Path) -> tuple[float, float]:
    """(seconds to the first 200, resident MiB then)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-P", "-m", "pagedkube", "serve", "--port", str(port), *extra]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    return time.monotonic() - start, tree_rss_mib(proc.pid)
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="flags passed to pagedkube serve (after --)")
    args = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="startup-"))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, load average before {os.getloadavg()[0]:.2f}, logs in {logdir}")
    seconds = []
    for i in range(args.rounds):
        took, rss = launch_to_ready(args.extra, args.threads, logdir / f"round{i}.log")
        seconds.append(took)
        print(f"round {i}: {took:.2f} s, {rss:.0f} MiB resident at ready (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"best {min(seconds):.2f} s, median {statistics.median(seconds):.2f} s; "
          f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

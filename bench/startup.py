"""Launch to HTTP 200: how long `pagedkube serve` takes to answer GET /v1/models, default model.

    python bench/startup.py [--rounds 3] [--threads 2] [--against REV] [-- extra serve flags]

Each round starts a fresh server process (warm caches: the GGUF conversion, the kernel
timings and the built Q4 kernel are made by the first start and reused), polls every 50 ms
until /v1/models answers 200 (and reads the resident memory of its process tree then), and stops it; the server's own log lines give where the time
went (its timestamps). Prints each round, the best and the median, with the load average
before and after: on a shared machine compare runs made together.
With --against REV each round starts the server at REV, then at HEAD, in turn (engine/ and
pagedkube/ checked out from REV and back; refused while those folders have uncommitted
changes), 12 s apart so a stopped server's exit is over: an interleaved before/after.
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


SOURCES = ["engine", "pagedkube"]


def checkout(rev: str) -> None:
    subprocess.run(["git", "checkout", "-q", rev, "--", *SOURCES], check=True)


def against(rev: str, rounds: int, extra: list[str], threads: int, logdir: Path) -> None:
    if subprocess.run(["git", "status", "--porcelain", "--", *SOURCES], capture_output=True, text=True,
                      check=True).stdout.strip():
        sys.exit("--against: engine/ or pagedkube/ has uncommitted changes; commit them first")
    runs: dict[str, list[tuple[float, float]]] = {rev: [], "HEAD": []}
    try:
        for i in range(rounds):
            for name in runs:
                checkout(name)
                took, rss = launch_to_ready(extra, threads, logdir / f"{name}-{i}.log")
                runs[name].append((took, rss))
                print(f"round {i} {name}: {took:.2f} s, {rss:.0f} MiB resident at ready "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
                time.sleep(12)
    finally:
        checkout("HEAD")
    for name, got in runs.items():
        seconds = [t for t, _ in got]
        print(f"{name}: best {min(seconds):.2f} s, median {statistics.median(seconds):.2f} s, "
              f"resident {min(r for _, r in got):.0f}-{max(r for _, r in got):.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against", metavar="REV", help="interleave rounds at REV with rounds at HEAD")
    ap.add_argument("extra", nargs="*", help="flags passed to pagedkube serve (after --)")
    args = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="startup-"))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, load average before {os.getloadavg()[0]:.2f}, logs in {logdir}")
    if args.against:
        against(args.against, args.rounds, args.extra, args.threads, logdir)
        print(f"load average after {os.getloadavg()[0]:.2f}")
        return
    seconds = []
    for i in range(args.rounds):
        took, rss = launch_to_ready(args.extra, args.threads, logdir / f"round{i}.log")
        seconds.append(took)
        print(f"round {i}: {took:.2f} s, {rss:.0f} MiB resident at ready (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"best {min(seconds):.2f} s, median {statistics.median(seconds):.2f} s; "
          f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

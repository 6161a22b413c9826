"""Autoscaler benchmark: a step load against `pagedkube up --autoscale`.

    .venv/bin/python bench/autoscale.py [--clients 8] [--steady 120] [--cooldown 45] [--out build/bench/autoscale]

Starts `pagedkube up --autoscale` with one engine (built-in model,
--max-num-seqs 1 so that requests queue), samples the gateway's
pagedkube_autoscaler_* gauges every 0.25 s, and at the step starts N
closed-loop clients (each sends the next completion as soon as the last one
answers) for --steady seconds, then stops them and watches the fleet return to
the minimum for --cooldown seconds.

Reports: time from the step until the desired replica count changes, until
the first new engine answers a request, the scale events during the steady load
after the first settle (ready == desired after the scale-up; target: none), and
every request's status (a 200 whose answer is short counts as cut). After the step,
--tail-clients go on with --tail-tokens answers for --tail seconds, so the fleet scales
in while work runs (the scale-in that lost requests before the in-flight signal);
--scale-signal waiting runs the old signal for comparison. Writes results.json and autoscale.png (replicas and
queue depth over time) to --out; docs/benchmarks.md quotes them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """The autoscaler's samples, keyed as the exposition writes them (`name{label="v"}`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("pagedkube_autoscaler_"):
                labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def sampler(url: str, samples: list[dict], t0: float, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        while not stop.is_set():
            try:
                m = parse_metrics((await http.get(f"{url}/metrics")).text)
                samples.append({"t": time.monotonic() - t0,
                                "desired": m.get("pagedkube_autoscaler_desired_replicas", 0),
                                "ready": m.get("pagedkube_autoscaler_ready_replicas", 0),
                                "queue": m.get("pagedkube_autoscaler_queue_depth", 0),
                                "up": m.get('pagedkube_autoscaler_scale_events_total{direction="up"}', 0),
                                "down": m.get('pagedkube_autoscaler_scale_events_total{direction="down"}', 0)})
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)


async def client(url: str, c: int, t0: float, until: float, answers: list[dict], max_tokens: int = 16) -> None:
    async with httpx.AsyncClient(timeout=600) as http:
        i = 0
        while time.monotonic() < until:
            r = await http.post(f"{url}/v1/completions", json={
                "model": "tiny", "prompt": f"My dog number {c}-{i} likes to", "max_tokens": max_tokens,
                "ignore_eos": True})
            whole = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == max_tokens
            answers.append({"t": time.monotonic() - t0, "status": r.status_code if whole else f"{r.status_code} cut",
                            "endpoint": r.headers.get("x-pagedkube-endpoint")})
            i += 1


async def run(args: argparse.Namespace, url: str, log_path: Path) -> dict:
    samples: list[dict] = []
    answers: list[dict] = []
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampling = asyncio.create_task(sampler(url, samples, t0, stop))
    await asyncio.sleep(args.idle)
    engine0 = re.search(r"engine-0 +ready +(\S+)", log_path.read_text())[1]
    t_step = time.monotonic() - t0
    until = time.monotonic() + args.steady
    await asyncio.gather(*(client(url, c, t0, until, answers) for c in range(args.clients)))
    t_end_load = time.monotonic() - t0
    # The tail: a few clients go on with long answers while the fleet scales in under them.
    tail_until = time.monotonic() + args.tail
    await asyncio.gather(*(client(url, 100 + c, t0, tail_until, answers, args.tail_tokens)
                           for c in range(args.tail_clients)))
    await asyncio.sleep(max(0.0, args.cooldown - args.tail))
    stop.set()
    await sampling

    initial = next(s["desired"] for s in samples if s["t"] >= t_step - 0.5)
    first_change = next((s["t"] for s in samples if s["t"] >= t_step and s["desired"] != initial), None)
    new_serves = next((a["t"] for a in sorted(answers, key=lambda a: a["t"])
                       if a["endpoint"] not in (None, engine0)), None)
    settled = next((s for s in samples if s["t"] >= t_step and s["ready"] >= 2 and s["ready"] == s["desired"]), None)
    during = [s for s in samples if settled and settled["t"] <= s["t"] <= t_end_load]
    events_after_settle = (during[-1]["up"] + during[-1]["down"] - during[0]["up"] - during[0]["down"]) if during else None
    return {
        "samples": samples, "answers": len(answers),
        "statuses": {str(k): sum(1 for a in answers if a["status"] == k) for k in {a["status"] for a in answers}},
        "t_step": t_step, "t_end_load": t_end_load,
        "step_to_desired_change_s": None if first_change is None else first_change - t_step,
        "step_to_new_engine_serves_s": None if new_serves is None else new_serves - t_step,
        "settled_at_s": None if settled is None else settled["t"] - t_step,
        "settled_replicas": None if settled is None else settled["ready"],
        "max_desired": max(s["desired"] for s in samples),
        "scale_events_after_settle": events_after_settle,
        "scale_events_total": samples[-1]["up"] + samples[-1]["down"],
        "final": samples[-1],
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t"] - result["t_step"] for x in s]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.step(t, [x["desired"] for x in s], where="post", label="desired replicas")
    ax.step(t, [x["ready"] for x in s], where="post", label="ready replicas")
    ax.set_xlabel("seconds since the step")
    ax.set_ylabel("engines")
    ax2 = ax.twinx()
    ax2.plot(t, [x["queue"] for x in s], color="tab:gray", alpha=0.6, label="queue depth")
    ax2.set_ylabel("queue depth (waiting + held)")
    ax.axvspan(0, result["t_end_load"] - result["t_step"], color="tab:orange", alpha=0.08, label="step load")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-replicas", type=int, default=3)
    p.add_argument("--target-queue-depth", type=float, default=2.0)
    p.add_argument("--scale-down-window", type=float, default=30.0)
    p.add_argument("--idle", type=float, default=5.0, help="seconds sampled before the step")
    p.add_argument("--steady", type=float, default=120.0, help="seconds of step load")
    p.add_argument("--cooldown", type=float, default=45.0, help="seconds sampled after the load")
    p.add_argument("--tail-clients", type=int, default=4, help="clients that go on after the step, with long answers")
    p.add_argument("--tail-tokens", type=int, default=1200, help="the tail clients' max_tokens")
    p.add_argument("--tail", type=float, default=60.0, help="seconds of the tail (within --cooldown if shorter)")
    p.add_argument("--scale-signal", choices=("in-flight", "waiting"), default="in-flight",
                   help="the autoscaler's signal (waiting: the old one, for the comparison in docs/benchmarks.md)")
    p.add_argument("--out", default="build/bench/autoscale")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = out / "up.log"
    flags = ["--port", str(port), "--model", "builtin://tiny", "--route-headers", "--replicas", "1", "--autoscale",
             "--min-replicas", "1",
             "--max-replicas", str(args.max_replicas), "--target-queue-depth", str(args.target_queue_depth),
             "--scale-up-window", "0", "--scale-down-window", str(args.scale_down_window),
             "--autoscale-interval", "0.5", "--max-num-seqs", "1", "--num-kv-blocks", "128",
             "--max-model-len", "1400", "--scale-signal", args.scale_signal]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pagedkube", "up", *flags], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit(f"pagedkube up did not get ready; see {log_path}")
            result = asyncio.run(run(args, url, log_path))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    result["flags"] = flags
    result["clients"] = args.clients
    result["machine"] = f"{platform.processor() or platform.machine()}, nproc={os.cpu_count()}"
    result["date"] = time.strftime("%Y-%m-%d")
    (out / "results.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "autoscale.png")
    summary = {k: v for k, v in result.items() if k not in ("samples",)}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

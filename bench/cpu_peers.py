"""pagedkube against the CPU peers on the same GGUF file: llama.cpp's llama-server and Hugging Face.

One workload, pet-care chat sessions (bench/workloads.py: a shared system prompt, a per-dog
profile, 3-5 user turns, each turn sent with the real replies so far), driven through the
OpenAI API by C concurrent clients (each runs its sessions turn by turn, streaming):

    pagedkube   `pagedkube serve --model FILE` in one or more weight modes (--modes):
                  fp32   --quantization none --dtype float32 (every weight dequantized: the reference)
                  gguf   --quantization auto (the file's Q8_0/Q4_0/Q4_1/Q4_K blocks served as stored),
                         decode capture at its default (auto: buckets 1, 2, 4, 8 compiled in the
                         background); the clients start once every bucket is ready (the log
                         says so), the steady state of a server that has run a few minutes, and
                         that wait is reported beside launch-to-ready (capture_ready_s)
                  gguf-eager  gguf with --decode-capture off
                  int8   --quantization int8 (projections requantized per channel at load)
                  int4   --quantization int4 (projections requantized in groups at load)
                  gguf-captured  gguf with --decode-capture on (decode steps of 1-8 sequences compiled
                         at start, engine/decode_capture.py)
                the quantized modes run with dtype auto (bf16 activations on a CPU with bf16)
    llama-server  llama.cpp's own server (bench/llama_server.py builds it once from the sources
                llama-cpp-python 0.3.36 vendors), `-np` = the most clients, continuous batching:
                the serving peer
    llamacpp-python  `python -m llama_cpp.server` (the binding's server), one request at a time,
                so C clients queue: not a serving peer; off unless --skip leaves it in
    HF floor    transformers generate on the same file (fp32), one request at a time, in
                process (1 client only: a server around it could not do better at C > 1)

At C = 1, 8, 32 and 64: output tokens/s, TTFT p50/p99 and ITL p50/p99, and pagedkube's ratio to
each peer; per server its launch-to-ready seconds and peak RSS (the process tree, sampled every
0.2 s); its greedy agreement with the float32 reference (pagedkube fp32): 16 chats x 48 tokens,
the common prefix of the token ids over the reference's length, as tests/engine/test_quant_quality.py
scores it, and how many chats are identical; beside them the batch-1 roofline of each engine (bench/roofline.py: measured copy
bandwidth / weight bytes read per token); also output tokens per CPU-second of the server's processes (psutil: the server and its
children), the ratio that survives a shared machine, where wall time mostly measures the
neighbours. Then a torch.profiler profile of pagedkube's engine step with 32 decoding sequences:
where the step time goes. Greedy, max_tokens 32; EOS may end a reply early (both servers
stop on it), so throughput counts the tokens each produced.

llama-server builds from source (15-36 min on 2 cores) into a cached folder, never in CI:

    .venv/bin/python bench/llama_server.py build [avx2]
    .venv/bin/python bench/cpu_peers.py [--clients 1,8,32,64] [--json out.json] [--isa avx2]

(--isa avx2 on a CPU with AVX-512 measures the AVX2 class: torch, oneDNN and Inductor forced to
AVX2 in every process, against llama-server built for AVX2; the kernel calibration cache is
keyed on torch's vector level, so it is timed afresh under AVX2.)

(the binding's server, for the record: `python3 -m venv ~/.cache/pagedkube/bench-venv &&
~/.cache/pagedkube/bench-venv/bin/pip install 'llama-cpp-python[server]==0.3.36'`, then
`--skip ''`.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import threading

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_server
from workloads import Session, petcare_chat

LLAMA_VENV = Path.home() / ".cache" / "pagedkube" / "bench-venv"
MODES = {"fp32": ["--quantization", "none", "--dtype", "float32", "--decode-capture", "off"],
         "gguf": ["--quantization", "auto"], "gguf-eager": ["--quantization", "auto", "--decode-capture", "off"],
         "int8": ["--quantization", "int8"], "int4": ["--quantization", "int4"],
         "gguf-captured": ["--quantization", "auto", "--decode-capture", "on", "--decode-capture-sizes", "1,8"],
         "gguf-wide": ["--quantization", "auto", "--decode-capture-sizes", "1,2,4,8,16,32,64"]}
MODE_KWARGS = {"fp32": dict(quantization="none", dtype="float32"), "gguf": dict(quantization="auto"),
               "gguf-eager": dict(quantization="auto"),
               "gguf-captured": dict(quantization="auto"), "gguf-wide": dict(quantization="auto"),
               "int8": dict(quantization="int8"), "int4": dict(quantization="int4")}
MAX_TOKENS = 32
AGREEMENT_CHATS, AGREEMENT_TOKENS = 16, 48
# Threads per engine (--threads): 1 by default, as the other CPU benches here: on a shared
# 2-core machine a second thread mostly spins; both engines always get the same number.
THREADS = 1


def sessions(num: int, seed: int = 0) -> list[Session]:
    """petcare_chat with 3-5 turns per session (seeded)."""
    rng = random.Random(seed)
    out = petcare_chat(num_sessions=num, turns=5, seed=seed, max_tokens=MAX_TOKENS).sessions
    for s in out:
        s.user_turns = s.user_turns[:rng.randint(3, 5)]
    return out


def api(url: str):
    """An async openai client that opens a new connection per request: llama-server may close a
    kept-alive connection right after a streamed answer, and both servers are driven alike."""
    import httpx2
    import openai
    http = openai.DefaultAsyncHttpx2Client(limits=httpx2.Limits(max_keepalive_connections=0, max_connections=None))
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=3600, max_retries=0, http_client=http)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _turn(client, model: str, messages: list[dict], rec: dict) -> str:
    start = time.perf_counter()
    stamps, text = [], []
    stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                                  temperature=0.0, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
            text.append(chunk.choices[0].delta.content)
    if stamps:
        rec["ttft"].append(stamps[0] - start)
        rec["itl"] += [b - a for a, b in zip(stamps, stamps[1:])]
    rec["tokens"] += len(stamps)
    return "".join(text)


async def drive(url: str, model: str, clients: int) -> dict:
    work = sessions(max(2, clients))
    rec = {"ttft": [], "itl": [], "tokens": 0}
    queue: asyncio.Queue = asyncio.Queue()
    for s in work:
        queue.put_nowait(s)
    async with api(url) as client:
        async def worker():
            while not queue.empty():
                s = queue.get_nowait()
                for turn in range(s.num_turns):
                    s.replies.append(await _turn(client, model, s.messages(turn), rec))
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - start
    return summary(rec, wall, len(work))


async def warm_up(url: str, model: str) -> None:
    async with api(url) as client:
        await client.chat.completions.create(model=model, max_tokens=4,
                                             messages=[{"role": "user", "content": "Hello"}])


def summary(rec: dict, wall: float, num_sessions: int) -> dict:
    return {"sessions": num_sessions, "output_tokens": rec["tokens"], "wall_s": round(wall, 1),
            "tok_s": rec["tokens"] / wall, "ttft_p50_ms": 1e3 * pct(rec["ttft"], 0.5),
            "ttft_p99_ms": 1e3 * pct(rec["ttft"], 0.99), "itl_p50_ms": 1e3 * pct(rec["itl"], 0.5),
            "itl_p99_ms": 1e3 * pct(rec["itl"], 0.99)}


def pagedkube_command(gguf: Path, port: int, name: str, max_seqs: int, mode: str, quantized_dtype: str = "auto"
                      ) -> list[str]:
    """`pagedkube serve` of the file in one of MODES."""
    return [sys.executable, "-P", "-m", "pagedkube", "serve", "--model", str(gguf), "--port", str(port),
            "--served-model-name", name, "--device", "cpu", "--max-num-seqs", str(max_seqs), "--max-model-len", "2048",
            *MODES[mode], *([] if mode == "fp32" else ["--dtype", quantized_dtype])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, ready_path: str, log: Path, env: dict | None = None
          ) -> tuple[subprocess.Popen, float]:
    """The server process and its launch-to-ready seconds (the first 200 on `ready_path`)."""
    env = {**(env or os.environ), "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
    launched = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:4]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready_path}", timeout=2).status_code == 200:
                return proc, time.perf_counter() - launched
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{cmd[:4]} not ready; see {log}")


class PeakRss:
    """The largest resident set of a process and its children, sampled every 0.2 s in a thread."""

    def __init__(self, pid: int):
        import psutil
        self.root = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil
        while not self._stop.wait(0.2):
            total = 0
            try:
                for p in [self.root, *self.root.children(recursive=True)]:
                    total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            self.peak = max(self.peak, total)

    def stop(self) -> float:
        """Peak MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def cpu_seconds(pid: int) -> float:
    import psutil
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# The line that says decode steps run at full speed: every bucket compiled, or native decode
CAPTURE_READY = ("decode capture (torch.compile): buckets", "decode steps run natively")


def wait_for_log(log: Path, text: str | tuple[str, ...], since: float, timeout: float = 1200) -> float:
    """Seconds from `since` until `text` (or any of them) appears in the log."""
    texts = (text,) if isinstance(text, str) else text
    while not any(t in log.read_text(errors="replace") for t in texts):
        if time.monotonic() - since > timeout:
            raise RuntimeError(f"{log}: none of {texts!r} within {timeout} s")
        time.sleep(0.5)
    return time.monotonic() - since


def run_server(name: str, cmd: list[str], port: int, ready: str, model: str, levels: list[int], logdir: Path,
               env: dict | None = None, capture: bool = False) -> dict:
    launched = time.monotonic()
    proc, ready_s = start(cmd, port, ready, logdir / f"{name}.log", env)
    rss = PeakRss(proc.pid)
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(warm_up(url, model))
        out: dict = {"ready_s": ready_s}
        if capture:
            out["capture_ready_s"] = wait_for_log(logdir / f"{name}.log", CAPTURE_READY, launched)
            print(name, "capture ready after", round(out["capture_ready_s"], 1), "s", flush=True)
        for c in levels:
            cpu = cpu_seconds(proc.pid)
            out[c] = asyncio.run(drive(url, model, c))
            out[c]["server_cpu_s"] = cpu_seconds(proc.pid) - cpu
            out[c]["tok_per_cpu_s"] = out[c]["output_tokens"] / out[c]["server_cpu_s"]
            print(name, c, json.dumps(out[c]), flush=True)
        out["replies"] = asyncio.run(greedy_replies(url, model))
        return out
    finally:
        out_rss = rss.stop()
        stop(proc)
        print(name, "ready_s", round(ready_s, 2), "peak_rss_mib", round(out_rss), flush=True)
        if "out" in locals():
            out["peak_rss_mib"] = out_rss


async def greedy_replies(url: str, model: str) -> list[str]:
    """The agreement chats' greedy replies (first turns of fresh sessions), one at a time."""
    replies = []
    async with api(url) as client:
        for s in sessions(AGREEMENT_CHATS, seed=1):
            r = await client.chat.completions.create(model=model, messages=s.messages(0), temperature=0.0,
                                                     max_tokens=AGREEMENT_TOKENS)
            replies.append(r.choices[0].message.content or "")
    return replies


def agreement(reference: list[str], replies: list[str], encode) -> dict:
    """Mean common-prefix fraction of the token ids (of the reference's length) and identical chats."""
    fractions, identical = [], 0
    for ref, got in zip(reference, replies):
        a, b = encode(ref), encode(got)
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fractions.append(k / max(1, len(a)))
        identical += a == b
    return {"agreement": sum(fractions) / max(1, len(fractions)), "identical": identical, "chats": len(fractions)}


def run_hf(gguf: Path) -> dict:
    """transformers generate, one request at a time, timed per token by a streamer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer
    torch.set_num_threads(THREADS)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times, self.first = [], True

        def put(self, value):
            if self.first:          # the prompt
                self.first = False
            else:
                self.times.append(time.perf_counter())

        def end(self):
            pass

    rec = {"ttft": [], "itl": [], "tokens": 0}
    work = sessions(2)
    start_all, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for s in work:
            for turn in range(s.num_turns):
                ids = tok.apply_chat_template(s.messages(turn), add_generation_prompt=True, return_tensors="pt",
                                              return_dict=True)["input_ids"]
                st, t0 = Stamps(), time.perf_counter()
                out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, streamer=st,
                                     pad_token_id=tok.pad_token_id)
                new = out[0, ids.shape[1]:]
                s.replies.append(tok.decode(new, skip_special_tokens=True))
                rec["ttft"].append(st.times[0] - t0)
                rec["itl"] += [b - a for a, b in zip(st.times, st.times[1:])]
                rec["tokens"] += len(new)
    out = summary(rec, time.perf_counter() - start_all, len(work))
    out["server_cpu_s"] = time.process_time() - cpu
    out["tok_per_cpu_s"] = out["output_tokens"] / out["server_cpu_s"]
    print("hf", 1, json.dumps(out), flush=True)
    return {1: out}


def profile_step(gguf: Path, num_seqs: int = 32, steps: int = 8) -> dict:
    """Where one decode step of num_seqs sequences spends its time (torch.profiler, CPU)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(THREADS)                         # as the servers run

    from pagedkube.engine import LLM, SamplingParams
    # capture off: steps of 32 sequences run eager anyway (buckets stop at 8), and a compile thread
    # would run its own forwards inside the profile
    llm = LLM(str(gguf), device="cpu", max_num_seqs=num_seqs, max_model_len=1024, decode_capture="off")
    tok = llm.get_tokenizer()
    prompts = [tok.encode_chat(s.messages(0)) for s in sessions(num_seqs)]
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    while list(engine.scheduler.waiting) or any(s.num_computed_tokens < len(s.prompt_token_ids)
                                                for s in engine.scheduler.running):
        engine.step()                                      # prefill everything first
    run = engine.runner.execute
    timing = {"execute": 0.0}

    def timed(*args):
        t = time.perf_counter()
        try:
            return run(*args)
        finally:
            timing["execute"] += time.perf_counter() - t
    engine.runner.execute = timed
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    wall = time.perf_counter() - t0
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = sum(e.self_cpu_time_total for e in ops)
    return {"seqs": num_seqs, "steps": steps, "step_ms": 1e3 * wall / steps,
            "runner_share": timing["execute"] / wall,
            "top_ops": [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
                         "share": e.self_cpu_time_total / total_us, "calls_per_step": e.count / steps}
                        for e in ops[:12]]}


def main() -> None:
    global THREADS   # one value for the servers' env, llama.cpp's --n_threads and the in-process runs
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file (default: smollm2-135m-instruct's)")
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    parser.add_argument("--skip", default="llamacpp-python",
                        help="comma list of parts to skip: pagedkube,llama-server,llamacpp-python,hf,profile,roofline "
                             "(default: llamacpp-python)")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["fp32", "gguf"],
                        help=f"pagedkube weight modes, comma list of {sorted(MODES)}")
    parser.add_argument("--quantized-dtype", default="auto",
                        help="--dtype of the quantized modes (auto: the engine's rule, bf16 on a CPU with bf16)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=THREADS, help="threads per engine (default 1)")
    parser.add_argument("--logdir", type=Path, default=Path("/tmp"))
    parser.add_argument("--isa", choices=sorted(llama_server.ISA_FLAGS), default="native",
                        help="native: this CPU's kernels; avx2: the AVX2 class on a CPU with AVX-512 (torch, oneDNN "
                             "and Inductor forced to AVX2, llama-server built for AVX2/FMA/F16C)")
    args = parser.parse_args()
    THREADS = args.threads
    if args.isa == "avx2":        # read by torch, oneDNN and Inductor at start: set before any import of torch
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    from pagedkube.model_source import resolve_model_source
    source = resolve_model_source(args.model)
    gguf, skip = source.path, set(filter(None, args.skip.split(",")))
    results: dict = {"model": str(gguf), "cpu": cpu_model(), "isa": args.isa,
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        parser.error(f"unknown --modes {bad}; choose from {sorted(MODES)}")
    if "roofline" not in skip:
        results["roofline"] = roofline_rows(gguf, args.modes, args.quantized_dtype)
    if "pagedkube" not in skip:
        for mode in args.modes:
            port = free_port()
            results[f"pagedkube-{mode}"] = run_server(
                f"pagedkube-{mode}", pagedkube_command(gguf, port, source.name, max(args.clients), mode,
                                                       args.quantized_dtype),
                port, "/ready", source.name, args.clients, args.logdir,
                env={**os.environ, "PAGEDKUBE_DECODE_CAPTURE": "auto"}, capture="--decode-capture" not in MODES[mode])
    if "llama-server" not in skip:
        port = free_port()
        argv, env = llama_server.command(gguf, port, THREADS, slots=max(args.clients), isa=args.isa)
        results["llama-server"] = run_server("llama-server", [*argv, "--alias", source.name], port, "/health",
                                             source.name, args.clients, args.logdir, env)
    if "llamacpp-python" not in skip:
        port = free_port()
        results["llamacpp-python"] = run_server(
            "llamacpp-python", [str(LLAMA_VENV / "bin" / "python"), "-P", "-m", "llama_cpp.server", "--model",
                                str(gguf), "--port", str(port), "--n_ctx", "4096", "--n_threads", str(THREADS),
                                "--model_alias", source.name, "--verbose", "False",
                                "--interrupt_requests", "False"],   # its default cancels a stream when the next arrives
            port, "/v1/models", source.name, args.clients, args.logdir)
    if "hf" not in skip:
        results["hf"] = run_hf(gguf)
    peers = [p for p in ("llama-server", "llamacpp-python", "hf") if p in results]
    for mode in args.modes:
        ours = results.get(f"pagedkube-{mode}")
        if ours is None:
            continue
        for peer in peers:
            levels = [c for c in results[peer] if isinstance(c, int) and c in ours]
            results[f"ratio_{mode}_vs_{peer}"] = {c: ours[c]["tok_s"] / results[peer][c]["tok_s"] for c in levels}
            results[f"cpu_ratio_{mode}_vs_{peer}"] = {
                c: ours[c]["tok_per_cpu_s"] / results[peer][c]["tok_per_cpu_s"] for c in levels}
    if "replies" in results.get("pagedkube-fp32", {}):
        from pagedkube.engine.gguf.prepare import gguf_model_dir   # the file's tokenizer, as the engine converted it
        from pagedkube.tokenizer import Tokenizer
        tokenizer = Tokenizer.from_pretrained(gguf_model_dir(gguf))
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        reference = results["pagedkube-fp32"]["replies"]
        for name, run in results.items():
            if isinstance(run, dict) and "replies" in run:
                run["agreement"] = agreement(reference, run["replies"], encode)
                print(name, "agreement", json.dumps(run["agreement"]), flush=True)
    if "profile" not in skip:
        results["profile_32"] = profile_step(gguf)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def roofline_rows(gguf: Path, modes: list[str], quantized_dtype: str) -> dict:
    """Bandwidth with the engines' thread count, bytes per token and the bound, per engine."""
    import roofline
    gbps = roofline.copy_bandwidth_gbps(THREADS)
    rows = {"copy_gbps": gbps, "threads": THREADS}
    sizes = {"llamacpp": roofline.gguf_bytes(gguf)}
    for mode in modes:
        kwargs = MODE_KWARGS[mode] if mode == "fp32" else {**MODE_KWARGS[mode], "dtype": quantized_dtype}
        sizes[f"pagedkube-{mode}"] = roofline.engine_weight_bytes(str(gguf), **kwargs)
    for name, nbytes in sizes.items():
        rows[name] = {"mb_per_token": nbytes / 1e6, "bound_tok_s": gbps * 1e9 / nbytes}
        print("roofline", name, json.dumps(rows[name]), flush=True)
    return rows


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()

"""The gateway's own overhead, for bench/routing.py: the same requests straight to a null
engine (answers at once, serves the built-in tokenizer and an empty cache feed) and through a
gateway in front of it, and the routing decision alone, in process.

    .venv/bin/python bench/routing_overhead.py PORT    # the null engine (overhead() starts it)
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

import httpx

from routing_procs import MODEL, REPO, Procs, free_port, percentile, wait_ready
from workloads import petcare_chat


def null_engine_main(port: int) -> None:
    """An engine that answers at once: /ready, /v1/models, the cache config and
    tokenizer of the built-in model, an empty feed, and a fixed completion."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from pagedkube import hashing
    from pagedkube.tokenizer import TOKENIZER_FILES

    model_dir = REPO / "pagedkube" / "builtin" / "tiny"
    files = {n: (model_dir / n).read_text() for n in TOKENIZER_FILES if (model_dir / n).is_file()}
    answer = {"id": "x", "object": "chat.completion", "model": MODEL,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": 0}}}
    app = FastAPI()
    app.get("/ready")(lambda: {"status": "ready"})
    app.get("/metrics")(lambda: JSONResponse({}))
    app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
    app.get("/v1/cache/config")(lambda: {**hashing.cache_config(16), "engine_id": "null"})
    app.get("/v1/cache/events")(lambda: {"engine_id": "null", "latest_seq": 0, "reset": False, "events": []})
    app.get("/v1/cache/tokenizer")(lambda: {"files": files})
    app.post("/v1/chat/completions")(lambda: answer)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def overhead(procs: Procs, seed: int, n: int = 200) -> dict:
    port = free_port()
    procs.procs.append(subprocess.Popen([sys.executable, __file__, str(port)], cwd=REPO))
    null = f"http://127.0.0.1:{port}"
    wait_ready([null])
    gateway = procs.start("gateway-null", ["-m", "pagedkube", "gateway", "--endpoints", null])
    wait_ready([gateway], tokenizer=True)
    sessions = petcare_chat(num_sessions=n // 4, turns=4, seed=seed).sessions
    bodies = []
    for s in sessions:
        s.replies = ["Twice a day is fine for most adult dogs; split the food into two meals."] * 4
        bodies += [{"model": MODEL, "messages": s.messages(t), "max_tokens": 4} for t in range(4)]
    # Alternate direct and gateway requests so both see the same machine load;
    # the overhead is the median of the per-pair differences.
    direct, via = [], []
    with httpx.Client(timeout=30) as client:
        for body in bodies * 2:
            for url, times in ((null, direct), (gateway, via)):
                start = time.perf_counter()
                client.post(url + "/v1/chat/completions", json=body).raise_for_status()
                times.append(time.perf_counter() - start)
    return {"requests": len(direct), "direct_p50_ms": 1000 * statistics.median(direct),
            "gateway_p50_ms": 1000 * statistics.median(via),
            "overhead_p50_ms": 1000 * statistics.median([v - d for v, d in zip(via, direct)]),
            "overhead_p99_ms": 1000 * percentile([v - d for v, d in zip(via, direct)], 99),
            "routing_only_p50_ms": routing_only(bodies)}


def routing_only(bodies: list[dict]) -> float:
    """In-process: render + tokenize + hash + pick, per request (p50, ms)."""
    from pagedkube.gateway.prompt import PromptHasher
    from pagedkube.gateway.routing.bounded_load import BoundedLoad
    from pagedkube.gateway.routing.picker import PrefixPicker
    from pagedkube.gateway.routing.prefix_index import PrefixIndex
    from pagedkube.gateway.routing.ring import RingCache
    from pagedkube.tokenizer import Tokenizer

    hasher = PromptHasher(Tokenizer.from_pretrained(REPO / "pagedkube" / "builtin" / "tiny"))
    picker = PrefixPicker(PrefixIndex(), BoundedLoad(), RingCache())
    pods = [f"http://10.0.0.{i}:8000" for i in range(4)]
    times = []
    for body in bodies * 2:
        start = time.perf_counter()
        picker.pick(hasher.routing_input("chat", body, None), pods, dict.fromkeys(pods, 1))
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


if __name__ == "__main__":
    null_engine_main(int(sys.argv[1]))

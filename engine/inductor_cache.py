"""Inductor's cache for the captured CPU decode step: code any AVX2 CPU runs, and a warm copy of
it built into the engine image.

A CPU engine with a C++ compiler compiles its decode buckets in the background while it serves
(engine/decode_capture.py). Cold, that is minutes of CPU on a small node, every pod start. The
engine image compiles the default model's buckets once at build time:

    python -m pagedkube.engine.inductor_cache DIR      # Inductor's cache entries -> DIR

and an engine whose $PAGEDKUBE_INDUCTOR_SEED_DIR names DIR copies the entries its own cache
(torch's cache_dir(): $TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_<user>) lacks before
compiling (`seed`). Dynamo still traces each bucket; Inductor's work and the C++ compiler's come
from the cache. The compile log line counts the cache's hits and misses.

One cache serves every node only if its code does not depend on the machine that built it:
- the thread count: Inductor's kernels otherwise specialise on torch.get_num_threads() at
  compile time, and the cache keys them by it. Its own loops in a decode step are small
  (norms, rope, activations over a few rows of 576-1,536 values) and run on one thread
  (INDUCTOR_THREADS), everywhere; our kernels, the projections and attention, keep torch's;
- vectors: AVX2's 256 bits on every x86 CPU (CPU_SIMD_BITS; also what keeps Inductor's
  AVX-512 loops from writing past a buffer);
- the KV pool's block count, sized from free memory at each start, is a dynamic dimension of
  the graph (decode_capture.CompiledDecode), not a constant, so a restart hits its own cache;
- the compiler's target: Inductor passes -march=native, and the C++ cache keys a .so by that
  flag's text, so an AVX-512 build machine's .so could carry AVX-512 instructions into a cache
  that an AVX2 node then loads. Where the cache is shared (a process with
  $PAGEDKUBE_INDUCTOR_SEED_DIR set, and `warm`, which builds one) and the CPU has AVX2, the
  target is x86-64-v3 (AVX2, FMA, F16C, BMI2; gcc 11 or clang 12 and later), the same on every
  such machine (`compile_options(portable=True)`). Elsewhere it stays native: on this project's
  AVX-512 machine, AVX2 forced, a one-client step took 14.08 ms native and 14.46 ms x86-64-v3.
What still keys a bucket's graph: the model, the bucket, max_model_len, the block size, and the
kernels the calibration measured fastest (engine/quant/calibrate.py). A node whose calibration
picks other kernels, or a pod given another max_model_len, compiles those graphs itself.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SEED_ENV = "PAGEDKUBE_INDUCTOR_SEED_DIR"   # a read-only folder of warm cache entries (the image's)
# Inductor's vector width in bits (`cpp.simdlen` is compared with an ISA's bit_width; a width no
# ISA has means scalar code): AVX2's, 8 floats. On an AVX-512 CPU, left to itself, Inductor wrote
# the int8 embedding's lookup fused with the first RMSNorm as loops of 8 floats whose stores were
# 16 wide (at::vec::Vectorized<float> under AVX-512): 32 bytes past the end of the hidden-state
# buffer, every step, and the heap corruption aborted engines with malloc errors
# (docs/benchmarks.md "Int16 activations"). In AVX2's code loops and vectors are both 8 floats.
# Our kernels do the heavy work, so the narrower vectors cost the fused elementwise loops little.
CPU_SIMD_BITS = 256
PORTABLE_MARCH = "x86-64-v3"
# Threads of Inductor's own loops: 1, no OpenMP region to fork and join. A one-client step took
# 14.08 ms so against 14.60 ms at torch's 2 threads, every one of 12 interleaved rounds shorter;
# reading the count at run time (`cpp.dynamic_threads`) measured no better than one thread
# (bench/capture_ab.py, docs/benchmarks.md "A warm Inductor cache in the engine image").
INDUCTOR_THREADS = 1
_SKIPPED = {"locks"}                        # Inductor's lock files: per process, never copied
_COUNTERS = (("aot_autograd", "autograd_cache"), ("inductor", "fxgraph_cache"))


def shared() -> bool:
    """Whether this process's Inductor cache is shared with other machines (seeded, or being built
    to seed others): then its code must run on any of them."""
    return bool(os.environ.get(SEED_ENV))


def compile_options(portable: bool | None = None) -> dict[str, str | int | bool]:
    """Inductor's C++ options for the decode step (decode_capture.CompiledDecode); `portable`
    (code for any machine of the class) defaults to whether this process's cache is shared()."""
    options: dict[str, str | int | bool] = {"cpp.simdlen": CPU_SIMD_BITS, "cpp.threads": INDUCTOR_THREADS}
    if portable is None:
        portable = shared()
    if portable and platform.machine() in ("x86_64", "AMD64") and torch.cpu._is_avx2_supported():
        options["cpp.march"] = PORTABLE_MARCH
    return options


def cache_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir
    return Path(inductor_cache_dir())


def seed(source: Path, dest: Path | None = None) -> int:
    """Copies the files under `source` that `dest` (torch's cache folder) lacks; the number copied.
    An entry already there is kept: it is the same key's content, or this machine's own."""
    dest = cache_dir() if dest is None else dest
    copied = 0
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if rel.parts[0] in _SKIPPED or not path.is_file():
            continue
        target = dest / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)            # another process reading the cache never sees half a file
        copied += 1
    return copied


def seed_from_env() -> None:
    """seed() from $PAGEDKUBE_INDUCTOR_SEED_DIR when it names a folder; logs what it did."""
    source = os.environ.get(SEED_ENV)
    if not source:
        return
    if not Path(source).is_dir():
        log.warning("$%s=%s is not a folder: the decode buckets compile without a warm cache", SEED_ENV, source)
        return
    try:
        n = seed(Path(source))
    except OSError as exc:          # a full or read-only cache folder: compile cold, as without a seed
        log.warning("decode capture: could not copy the warm Inductor cache from %s: %s", source, exc)
        return
    log.info("decode capture: %d warm Inductor cache file(s) copied from %s to %s", n, source, cache_dir())


def cache_counts() -> dict[str, int]:
    """Hits and misses of Inductor's caches in this process so far: AOTAutograd's (a hit skips
    the whole compile after Dynamo) and the FX graph cache's (a hit skips Inductor's codegen and
    the C++ compiler)."""
    from torch._dynamo.utils import counters
    return {f"{prefix}_{kind}": counters[group][f"{prefix}_{kind}"]
            for group, prefix in _COUNTERS for kind in ("hit", "miss")}


def warm(out: Path, model: str | None = None) -> dict[str, int]:
    """Compiles the decode buckets of `model` (the default model when None) as a default
    `pagedkube serve` engine would, and copies Inductor's cache to `out`."""
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.llm_engine import LLMEngine
    out.mkdir(parents=True, exist_ok=True)
    os.environ[SEED_ENV] = str(out)       # the code a shared cache needs (shared()); seeds nothing yet
    engine = LLMEngine(EngineConfig(model=model, decode_capture="on"))
    counts = cache_counts()
    del engine
    copied = seed(cache_dir(), out)
    log.info("warm Inductor cache: %d file(s) in %s (%s)", copied, out, counts)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description="Compile the default model's decode buckets and keep "
                                             "Inductor's cache entries in a folder (the engine image's).")
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default=None, help="the model (default: pagedkube's default model)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(warm(args.out, args.model))


if __name__ == "__main__":
    main()

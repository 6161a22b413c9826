"""Projection kernels chosen by measurement on the CPU that runs them, not by its flags.

Which way of computing y = x W^T is fastest depends on the CPU more than on anything its
flags say (docs/benchmarks.md, "CPU kernels chosen by measurement"): on an AVX2-only EPYC
torch's int4 kernel with float32 activations takes 48x a dense float32 matmul, and dense
bf16 takes 3x, while on an AVX-512 bf16 one the packed int4 kernel wins. So at load, for
each distinct projection (kind, N, K) of the model, each candidate the file's weights
allow is built from a synthetic weight of that shape and timed at a decode batch
(DECODE_ROWS) and a prefill batch (PREFILL_ROWS), the candidates taking turns (`measure`).
A decode call is timed the way a decode step meets it: on a weight that is not in the core's
caches (a rotation through copies of it, ROTATION_BYTES of packed codes in all), since a
step reads every layer's weights once and the model is larger than the caches. Timed on one
weight right after another candidate's prefill call, as before, our fused kernel measured
3-4x its streamed time and lost the 576x576 projection to dequantize-then-matmul, which is
2x slower in a real step (docs/benchmarks.md "Decode timings on streamed weights").

    candidate     weight kept as                      activations in the kernel     exact
    q4fused-f32   the file's Q4 codes, scales, mins   float32 (engine/quant/q4_fused.py)  yes
    q4i16-f32     the same tensors (no second copy)   float32, rounded to int16 per
                                                      group of 32 inside the kernel
                                                      below 12 rows (q4_linear.cpp)  near
    q4deq-f32     the same tensors (no second copy)   float32: W dequantized per call,
                                                      then a float32 matmul          yes
    int4-f32      tinygemm's packed int4              float32                        yes
    dense-f32     float32 (Q4 values exactly)         float32                        yes
    int4-bf16     tinygemm's packed int4              bf16 (x cast around it; scales,
                                                      zeros and output in bf16 too)  no
    dense-bf16    bf16 (Q4 values rounded to bf16)    bf16                           no

Exact candidates compute the float32 reference's numbers (the file's weights dequantized,
float32 arithmetic) up to summation order; the bf16 ones round to bf16 on the way, which on
the default model costs a third of the greedy agreement with that reference (docs/benchmarks.md
"Fidelity per component"). The near-exact q4i16 rounds x to 16 bits per group of 32
(2^-16 of the group's largest |x|, ~1/40 of bf16's error) for about half the vector work of a
decode call: on the default model, chats decoded one at a time agree with the reference on
0.98 of their greedy tokens against the exact kernel's 1.0, where bf16 gets 0.64-0.84
(tests/engine/test_quant_quality.py, docs/benchmarks.md "Int16 activations"). So fidelity comes
first: where our fused kernel is built, only exact and near-exact candidates are timed
(int4-f32 not among them: 10-20x our kernels, it is never chosen); where it is not (no C++
toolchain), the bf16 ones are let in too, since the exact alternatives are 25-50x slower (int4-f32) or 6x the memory (dense-f32),
and a WARNING says what that costs. int8 requantization of a Q4 file is never a candidate:
it adds its own rounding on top of the file's (tests/engine/test_quant_quality.py). f32
candidates exist only under float32 activations.

`plan` then picks, per shape, the decode kernel and the prefill kernel under a memory
budget (MEMORY_FACTOR x the file's projection bytes): it starts from the smallest
candidate of each shape and takes the upgrade that saves the most decode time per added
byte while the budget allows; then each shape's prefill kernel is the fastest one that
still fits (the decode one when nothing else does). Only the chosen kernels are built
from the real weights, one layer at a time.

The timings (never the choice, which also depends on the budget) are cached in
<cache>/cpu-kernels.json keyed by CPU model and torch's vector level, torch version, threads
timed on (MEASURE_THREADS), activation dtype, shape and candidate list (and our Q4 kernel
source's hash when it is a candidate), so a restart measures nothing; a corrupt file is
ignored with a warning and rewritten.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import astuple, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch

from pagedkube.engine.cache_lock import cache_lock
from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight, dequantize
from pagedkube.engine.quant.linear import DenseKernel, Kernel, SplitKernel, int4pack_kernel, tinygemm_fits
from pagedkube.engine.quant.q4_fused import GROUP_SIZE as Q4_FUSED_GROUP, Q4Ops, q4_fused_kernel, source_digest

log = logging.getLogger(__name__)

CANDIDATES = ("q4fused-f32", "q4i16-f32", "q4deq-f32", "int4-bf16", "int4-f32", "dense-bf16", "dense-f32")
EXACT = frozenset({"q4fused-f32", "q4deq-f32", "int4-f32", "dense-f32"})   # float32 arithmetic on the file's values
# Not exact, but within the fidelity bar at 1/40 of bf16's error: x rounded to int16 per group of
# 32 (q4_linear.cpp row_tile_i16); greedy agreement with the float32 reference recorded per
# representation in tests/engine/test_quant_quality.py.
NEAR_EXACT = frozenset({"q4i16-f32"})
Q4_OWN = ("q4fused", "q4i16", "q4deq")   # our kernels: one weight serves all (a prefill one costs no bytes)
# What the bf16 candidates cost on the default model (SmolLM2 Q4_1, 32 chats x 32 greedy tokens,
# tests/engine/test_quant_quality.py), said in the warning when they have to be let in.
BF16_FIDELITY = "greedy agreement with the float32 reference 0.66-0.84 instead of 1.0 on the default model"
DECODE_ROWS = 1           # one decoding sequence: the weights are read once per token
PREFILL_ROWS = 64         # a prompt chunk, or a decode batch of many sequences
MAX_DECODE_ROWS = 8       # the geometric middle of the two: fewer rows run the decode kernel
MEMORY_FACTOR = 1.5       # chosen projection kernels' bytes <= 1.5x the file's projection bytes
MEASURE_SECONDS = 0.01    # per candidate: rounds of calls for ~10 ms (MIN_CALLS..MAX_CALLS rounds), the fastest kept
MIN_CALLS, MAX_CALLS = 5, 200
ROTATION_BYTES = 8 << 20  # decode calls rotate through copies of the weight: more than a core's L2 holds
MAX_COPIES = 64
# Timings are taken on one thread: on a CPU shared with other processes a team of threads waits
# for its preempted member, and whole stretches of calls ran ~8 ms slow for a 30 us kernel at two
# threads (docs/benchmarks.md), which measures the neighbours, not the kernel. The ranking is
# what the choice needs; that it holds at the engine's thread count is checked in the benchmark.
MEASURE_THREADS = 1
CACHE_FILE = "cpu-kernels.json"
CACHE_VERSION = 3          # 3: decode timed on streamed weights; 2: the fastest single call; 1: averaged rounds
ACT_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    kind: str            # "int4" (GGUF Q4_0/Q4_1/Q4_K, groups of group_size) or "int8" (Q8_0)
    n: int               # output features
    k: int               # input features
    group_size: int

    def __str__(self) -> str:
        return f"{self.kind} {self.n}x{self.k}"


@dataclass(frozen=True, slots=True)
class Timing:
    decode_s: float      # seconds per call at DECODE_ROWS
    prefill_s: float     # seconds per call at PREFILL_ROWS
    bytes: int           # the kernel's tensors


@dataclass(frozen=True, slots=True)
class Choice:
    decode: str          # candidate names
    prefill: str


def shape_of(w: QuantizedWeight) -> Shape:
    n, k = w.shape
    return Shape("int4" if isinstance(w, Int4Weight) else "int8", n, k, w.group_size)


def candidates_for(shape: Shape, dtype: torch.dtype, fused: Q4Ops | None = None) -> tuple[str, ...]:
    """What the file's weights of this shape may run as under `dtype` activations; `fused`:
    our Q4 kernel's module (q4_fused.q4_ext), None where it is not built. Exact ones only
    when one of them is fast enough to serve with (the fused kernel): see the module's doc."""
    fits_int4 = shape.kind == "int4" and shape.group_size in (32, 64, 128, 256) and shape.n % 16 == 0
    fits_fused = fused is not None and shape.kind == "int4" and shape.group_size == Q4_FUSED_GROUP
    names = [c for c in CANDIDATES if (c.startswith("int4") and fits_int4) or (c.startswith(Q4_OWN) and fits_fused)
             or c.startswith("dense")]
    names = [c for c in names if dtype == torch.float32 or not c.endswith("-f32")]
    if fits_fused and dtype == torch.float32:   # int4-f32: 10-20x our kernels, and the slowest to time
        names = [c for c in names if (c in EXACT or c in NEAR_EXACT) and c != "int4-f32"]
    return tuple(names)


def build(candidate: str, w: QuantizedWeight, fused: Q4Ops | None = None) -> Kernel:
    rep, act = candidate.split("-")
    act_dtype = ACT_DTYPES[act]
    if rep in Q4_OWN:
        assert isinstance(w, Int4Weight) and fused is not None, candidate
        return q4_fused_kernel(w, fused, form=rep)
    if rep == "int4":
        assert isinstance(w, Int4Weight) and tinygemm_fits(w), candidate
        return int4pack_kernel(w, act_dtype)
    return DenseKernel(dequantize(w).to(act_dtype).contiguous())


def kernel_bytes(kernel: Kernel) -> int:
    values = [getattr(kernel, f.name) for f in fields(kernel)]
    tensors = [t for v in values for t in ([getattr(v, f.name) for f in fields(v)] if isinstance(v, (Int4Weight, Int8Weight))
                                           else [v])]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def synthetic_weight(shape: Shape) -> QuantizedWeight:
    """Random codes and scales: the kernels' speed does not depend on the values."""
    gen = torch.Generator().manual_seed(0)
    groups = (shape.n, shape.k // shape.group_size)
    scales = torch.rand(groups, generator=gen) / 64 + 1e-3
    if shape.kind == "int8":
        q = torch.randint(-127, 128, (shape.n, shape.k), generator=gen, dtype=torch.int8)
        return Int8Weight(q, scales, shape.group_size)
    q = torch.randint(0, 256, (shape.n, shape.k // 2), generator=gen, dtype=torch.uint8)
    return Int4Weight(q, scales, -8 * scales, shape.group_size)


def _call_seconds(kernel: Kernel, x: torch.Tensor) -> float:
    start = time.perf_counter()
    kernel(x)
    return time.perf_counter() - start


def measure(shape: Shape, candidates: tuple[str, ...], dtype: torch.dtype,
            fused: Q4Ops | None = None) -> dict[str, Timing]:
    """Build each candidate for a synthetic weight of `shape` and time it with `dtype` activations.

    Each timing is the fastest: of single prefill calls, and of decode calls averaged over one
    pass through the weight's copies (rotation_copies). The candidates take turns, one pass each per round,
    for at least MIN_CALLS rounds and up to MEASURE_SECONDS per candidate: on a CPU shared with
    other work, a thread team waiting for a preempted thread makes every call of a stretch slow
    by milliseconds, and taking turns spreads those stretches over every candidate alike.
    Measured on MEASURE_THREADS thread(s), whatever the engine runs with (see there)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(MEASURE_THREADS)
    try:
        return _measure(shape, candidates, dtype, fused)
    finally:
        torch.set_num_threads(threads)


def rotation_copies(shape: Shape) -> int:
    """How many copies of a weight the decode timing rotates through (ROTATION_BYTES of codes)."""
    packed = shape.n * shape.k // (2 if shape.kind == "int4" else 1)
    return max(2, min(MAX_COPIES, -(-ROTATION_BYTES // packed)))


def _rotation_seconds(kernels: list[Kernel], x: torch.Tensor) -> float:
    """Seconds per call, each kernel (one copy of the weight) called once in turn."""
    start = time.perf_counter()
    for kernel in kernels:
        kernel(x)
    return (time.perf_counter() - start) / len(kernels)


def _measure(shape: Shape, candidates: tuple[str, ...], dtype: torch.dtype,
             fused: Q4Ops | None) -> dict[str, Timing]:
    w = synthetic_weight(shape)
    tensors = [f.name for f in fields(w) if isinstance(getattr(w, f.name), torch.Tensor)]
    copies = [w] + [replace(w, **{name: getattr(w, name).clone() for name in tensors})
                    for _ in range(rotation_copies(shape) - 1)]
    kernels = {c: [build(c, copy, fused) for copy in copies] for c in candidates}
    gen = torch.Generator().manual_seed(1)
    decode_x = torch.randn(DECODE_ROWS, shape.k, generator=gen).to(dtype)
    prefill_x = torch.randn(PREFILL_ROWS, shape.k, generator=gen).to(dtype)
    best = {c: [float("inf"), float("inf")] for c in candidates}
    spent = 0.0
    with torch.inference_mode():
        for rotation in kernels.values():            # first calls: allocations, oneDNN's plan
            _rotation_seconds(rotation, decode_x)
            rotation[0](prefill_x)
        rounds = 0
        while rounds < MIN_CALLS or (rounds < MAX_CALLS and spent < MEASURE_SECONDS * len(candidates)):
            for c, rotation in kernels.items():
                decode_s = _rotation_seconds(rotation, decode_x)
                prefill_s = _call_seconds(rotation[0], prefill_x)
                best[c] = [min(best[c][0], decode_s), min(best[c][1], prefill_s)]
                spent += decode_s * len(rotation) + prefill_s
            rounds += 1
    return {c: Timing(best[c][0], best[c][1], kernel_bytes(kernels[c][0])) for c in candidates}


Measure = Callable[[Shape, tuple[str, ...], torch.dtype], dict[str, Timing]]


def plan(counts: dict[Shape, int], timings: dict[Shape, dict[str, Timing]], budget: int) -> dict[Shape, Choice]:
    """Decode kernels first (greedy by decode seconds saved per byte added), then prefill
    kernels where the budget still holds a second one. Deterministic for given inputs."""
    decode = {s: min(t, key=lambda c: (t[c].bytes, t[c].decode_s, c)) for s, t in timings.items()}
    used = sum(counts[s] * timings[s][c].bytes for s, c in decode.items())
    while True:
        best = None
        for s in sorted(timings):
            cur = timings[s][decode[s]]
            for c, t in sorted(timings[s].items()):
                gain = counts[s] * (cur.decode_s - t.decode_s)
                cost = counts[s] * (t.bytes - cur.bytes)
                if gain <= 0 or used + cost > budget:
                    continue
                rank = gain / max(cost, 1)
                if best is None or rank > best[0]:
                    best = (rank, s, c, cost)
        if best is None:
            break
        _, s, c, cost = best
        decode[s], used = c, used + cost
    choices = {}
    for s in sorted(timings, key=lambda s: (-counts[s] * timings[s][decode[s]].prefill_s, s)):
        prefill = decode[s]
        for c, t in sorted(timings[s].items(), key=lambda item: (item[1].prefill_s, item[0])):
            extra = 0 if same_weight(c, decode[s]) else counts[s] * t.bytes
            if used + extra <= budget:
                prefill, used = c, used + extra
                break
        choices[s] = Choice(decode[s], prefill)
    return choices


def same_weight(a: str, b: str) -> bool:
    """Whether two candidates run from one copy of the weight."""
    return a == b or (a.startswith(Q4_OWN) and b.startswith(Q4_OWN))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(shape: Shape, dtype: torch.dtype, candidates: tuple[str, ...]) -> str:
    """The CPU model with torch's vector level (ATEN_CPU_CAPABILITY can lower it: another class of
    kernels); with our Q4 kernels among the candidates, their source's hash (a new kernel is timed)."""
    ours = f"|q4 {source_digest()}" if any(c.startswith(Q4_OWN) for c in candidates) else ""
    return (f"{cpu_model()} {torch.backends.cpu.get_cpu_capability()}|torch {torch.__version__}|threads {MEASURE_THREADS}|"
            f"{str(dtype).removeprefix('torch.')}|{shape.kind} {shape.n}x{shape.k} g{shape.group_size}|"
            f"{','.join(candidates)}{ours}")


class KernelCalibration:
    """The measured kernel choice for one model's projections (engine/quant/assemble.py asks it)."""

    def __init__(self, counts: dict[Shape, int], dtype: torch.dtype, budget: int, cache_dir: Path,
                 measure_fn: Measure | None = None, fused: Q4Ops | None = None):
        """fused: our Q4 kernel's module (q4_fused.q4_ext), None where it could not be built."""
        self.dtype, self.budget, self.fused = dtype, budget, fused
        self.cache_path = Path(cache_dir) / CACHE_FILE
        if measure_fn is None:
            def measure_fn(shape: Shape, names: tuple[str, ...], dtype: torch.dtype) -> dict[str, Timing]:
                return measure(shape, names, dtype, fused)
        start = time.perf_counter()
        keys = {shape: (names, cache_key(shape, dtype, names))
                for shape in sorted(counts) for names in [candidates_for(shape, dtype, fused)]}
        cache = self._read_cache()
        measured = 0
        if any(key not in cache for _, key in keys.values()):
            # One process measures at a time: two engines timing kernels at once would each
            # time the other's load, and measure twice. The one that waited re-reads the table.
            with cache_lock(self.cache_path.with_name(self.cache_path.name + ".lock"), "kernel calibration"):
                cache = self._read_cache()
                for shape, (names, key) in keys.items():
                    if key not in cache:
                        cache[key] = {c: list(astuple(t)) for c, t in measure_fn(shape, names, dtype).items()}
                        measured += 1
                if measured:
                    self._write_cache(cache)
        timings = {shape: {c: Timing(*cache[key][c]) for c in names} for shape, (names, key) in keys.items()}
        self.choices = plan(counts, timings, budget)
        self.used = sum(counts[s] * (timings[s][c.decode].bytes + (timings[s][c.prefill].bytes
                                                                    if not same_weight(c.prefill, c.decode) else 0))
                        for s, c in self.choices.items())
        how = f"measured {measured} shape(s) in {time.perf_counter() - start:.1f} s" if measured else "cached"
        log.info("projection kernels chosen by measurement (%s, %s activations; %s): %s; %.0f of %.0f MiB",
                 how, str(dtype).removeprefix("torch."), self.cache_path,
                 "; ".join(f"{s} decode {c.decode} prefill {c.prefill}" for s, c in sorted(self.choices.items())),
                 self.used / 2**20, budget / 2**20)
        inexact = sorted({c for choice in self.choices.values() for c in (choice.decode, choice.prefill)}
                         - EXACT - NEAR_EXACT)
        if inexact:
            log.warning("projection kernels %s round activations and weights to bf16 (%s): the exact float32 Q4 "
                        "kernel is %s; --quantization none --dtype float32 computes the reference", inexact,
                        BF16_FIDELITY, "not built here" if fused is None else "not usable for these shapes")

    def kernel(self, w: QuantizedWeight) -> tuple[Kernel | None, str | None]:
        """The chosen kernel(s) for this weight and their name, e.g. "int4-bf16/dense-bf16"
        (decode/prefill); (None, None) for a shape that was not calibrated."""
        choice = self.choices.get(shape_of(w))
        if choice is None:
            return None, None
        decode = build(choice.decode, w, self.fused)
        if choice.prefill == choice.decode:
            return decode, choice.decode
        return SplitKernel(decode, build(choice.prefill, w, self.fused), MAX_DECODE_ROWS), f"{choice.decode}/{choice.prefill}"

    def _read_cache(self) -> dict[str, dict[str, list]]:
        try:
            data = json.loads(self.cache_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("ignoring the kernel timing cache %s: %s", self.cache_path, e)
            return {}
        entries = data.get("entries") if isinstance(data, dict) and data.get("version") == CACHE_VERSION else None
        if not isinstance(entries, dict) or not all(_valid_entry(v) for v in entries.values()):
            log.warning("ignoring the kernel timing cache %s: not a version %d timing table",
                        self.cache_path, CACHE_VERSION)
            return {}
        return entries

    def _write_cache(self, entries: dict[str, dict[str, list]]) -> None:
        """Atomically (write a sibling, rename): two engines starting together never read half a file."""
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".cpu-kernels-", dir=self.cache_path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"version": CACHE_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.cache_path)
        except OSError as e:
            log.warning("cannot write the kernel timing cache %s: %s", self.cache_path, e)


def _valid_entry(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(t, list) and len(t) == 3 and all(isinstance(v, (int, float)) for v in t) for t in value.values())

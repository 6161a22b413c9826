"""Whole decode-step capture: the decoder of a decode-only step runs as one captured program
per batch-size bucket (issue 20 item 4; vLLM's CUDA graphs / torch.compile of the same step).

Why: at one client a packed-weight decode step is per-op overhead, not bytes: its matmuls are
~7 ms of a ~17 ms forward on this CPU, the rest ~250 aten calls per layer (docs/benchmarks.md,
"Decode step (CPU)"). Fusing five ops of one RMSNorm measured slower than eager (the compiled
call's own cost); capture pays only at the size of the whole step, all 30 layers in one
program: on CPU one torch.compile graph (Inductor fuses the norms, rope and casts into C++
loops, the int4 matmuls and SDPA stay extern calls), on CUDA one CUDA graph replayed.

When: `on` compiles every bucket before the engine serves (minutes on a small CPU); `auto`
(the CPU default where a C++ toolchain exists) compiles them on a background thread, smallest
bucket first, while the engine serves every step eagerly, and a step takes a bucket only once
that bucket is ready (`DecodeCapture.ready`), so start-up costs nothing and the speed-up arrives
a minute or two later. The compile thread writes only the pad block (below) and never a real
block: eager steps on the engine's thread and the compile run side by side.

Which steps: decode-only steps (every scheduled sequence computes exactly one token) of at
most max(sizes) sequences. Prefill, chunked prefill, mixed steps and bigger batches run eager,
which stays the reference. A batch of n is padded to the smallest bucket >= n; padding rows
are a dummy decode of token 0 at position 0 whose K/V go to the PAD BLOCK, one KV block past
the pool the block manager owns (it never hands it out), and whose context is that block:

    rows     [ seq 0 | seq 1 | seq 2 | pad ]          n = 3 in bucket 4
    slots    [ s0    | s1    | s2    | P*bs ]
    tables   [ bt0 + P.. | bt1 + P.. | bt2 + P.. | P P .. ]    (P = pad block id)
    seq_lens [ l0    | l1    | l2    | 1  ]

so a padding row reads and writes nothing of a real sequence, and its output row is dropped.
Block tables are padded with P too (masked out of attention by seq_len either way).

Shapes: [bucket] for ids, positions, slots, seq_lens; block tables [bucket, width]. On CPU the
width is a dynamic dimension of the compiled graph (kept >= 2 so Dynamo never specialises it
to 0 or 1): one graph per bucket serves every context length, without recompiles as contexts
grow (tests/engine/test_decode_capture.py counts them). A CUDA graph has no dynamic
dimension: there the width is the most a sequence can hold (max_model_len / block_size), and
the attention metadata's max_seq_len is max_model_len, so the Triton kernel's split count is
fixed at capture (it reads only up to each seq_len; empty splits drop out in its reduction).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from pagedkube.engine import inductor_cache
from pagedkube.engine.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from pagedkube.engine.model_runner import StepInputs

log = logging.getLogger(__name__)

MIN_CPU_WIDTH = 2   # Dynamo specialises a dimension of size 0 or 1; padding to 2 keeps the width symbolic


@dataclass
class DecodeInputs:
    """One decode-only step's tensors, padded to a bucket (the captured program's inputs)."""
    input_ids: torch.Tensor      # [bucket] int64
    positions: torch.Tensor      # [bucket] int64
    slot_mapping: torch.Tensor   # [bucket] int64
    seq_lens: torch.Tensor       # [bucket] int32
    block_tables: torch.Tensor   # [bucket, width] int32


def decode_forward(model: torch.nn.Module, kv_caches: list, max_seq_len: int, inputs: DecodeInputs) -> torch.Tensor:
    """The model's forward over one padded decode-only batch: the function that is captured.
    max_query_len = 1 tells the backends every sequence decodes, so they derive their layout
    from tensor shapes alone (no host sync); max_seq_len is a constant (see the docstring)."""
    bucket = inputs.input_ids.shape[0]
    meta = AttentionMetadata(
        slot_mapping=inputs.slot_mapping,
        query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, device=inputs.input_ids.device),
        seq_lens=inputs.seq_lens, block_tables=inputs.block_tables,
        max_query_len=1, max_seq_len=max_seq_len)
    return model(inputs.input_ids, inputs.positions, kv_caches, meta)


def pad_decode_step(step: StepInputs | None, bucket: int, width: int, block_size: int, pad_block: int,
                    device: torch.device) -> DecodeInputs:
    """A decode-only step's tensors padded to `bucket` rows and `width` blocks (the module
    docstring's picture); step None: padding rows only (the warm-up and capture input)."""
    bs, pad = block_size, pad_block
    block_tables = torch.full((bucket, width), pad, dtype=torch.int32, device=device)
    input_ids = torch.zeros(bucket, dtype=torch.int64, device=device)
    positions = torch.zeros(bucket, dtype=torch.int64, device=device)
    slot_mapping = torch.full((bucket,), pad * bs, dtype=torch.int64, device=device)
    seq_lens = torch.ones(bucket, dtype=torch.int32, device=device)
    if step is not None:
        meta, n = step.meta, step.input_ids.shape[0]
        tables = meta.block_tables
        assert n <= bucket and tables.shape[1] <= width, (n, bucket, tables.shape, width)
        # prepare() pads the tables with block 0, which is masked; pad past each sequence's own
        # blocks with the pad block instead, so the row reads only its own or the pad block
        own = torch.arange(tables.shape[1], device=device)[None, :] < -(-meta.seq_lens.long()[:, None] // bs)
        block_tables[:n, :tables.shape[1]] = torch.where(own, tables, pad)
        input_ids[:n] = step.input_ids
        positions[:n] = step.positions
        slot_mapping[:n] = meta.slot_mapping
        seq_lens[:n] = meta.seq_lens
    return DecodeInputs(input_ids, positions, slot_mapping, seq_lens, block_tables)


def pick_bucket(sizes: tuple[int, ...], num_seqs: int) -> int | None:
    """The smallest bucket that holds num_seqs, None when none does (sizes ascending)."""
    return next((size for size in sizes if size >= num_seqs), None)


class DecodeCapture:
    """Runs decode-only steps through one captured program per bucket; `run` returns None for a
    step it does not take (the runner then runs the model eagerly)."""

    def __init__(self, model: torch.nn.Module, kv_caches: list, sizes: tuple[int, ...], block_size: int,
                 pad_block: int, max_model_len: int, device: torch.device, background: bool = False):
        assert list(sizes) == sorted(set(sizes)) and sizes[0] >= 1, sizes
        self.sizes = sizes
        self.block_size = block_size
        self.pad_block = pad_block
        self.device = device
        self.is_cuda = device.type == "cuda"
        max_blocks = -(-max_model_len // block_size)
        self.width = max_blocks if self.is_cuda else None
        self.compile_seconds: dict[int, float] = {}
        self.num_captured_steps = 0              # steps run through the captured program (tests, bench)
        # Buckets a step may take: replaced (never mutated) by the compile thread, so run() reads
        # one consistent frozenset
        self.ready: frozenset[int] = frozenset()
        self.compiler: threading.Thread | None = None
        self._stop = threading.Event()           # set at exit: compile no further bucket
        self.program: CudaGraphs | CompiledDecode
        if self.is_cuda:
            assert not background, "CUDA graphs are captured before serving"
            with torch.inference_mode():
                forward = functools.partial(decode_forward, model, kv_caches, max_model_len)
                self.program = CudaGraphs(forward, self.sizes, self.padded, device)
            self.compile_seconds = self.program.seconds
            self.ready = frozenset(self.sizes)
            log.info("decode capture (CUDA graphs): buckets %s ready in %s s", list(self.sizes), self.compile_seconds)
            return
        # Built by the compile thread: torch.compile's first call imports Dynamo and Inductor
        # (~2 s here), which would otherwise delay the engine's start.
        self._compiled_args = (model, kv_caches, max_model_len)
        if not background:
            self._compile_buckets(background=False)
            return
        log.info("decode capture (torch.compile): compiling buckets %s in the background; decode steps run "
                 "eagerly until each is ready", list(self.sizes))
        # A process that ends while the thread runs torch code aborts in C++'s thread-pool teardown
        # ("terminate called without an active exception", exit 134): at exit the thread is told
        # to stop after its current bucket and joined first, so the exit waits for one bucket.
        # Measured: a default server stopped 4 s after start exits 0 after ~10 s, the bucket done.
        atexit.register(self._stop_at_exit)
        self.compiler = threading.Thread(target=self._compile_buckets, kwargs={"background": True},
                                         name="decode-capture-compile", daemon=True)
        self.compiler.start()

    def _stop_at_exit(self) -> None:
        if self.compiler is not None and self.compiler.is_alive():
            log.info("decode capture: waiting for the bucket being compiled before exiting")
            self._stop.set()
            self.compiler.join()

    def _compile_buckets(self, background: bool) -> None:
        """CPU: compiles every bucket (smallest first), each one usable as soon as it is done. In
        the background a bucket that fails to compile is logged and stays eager."""
        with _yielding_to_the_engine() if background else contextlib.nullcontext():
            self._compile_all(background)

    def _compile_all(self, background: bool) -> None:
        inductor_cache.seed_from_env()
        try:
            self.program = CompiledDecode(*self._compiled_args)
        except Exception:
            if not background:
                raise
            log.exception("decode capture: torch.compile is unavailable; decode steps stay eager")
            return
        with torch.inference_mode():
            for size in self.sizes:
                if background and self._stop.is_set():
                    break
                t = time.perf_counter()
                try:
                    self.program(self.padded(size, None))
                except Exception:
                    if not background:
                        raise
                    if self._stop.is_set():          # the process is exiting (its compile pool is closed)
                        break
                    log.exception("decode capture: bucket %d did not compile; its steps stay eager", size)
                    continue
                self.compile_seconds[size] = round(time.perf_counter() - t, 1)
                self.ready = self.ready | {size}
                if background:
                    log.info("decode capture (torch.compile): bucket %d ready in %.1f s", size,
                             self.compile_seconds[size])
        if background and self._stop.is_set():
            log.info("decode capture: stopped compiling at exit with buckets %s ready", sorted(self.ready))
            return
        log.info("decode capture (torch.compile): buckets %s ready in %s s (Inductor's caches: %s)",
                 sorted(self.ready), self.compile_seconds, inductor_cache.cache_counts())
        if background:
            atexit.unregister(self._stop_at_exit)

    def padded(self, bucket: int, step: StepInputs | None = None) -> DecodeInputs:
        width = self.width or max(MIN_CPU_WIDTH, 0 if step is None else step.meta.block_tables.shape[1])
        return pad_decode_step(step, bucket, width, self.block_size, self.pad_block, self.device)

    def run(self, step: StepInputs) -> torch.Tensor | None:
        """hidden [n, hidden] for a decode-only step (a StepInputs), or None when it does not fit."""
        meta = step.meta
        if meta.max_query_len != 1:
            return None
        n = meta.num_seqs
        bucket = pick_bucket(tuple(sorted(self.ready)), n)
        if bucket is None:                       # too many sequences, or no bucket that fits is ready yet
            return None
        self.num_captured_steps += 1
        return self.program(self.padded(bucket, step))[:n]


# Measured (docs/benchmarks.md, "The background compile and the engine's steps"): one client's
# eager tokens during the compile took 0.5-2 s each with the defaults (5 ms, nice 0), 45-80 ms
# with these, and the four buckets were still ready ~40 s after start with a warm Inductor cache.
COMPILE_SWITCH_INTERVAL_S = 0.001
COMPILE_NICE = 10


class _SwitchInterval:
    """The interpreter's GIL switch interval, one per process, lowered while any background
    compile runs: engines in one process (tests, an offline script) may compile at once, so the
    first compile to start saves and lowers it and the last to end puts it back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiles = 0
        self._saved = 0.0

    @contextlib.contextmanager
    def lowered(self, seconds: float) -> Iterator[None]:
        with self._lock:
            if self._compiles == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(seconds)
            self._compiles += 1
        try:
            yield
        finally:
            with self._lock:
                self._compiles -= 1
                if self._compiles == 0:
                    sys.setswitchinterval(self._saved)


# Process-wide because the switch interval is: the one piece of module state here
_SWITCH_INTERVAL = _SwitchInterval()


@contextlib.contextmanager
def _yielding_to_the_engine() -> Iterator[None]:
    """The background compile gives way to the engine's steps. Two things starve an eager step
    while Dynamo and Inductor run on the compile thread: the GIL (torch's Python bindings release
    it around every op, and a thread that wants it back waits a whole switch interval, 5 ms by
    default, while the compile thread holds it: a step of ~1,000 ops took 0.5-2 s instead of
    ~30-50 ms) and the CPU (Inductor's C++ compiler processes on a 2-core machine). So, while the
    compile runs, the interpreter's switch interval drops to COMPILE_SWITCH_INTERVAL_S (restored
    after), and the compile thread, with the compiler processes it starts, runs at nice
    COMPILE_NICE (Linux sets nice per thread; children inherit it)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
    except (AttributeError, OSError):    # not Linux, or not allowed: the compile keeps its priority
        pass
    with _SWITCH_INTERVAL.lowered(COMPILE_SWITCH_INTERVAL_S):
        yield


class CompiledDecode:
    """CPU: torch.compile of the whole decode forward; one graph per bucket (the batch dimension
    is static, each bucket its own copy of the code), the block-table width dynamic. Guards on
    nn.Module attributes are dropped (guard_filter_fn): the model does not change after load, and
    checking its ~300 parameters and submodules on every call cost ~2 ms of a ~15 ms step
    (measured, docs/benchmarks.md); guards on the input tensors' shapes stay. Inductor's size and
    alignment asserts stay on. With them off, an AVX-512 CPU's compiled step aborted with malloc
    errors; the cause found since is Inductor's 16-wide stores (inductor_cache.CPU_SIMD_BITS), so
    the asserts may not have been the fix, but turning them off saves only 1%."""

    def __init__(self, model: torch.nn.Module, kv_caches: list, max_seq_len: int):
        self.args = (model, kv_caches, max_seq_len)
        self.fns: dict[int, Callable[..., torch.Tensor]] = {}
        _pin_module_calls(model)
        # The pool's block count (sized from free memory at each start) stays symbolic, so one
        # cache entry serves every pool size (engine/inductor_cache.py)
        for cache in kv_caches:
            for t in cache:
                torch._dynamo.maybe_mark_dynamic(t, 0)

    def _fn(self, bucket: int) -> Callable[..., torch.Tensor]:
        # Dynamo keeps compiled graphs per code object. Each bucket gets its own copy of the code,
        # so the compile thread adding bucket 8's graph never touches the cache the engine's
        # thread is reading to run bucket 1's (CPython lets the two threads interleave there);
        # and two engines in one process, without guards on the model, never share (and
        # overwrite) each other's graphs.
        if bucket not in self.fns:
            fresh = types.FunctionType(decode_forward.__code__.replace(), decode_forward.__globals__,
                                       f"decode_forward_{bucket}")
            self.fns[bucket] = torch.compile(
                fresh, fullgraph=True, dynamic=False,
                options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                         **inductor_cache.compile_options()})
        return self.fns[bucket]

    def __call__(self, inputs: DecodeInputs) -> torch.Tensor:
        torch._dynamo.maybe_mark_dynamic(inputs.block_tables, 1)
        return self._fn(inputs.input_ids.shape[0])(*self.args, inputs)


def _pin_module_calls(model: torch.nn.Module) -> None:
    """Gives each module class of the model its own `__call__`, torch.nn.Module's (the same
    function, so Dynamo sees no difference). While the compile thread traces a bucket, torch's
    FX tracer replaces torch.nn.Module.__call__ process-wide with a wrapper that records module
    calls into its graph; an eager step on the engine's thread then went through that wrapper
    and failed ("module is not installed as a submodule", docs/benchmarks.md). A class's own
    attribute is found before the patched base one."""
    call = torch.nn.Module._wrapped_call_impl        # what torch.nn.Module.__call__ is, unpatched
    for cls in {type(m) for m in model.modules()}:
        if "__call__" not in vars(cls):
            cls.__call__ = call  # type: ignore[method-assign]


class CudaGraphs:
    """CUDA: one torch.cuda.CUDAGraph per bucket over static input buffers. Captured largest
    bucket first, all sharing one memory pool (vLLM's order: the smaller graphs reuse the largest
    one's blocks). A replay copies the step's padded inputs into the buffers; the output is the
    graph's own tensor, valid until the next replay (the runner reads it within the step)."""

    WARMUP_RUNS = 2   # Triton JIT and cuBLAS handles happen before capture, on a side stream

    def __init__(self, forward: Callable[[DecodeInputs], torch.Tensor], sizes: tuple[int, ...],
                 make_inputs: Callable[..., DecodeInputs], device: torch.device):
        self.buffers: dict[int, DecodeInputs] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.seconds: dict[int, float] = {}
        pool = None
        for size in sorted(sizes, reverse=True):
            t = time.perf_counter()
            inputs = make_inputs(size, None)
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(self.WARMUP_RUNS):
                    forward(inputs)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = forward(inputs)
            pool = graph.pool()
            torch.cuda.synchronize(device)
            self.buffers[size], self.graphs[size], self.outputs[size] = inputs, graph, out
            self.seconds[size] = round(time.perf_counter() - t, 2)

    def __call__(self, inputs: DecodeInputs) -> torch.Tensor:
        size = inputs.input_ids.shape[0]
        static = self.buffers[size]
        for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables"):
            getattr(static, name).copy_(getattr(inputs, name), non_blocking=True)
        self.graphs[size].replay()
        return self.outputs[size]

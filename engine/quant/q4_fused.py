"""Our own CPU kernel for 4-bit weights with float32 activations, exact to the file's numbers.

torch's packed int4 CPU kernel is fast only with bf16 activations, and then rounds the
activations, the scales and zeros, and its output to bf16: on the default model that alone
costs a third of the greedy agreement with the float32 reference (docs/benchmarks.md,
"Fidelity per component"). q4_linear.cpp instead dequantizes each output row of a Q4 weight
(groups of 32 with a float32 scale and min) into float32 exactly as formats.dequantize does,
and dots it with the activations in float32: the reference's numbers, in the order of a
different summation only, at int4's memory traffic.

It is C++ built at first use with torch's extension builder (g++, Python's headers, ninja;
AVX2/FMA where the CPU has them, OpenMP for torch's threads), into <cache>/cpu-ext/<hash of source, flags, torch, python>/,
under a lock so two engines build it once; later starts load the built library directly.
An image with no compiler ships it prebuilt: `python -m pagedkube.engine.quant.q4_fused DIR`
builds every variant (portable, AVX2/FMA) into DIR/cpu-ext/ at image-build time, and $PAGEDKUBE_CPU_EXT_DIR=DIR
is searched before the cache (the same hashed folder names, so a variant whose flags, torch or
Python differ from this process is never loaded). Where it cannot be had, `q4_ext()` is None and
the calibration goes without it (and says what that costs in fidelity).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from pagedkube.engine.cache_lock import cache_lock
from pagedkube.engine.quant.formats import Int4Weight

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("q4_linear.cpp")
# Built into the same library (one build, one load): the paged decode attention kernel.
ATTENTION_SOURCE = Path(__file__).parent.parent / "attention" / "cpu_attention.cpp"
# And the whole decode step (engine/native_decode.py), over both.
NATIVE_SOURCE = SOURCE.with_name("native_decode.cpp")
SOURCES = (SOURCE, ATTENTION_SOURCE, NATIVE_SOURCE)
HEADERS = (SOURCE.with_name("cpu_vec.h"),)     # included by the sources: part of the build's key
GROUP_SIZE = 32                       # the kernel's group (GGUF's Q4_0/Q4_1, Q4_K's sub-blocks)
EXT_NAME = "pagedkube_q4_linear"
PREBUILT_ENV = "PAGEDKUBE_CPU_EXT_DIR"  # a read-only folder of prebuilt variants (the engine image's)
BASE_CFLAGS = ("-O3", "-ffp-contract=off")   # no fused multiply-add where the reference rounds twice
X86_CFLAGS = ("-mavx2", "-mfma", "-mf16c")   # F16C: the attention kernel's float16 cache
# ATen's parallel_for is header code over OpenMP: compiled without it, the kernels ran on one
# thread whatever torch.set_num_threads said. Linked to the libgomp.so.1 torch has loaded (one
# thread pool, torch's thread count), where torch is built with OpenMP.
OPENMP_FLAG = "-fopenmp"


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def _base_cflags() -> list[str]:
    """Every variant's flags."""
    return [*BASE_CFLAGS, OPENMP_FLAG] if torch._C.has_openmp else list(BASE_CFLAGS)


def _vector_cpu() -> bool:
    """Whether this CPU runs the AVX2/FMA/F16C variant (X86_CFLAGS)."""
    return _x86() and {"avx2", "fma", "f16c"} <= _cpu_flags()


def _cflags() -> list[str]:
    """This CPU's variant."""
    return [*_base_cflags(), *X86_CFLAGS] if _vector_cpu() else _base_cflags()


def ldflags(cflags: list[str]) -> list[str]:
    """The link flags a variant compiled with `cflags` needs."""
    return [OPENMP_FLAG] if OPENMP_FLAG in cflags else []


def _toolchain() -> bool:
    import sysconfig

    return (shutil.which(os.environ.get("CXX", "c++")) is not None and shutil.which("ninja") is not None
            and os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))


@cache
def source_digest() -> str:
    """The kernel source's hash: part of its build folder's name and of its timings' cache key."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def _build_dir(cache_dir: Path, cflags: list[str]) -> Path:
    key = "|".join([*(s.read_text() for s in SOURCES + HEADERS), " ".join(cflags), torch.__version__, sys.version])
    return cache_dir / "cpu-ext" / f"{EXT_NAME}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _library(build_dir: Path) -> Path:
    return build_dir / f"{EXT_NAME}.so"


def _build(build_dir: Path, cflags: list[str]) -> bool:
    """Compiles one variant into build_dir (the caller holds its lock); False, with a warning,
    where the compiler fails."""
    from torch.utils.cpp_extension import load

    start = time.perf_counter()
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        load(EXT_NAME, [str(s) for s in SOURCES], extra_cflags=cflags, extra_ldflags=ldflags(cflags),
             build_directory=str(build_dir), verbose=False)
    except (RuntimeError, OSError) as e:     # a compiler error: serve without it, loudly
        log.warning("cannot build the exact float32 Q4 kernel (%s): going without it", e)
        return False
    log.info("built the exact float32 Q4 CPU kernel in %.1f s (%s)", time.perf_counter() - start, build_dir)
    return True


def _load_built(library: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(EXT_NAME, str(library))
    spec = importlib.util.spec_from_file_location(EXT_NAME, library, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Q4Ops:
    """The kernels: called straight from the built module in eager mode, and as torch operators
    (the library's, registered in C++, with shape functions from Python) under torch.compile, whose whole-step capture
    (engine/decode_capture.py, fullgraph) traces through them. An eager call through the operator
    costs the dispatcher and, on the first call, torch's import of Dynamo (~2 s; custom ops run
    under its disable wrapper), hence the module. ext None: the operators were registered in this
    process from another library, and eager calls go through them too."""
    ext: ModuleType | None

    def _eager(self) -> bool:
        return self.ext is not None and not torch.compiler.is_compiling()

    def q4_linear(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                  mins: torch.Tensor) -> torch.Tensor:
        if self._eager():
            return self.ext.q4_linear(x, qweight, scales, mins)  # type: ignore[union-attr]
        return torch.ops.pagedkube.q4_linear(x, qweight, scales, mins)

    def q4_linear_i16(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      mins: torch.Tensor) -> torch.Tensor:
        """q4_linear with x rounded to int16 per group of 32 (not exact: see q4_linear.cpp)."""
        if self._eager():
            return self.ext.q4_linear_i16(x, qweight, scales, mins)  # type: ignore[union-attr]
        return torch.ops.pagedkube.q4_linear_i16(x, qweight, scales, mins)

    def q4_dequantize(self, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
        if self._eager():
            return self.ext.q4_dequantize(qweight, scales, mins)  # type: ignore[union-attr]
        return torch.ops.pagedkube.q4_dequantize(qweight, scales, mins)

    def q8_linear(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if self._eager():
            return self.ext.q8_linear(x, qweight, scales)  # type: ignore[union-attr]
        return torch.ops.pagedkube.q8_linear(x, qweight, scales)

    def decode_attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """One query token per sequence against its paged context (engine/attention/cpu_backend.py)."""
        if self._eager():
            return self.ext.decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale)  # type: ignore[union-attr]
        return torch.ops.pagedkube.decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale)

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """This step's K/V rows [T, Hkv, D] into the paged caches at their slots, in the caches' dtype."""
        if self._eager():
            self.ext.store_kv(key, value, k_cache, v_cache, slot_mapping)  # type: ignore[union-attr]
        else:
            torch.ops.pagedkube.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def has_attention(self) -> bool:
        """Whether the library has the attention kernel's vector code (AVX2/FMA/F16C builds)."""
        if self.ext is not None:
            return bool(self.ext.decode_attention_supported())
        return _vector_cpu()


def _registered() -> bool:
    """Whether this process registered the operators already (from any cache's library)."""
    ns = torch.ops.pagedkube
    return all(hasattr(ns, name) for name in ("q4_linear", "q4_linear_i16", "q4_dequantize", "q8_linear", "decode_attention",
                                           "store_kv"))


def _register(library: Path) -> Q4Ops:
    """The operators are registered once per process (an operator name is registered once),
    backed by the first library loaded (in C++: the library's register_ops), with their shape
    functions here; eager calls use this library's module."""
    ext = _load_built(library)
    if _registered() or not ext.register_ops():
        return Q4Ops(ext)

    @torch.library.register_fake("pagedkube::q4_linear")
    def _(x, qweight, scales, mins):
        return x.new_empty((x.shape[0], qweight.shape[0]))

    @torch.library.register_fake("pagedkube::q4_linear_i16")
    def _(x, qweight, scales, mins):
        return x.new_empty((x.shape[0], qweight.shape[0]))

    @torch.library.register_fake("pagedkube::q4_dequantize")
    def _(qweight, scales, mins):
        return scales.new_empty((qweight.shape[0], qweight.shape[1] * 2))

    @torch.library.register_fake("pagedkube::q8_linear")
    def _(x, qweight, scales):
        return x.new_empty((x.shape[0], qweight.shape[0]))

    @torch.library.register_fake("pagedkube::decode_attention")
    def _(query, k_cache, v_cache, block_tables, seq_lens, scale):
        return torch.empty_like(query)

    @torch.library.register_fake("pagedkube::store_kv")
    def _(key, value, k_cache, v_cache, slot_mapping):
        return None

    return Q4Ops(ext)


@cache
def q4_ext(cache_dir: Path) -> Q4Ops | None:
    """The built kernels: prebuilt ($PAGEDKUBE_CPU_EXT_DIR), else from this cache, else built now
    into it; None where they cannot be built."""
    cflags = _cflags()
    prebuilt = os.environ.get(PREBUILT_ENV)
    for root in ([Path(prebuilt)] if prebuilt else []) + [cache_dir]:
        if _library(_build_dir(root, cflags)).is_file():
            return _register(_library(_build_dir(root, cflags)))
    if _registered():             # built into another cache folder by this process
        return Q4Ops(None)
    if not _toolchain():
        log.warning("no C++ toolchain (c++, ninja, Python headers) and no prebuilt kernel for this CPU%s: "
                    "the exact float32 Q4 kernel is not built",
                    f" in ${PREBUILT_ENV}={prebuilt}" if prebuilt else "")
        return None
    build_dir = _build_dir(cache_dir, cflags)
    with cache_lock(build_dir.with_name(build_dir.name + ".lock"), "building the Q4 CPU kernel"):
        if not _library(build_dir).is_file() and not _build(build_dir, cflags):
            return None
    return _register(_library(build_dir))


def prebuild(root: Path) -> list[Path]:
    """Builds every variant this architecture can run (x86: portable and AVX2/FMA, whatever the
    building CPU has) into root/cpu-ext/, for an image without a compiler. One process per
    variant: torch's builder renames a second build of one module name in a process."""
    variants = [_base_cflags()] + ([[*_base_cflags(), *X86_CFLAGS]] if _x86() else [])
    built = []
    for cflags in variants:
        subprocess.run([sys.executable, "-P", "-m", "pagedkube.engine.quant.q4_fused",   # -P: not the cwd's operator/
                        "--variant", str(root), *cflags], check=True)
        library = _library(_build_dir(root, cflags))
        if not library.is_file():
            raise RuntimeError(f"building the Q4 kernel with {' '.join(cflags)} wrote no {library}")
        built.append(library)
    return built


def main(argv: list[str]) -> int:
    """`DIR`: every variant into DIR/cpu-ext/ (prebuild); `--variant DIR FLAG...`: one of them."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if argv[:1] == ["--variant"]:
        return 0 if _build(_build_dir(Path(argv[1]), argv[2:]), argv[2:]) else 1
    for path in prebuild(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def q4_fits(w: Int4Weight) -> bool:
    return w.group_size == GROUP_SIZE


@dataclass(frozen=True)
class Q4FusedKernel:
    """y = x W^T in float32 from the weight's own packed codes, scales and mins (no copy)."""
    weight: Int4Weight
    ext: Q4Ops
    name = "q4fused"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:              # the default: no cast calls around the kernel
            return self._linear(x.contiguous())
        return self._linear(x.float().contiguous()).to(x.dtype)

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return self.ext.q4_linear(x, w.qweight, w.scales, w.mins)


@dataclass(frozen=True)
class Q4Int16Kernel(Q4FusedKernel):
    """Q4FusedKernel with x rounded to int16 per group of 32 inside the kernel for decode-sized
    batches (q4_linear.cpp row_tile_i16: about half the vector work; not exact, the rounding is
    2^-16 of each group's largest |x|), the exact GEMM from 12 rows on. Same weight, no copy."""
    name = "q4i16"

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return self.ext.q4_linear_i16(x, w.qweight, w.scales, w.mins)


@dataclass(frozen=True)
class Q4DequantKernel:
    """W dequantized to float32 for this call only (exact, no copy kept), then torch's float32
    matmul: a candidate for prefill-sized batches, where it beat q4_linear's per-row tiles; since
    q4_linear has its own GEMM from 12 rows on, it lost at every row count timed on this project's
    AMD EPYC under AVX2 (docs/benchmarks.md); it stays a candidate for CPUs where torch's matmul
    still wins (the calibration times both)."""
    weight: Int4Weight
    ext: Q4Ops
    name = "q4dequant"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return F.linear(x.float(), self.ext.q4_dequantize(w.qweight, w.scales, w.mins)).to(x.dtype)


Q4Kernel = Q4FusedKernel | Q4Int16Kernel | Q4DequantKernel
Q4_FORMS: dict[str, type[Q4Kernel]] = {"q4fused": Q4FusedKernel, "q4i16": Q4Int16Kernel, "q4deq": Q4DequantKernel}


def q4_fused_kernel(w: Int4Weight, ext: Q4Ops, form: str = "q4fused") -> Q4Kernel:
    """form: a key of Q4_FORMS (the calibration's candidate name without its activations)."""
    assert q4_fits(w), w.group_size
    weight = Int4Weight(w.qweight.contiguous(), w.scales.contiguous(), w.mins.contiguous(), w.group_size)
    return Q4_FORMS[form](weight, ext)

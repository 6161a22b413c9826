"""llama.cpp's own `llama-server`, the CPU serving peer: built once into a cached folder.

`python -m llama_cpp.server` (llama-cpp-python's binding server) runs one request at a time, so
it is no peer for a batching server. `llama-server` batches continuously over `-np N` slots. It
builds from the llama.cpp sources that llama-cpp-python's sdist vendors (the same pin the older
bench used, so both read the same file with the same kernels):

    .venv/bin/python bench/llama_server.py build [native|avx2|avx512]   # 15-36 min on 2 cores, once per ISA;
                                                                 # prints the binary's path

The build turns off what needs the network or is not served (the prebuilt web UI, OpenSSL,
tests, examples) and compiles for this CPU (GGML_NATIVE), or with `avx2` for the AVX2 class
(AVX2/FMA/F16C, no AVX-512: the peer of torch forced to AVX2, bench/cpu_peers.py --isa avx2), or
with `avx512` for the AVX-512 class without AMX (bench/cpu_peers.py --isa avx512: torch unforced).
The binary and its shared libraries land in ~/.cache/pagedkube/llama-server/<version>-<cpu flags
hash, avx2 or avx512>/ (a folder per CPU class: a native build is not portable). Never in CI.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"   # llama-cpp-python's sdist; its vendor/llama.cpp is what gets built
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pagedkube" / "llama-server"
CMAKE_FLAGS = ["-DLLAMA_BUILD_SERVER=ON", "-DCMAKE_BUILD_TYPE=Release",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
# The kernels' instruction set: this CPU's (native), the AVX2 class (AVX2, FMA, F16C; no
# AVX-512), the peer for torch forced to its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) on a CPU
# that has more, or the AVX-512 class (with VBMI, VNNI and BF16) without AMX: on a KVM guest that
# lists AMX, the native build died of SIGILL at launch (2026-12-04), so `avx512` is the AVX-512
# peer there (torch runs its own AVX-512 kernels, nothing forced).
_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
ISA_FLAGS = {"native": ["-DGGML_NATIVE=ON"],
             "avx2": [*_X86, "-DGGML_AVX512=OFF"],
             "avx512": [*_X86, "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
                        "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]}


def _cpu_key() -> str:
    flags = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = line
            break
    return hashlib.sha256(flags.encode()).hexdigest()[:10]


def folder(isa: str = "native") -> Path:
    return CACHE / (f"{VERSION}-{_cpu_key()}" if isa == "native" else f"{VERSION}-{isa}")


def binary(isa: str = "native") -> Path | None:
    """The cached llama-server, or None before `build`."""
    path = folder(isa) / "llama-server"
    return path if path.exists() else None


def build(isa: str = "native", jobs: int = 2) -> Path:
    if (done := binary(isa)) is not None:
        return done
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                        "-d", str(work), f"llama-cpp-python=={VERSION}"], check=True)
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        (src,) = work.glob(f"llama_cpp_python-{VERSION}/vendor/llama.cpp")
        subprocess.run(["cmake", "-S", str(src), "-B", str(src / "build"), *CMAKE_FLAGS, *ISA_FLAGS[isa]],
                       check=True)
        subprocess.run(["cmake", "--build", str(src / "build"), f"-j{jobs}", "--target", "llama-server"],
                       check=True)
        staging = folder(isa).with_suffix(".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        bin_dir = src / "build" / "bin"
        shutil.copy2(bin_dir / "llama-server", staging)
        for lib in (src / "build").rglob("*.so*"):
            shutil.copy2(lib, staging, follow_symlinks=True)
        staging.rename(folder(isa))
    path = binary(isa)
    assert path is not None
    return path


def command(gguf: Path, port: int, threads: int, slots: int, context_per_slot: int = 512,
            isa: str = "native") -> tuple[list[str], dict]:
    """The server's argv and environment: `slots` parallel sequences (continuous batching), each
    with `context_per_slot` tokens of context, `threads` for both decode and prompt batches."""
    path = binary(isa)
    if path is None:
        raise FileNotFoundError(f"no llama-server under {folder(isa)}: run `python bench/llama_server.py build {isa}`")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{path.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    argv = [str(path), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * context_per_slot), "-t", str(threads), "-tb", str(threads),
            "--log-disable"]
    return argv, env


if __name__ == "__main__":
    if sys.argv[1:2] != ["build"] or len(sys.argv) > 3 or sys.argv[2:] and sys.argv[2] not in ISA_FLAGS:
        sys.exit(__doc__)
    print(build(*sys.argv[2:]))

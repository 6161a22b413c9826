"""Build-stage step of Dockerfile.engine: compiles Triton's CUDA launcher ahead of time.

Triton compiles one small C module, `cuda_utils` (triton/backends/nvidia/driver.c),
with the system C compiler the first time a kernel runs on a GPU, and caches the
`.so` under TRITON_CACHE_DIR. The engine image has no compiler (no build tools in
the final stage), so the build stage, which has gcc, compiles it into the cache
that the final stage copies.

Triton keys that cache by the source, the platform and the compile config, which
includes the directory of libcuda.so.1. The CUDA driver is not in the image (the
NVIDIA runtime mounts it on GPU nodes, at a path that differs per distribution),
so the image fixes TRITON_LIBCUDA_PATH to a constant directory: the key is then
the same at build and at run time. At build time that directory holds an empty
stub library named libcuda.so.1, only so that the link records `NEEDED
libcuda.so.1`; at run time the dynamic loader finds the node's real driver.

    TRITON_LIBCUDA_PATH=/opt/libcuda-stub TRITON_CACHE_DIR=/opt/triton-cache \
        /opt/venv/bin/python docker/triton_prebuild.py

Prints the path of the cached module. tests/packaging/test_docker_install.py runs
it and checks that a later process finds the module without a compiler.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def make_stub(directory: Path, driver_c: Path) -> Path:
    """A shared library with soname libcuda.so.1 defining every `cu*` name that
    driver.c mentions, for linking only. The names must be there: the linker's
    --as-needed (Debian's default) drops a library that resolves no symbol, and
    the module would then not load the real driver."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", driver_c.read_text())))
    source = directory / "libcuda_stub.c"
    source.write_text("".join(f"void {name}(void) {{}}\n" for name in names))
    stub = directory / "libcuda.so.1"
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)],
                   check=True)
    return stub


def launcher_args() -> dict:
    """The exact arguments CudaUtils() passes to Triton's compile cache."""
    from triton.backends.nvidia import driver

    return dict(src_path=os.path.join(driver.dirname, "driver.c"), name="cuda_utils",
                library_dirs=driver.library_dirs(), include_dirs=driver.include_dirs,
                libraries=driver.libraries)


def main() -> int:
    stub_dir = os.environ.get("TRITON_LIBCUDA_PATH")
    if not stub_dir or not os.environ.get("TRITON_CACHE_DIR"):
        print("set TRITON_LIBCUDA_PATH and TRITON_CACHE_DIR", file=sys.stderr)
        return 2
    args = launcher_args()
    make_stub(Path(stub_dir), Path(args["src_path"]))
    from triton.runtime.build import compile_so_from_file

    print(compile_so_from_file(**args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

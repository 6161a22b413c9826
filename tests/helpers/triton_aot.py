"""Ahead-of-time compilation of Triton kernels to cubin, no GPU needed, shared by
tests/engine/test_triton_compile.py (attention) and test_triton_wxa16_compile.py (W8A16/W4A16).

It must run in a process without TRITON_INTERPRET=1 (tests/conftest.py sets it, which turns
every kernel into an interpreted function): each test module runs itself as a script through
`run_script` and compiles there with `compile_cubin`.
"""
from __future__ import annotations

import os
import subprocess
import sys

# the smallest opt-in shared memory per block of sm_80+ parts (sm_86/89); H100/H200 have 227 KB
MAX_SHARED_BYTES = 99 * 1024


def compile_cubin(fn, signature: dict, constants: dict, sm: int, label: str) -> None:
    """Compiles one kernel configuration for sm_<sm>, checks it fits, prints one 'compiled' line."""
    import triton
    from triton.backends.compiler import GPUTarget
    src = triton.compiler.ASTSource(fn, signature, constants)
    kernel = triton.compile(src, target=GPUTarget("cuda", sm, 32), options=dict(num_warps=4))
    assert kernel.asm["cubin"], label
    assert kernel.metadata.shared <= MAX_SHARED_BYTES, (label, kernel.metadata.shared)
    print(f"compiled {label} sm_{sm}: shared={kernel.metadata.shared}B", flush=True)


def run_script(path: str) -> list[str]:
    """Runs a test module as a script without the interpreter; returns the "compiled ..."
    lines it printed, one per kernel built."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # the script imports this module too: pytest's pythonpath does not reach a child
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(__file__), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return [line for line in res.stdout.splitlines() if line.startswith("compiled ")]

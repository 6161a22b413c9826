"""The Triton W8A16/W4A16 kernels compile for sm_80 and sm_90 ahead of time, no GPU needed.

As tests/engine/test_triton_compile.py does for the attention kernels (the interpreter
accepts what real compilation rejects; a subprocess, because this one has TRITON_INTERPRET=1):
decode tiles (BLOCK_M 16, BLOCK_N 32) and prefill tiles (64 x 64), bf16/fp16 with tf32-free
dots and fp32 with ieee, group-sized K tiles of 32 and 128.
"""
from __future__ import annotations

from triton_aot import compile_cubin, run_script

# (kernel, activation dtype, sm, constexprs)
CONFIGS = [
    ("w8a16", "bf16", 90, dict(GROUP=32, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)),
    ("w8a16", "fp32", 80, dict(GROUP=576, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)),
    ("w4a16", "bf16", 90, dict(GROUP=32, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)),
    ("w4a16", "fp16", 80, dict(GROUP=128, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128)),
]
WEIGHT_TYPES = {"w8a16": "*i8", "w4a16": "*u8"}


def _signature(fn, kind: str, dtype: str, const: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in ("x_ptr", "out_ptr"):
            sig[name] = f"*{dtype}"
        elif name == "q_ptr":
            sig[name] = WEIGHT_TYPES[kind]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"              # scales, mins
        else:
            sig[name] = "i32"
    return sig


def compile_all() -> None:
    from pagedkube.engine.quant import triton_w4a16, triton_w8a16
    kernels = {"w8a16": triton_w8a16._w8a16_kernel, "w4a16": triton_w4a16._w4a16_kernel}
    for kind, dtype, sm, const in CONFIGS:
        fn = kernels[kind]
        const = {**const, "UPCAST_DOT": False, "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32"}
        compile_cubin(fn, _signature(fn, kind, dtype, const), const, sm, f"{kind} {dtype}")


def test_wxa16_kernels_compile_for_sm80_and_sm90():
    compiled = run_script(__file__)
    assert len(compiled) == len(CONFIGS), compiled


if __name__ == "__main__":
    compile_all()

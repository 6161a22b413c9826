"""The Triton kernels compile for real GPUs (sm_80 and sm_90) ahead of time, no GPU needed.

The interpreter tolerates things real compilation rejects (tl.dot smaller than 16,
loop-carried values that change type, non-power-of-two ranges); compiling to cubin
through Triton's own pipeline and ptxas (shipped in the triton wheel) catches them on
a CPU-only machine. It runs in a subprocess because this process has TRITON_INTERPRET=1
(tests/conftest.py), which turns every kernel into an interpreted function.
"""
from __future__ import annotations

from triton_aot import compile_cubin, run_script

# (kernel, dtype, sm, constexprs): decode with split-K and a non-power-of-two group
# (Qwen2.5-0.5B: 14/2 heads) and num_seqs == 1 (Triton specialises the int 1 to a
# constant: the binary search's loop bound), fp32 prefill with head_dim 96 (padded), the
# fp16 prefill tile with head_dim 128, the split reduction, and write_kv with 3 KV heads
# (padded to 4).
CONFIGS = [
    ("attention", "bf16", 90, dict(HEAD_DIM=64, HEAD_DIM_PAD=64, GROUP=7, BLOCK_M=16, BLOCK_Q=2, TILE_N=64,
                                   BLOCK_SIZE=16, NUM_SPLITS=4, DOT_PRECISION="tf32", UPCAST_DOT=False,
                                   num_seqs=1)),
    ("attention", "fp32", 80, dict(HEAD_DIM=96, HEAD_DIM_PAD=128, GROUP=4, BLOCK_M=64, BLOCK_Q=16, TILE_N=32,
                                   BLOCK_SIZE=128, NUM_SPLITS=1, DOT_PRECISION="ieee", UPCAST_DOT=False)),
    ("attention", "fp16", 90, dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=8, BLOCK_M=64, BLOCK_Q=8, TILE_N=64,
                                   BLOCK_SIZE=32, NUM_SPLITS=1, DOT_PRECISION="tf32", UPCAST_DOT=False)),
    ("reduce", "fp16", 90, dict(HEAD_DIM=80, HEAD_DIM_PAD=128, NUM_SPLITS=16)),
    ("write_kv", "bf16", 90, dict(NUM_KV_HEADS=3, NUM_KV_HEADS_PAD=4, HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_SIZE=8)),
    ("bitmask", "fp32", 80, dict(BLOCK=4096)),       # structured outputs' token mask on the logits
    ("bitmask", "fp32", 90, dict(BLOCK=4096)),
]


def _signature(fn, dtype: str, const: dict) -> dict:
    index_ptrs = {"block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "slot_mapping_ptr"}
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name.startswith("part_"):
            sig[name] = "*fp32"
        elif name in ("slot_mapping_ptr", "rows_ptr"):
            sig[name] = "*i64"
        elif name == "bitmask_ptr":
            sig[name] = "*i32"
        elif name in index_ptrs:
            sig[name] = "*i32"
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        elif name == "scale_log2":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_all() -> None:
    from pagedkube.engine.attention import triton_attention, triton_write_kv
    from pagedkube.engine.structured import triton_bitmask
    kernels = {"attention": triton_attention._paged_attention_kernel,
               "reduce": triton_attention._reduce_splits_kernel,
               "write_kv": triton_write_kv._write_kv_kernel,
               "bitmask": triton_bitmask._apply_bitmask_kernel}
    for name, dtype, sm, const in CONFIGS:
        fn = kernels[name]
        compile_cubin(fn, _signature(fn, dtype, const), const, sm, f"{name} {dtype}")


def test_triton_kernels_compile_for_sm80_and_sm90():
    compiled = run_script(__file__)
    assert len(compiled) == len(CONFIGS), compiled


if __name__ == "__main__":
    compile_all()

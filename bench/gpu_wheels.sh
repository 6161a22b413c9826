#!/usr/bin/env bash
# Downloads, into .whl/, the wheels bench/gpu_all.sh needs that a bare GPU machine's Python lacks
# (its image has torch, triton, transformers, safetensors, numpy, pytest; no package index is
# reachable there). Run here, where pip reaches PyPI; then carry .whl with the working tree:
#
#     bash bench/gpu_wheels.sh            # .whl/ (ignored by git) holds ~3 MB of wheels
#
# PYVER names the GPU machine's Python (3.12 on the lent H200 image).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
# the engine's own pins (pyproject.toml) and what xgrammar needs beyond the image
WHEELS=(gguf==0.19.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic-core==2.50.5
        annotated-types==0.8.0 typing-inspection==0.4.5)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${platforms[@]}" -d .whl "${WHEELS[@]}"
ls -l .whl

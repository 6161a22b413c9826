"""Weight-only quantized weights: the packed formats (formats.py) and the layers that compute with them.

    formats.py        Int8Weight, Int4Weight and their dequantize
    quantize.py       float weights -> the packed formats (--quantization int8|int4)
    linear.py         QuantLinear: y = x W^T + b with W kept packed
    calibrate.py      on CPU, each projection shape's kernels chosen by measurement at load
    q4_fused.py       our exact float32 CPU kernels for Q4 and Q8_0 weights (built at first use)
    q4_linear.cpp     their C++ source
    native_decode.cpp a whole decode step over them in one call (engine/native_decode.py)
    cpu_vec.h         vector helpers the C++ sources share
    packed_vocab.py   the embedding and lm_head kept as the file's Q8_0
    assemble.py       each projection's weight, assembled from its checkpoint pieces
    triton_common.py  what the two Triton matmuls share
    triton_w8a16.py   Triton W8A16 matmul
    triton_w4a16.py   Triton W4A16 matmul
"""

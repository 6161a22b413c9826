"""Weight-only quantized weights: the packed formats (formats.py) and the layers that compute with them.

    formats.py        Int8Weight, Int4Weight and their dequantize
    quantize.py       float weights -> the packed formats (--quantization int8|int4)
    linear.py         QuantLinear: y = x W^T + b with W kept packed
    calibrate.py      on CPU, each projection shape's kernels chosen by measurement at load
    assemble.py       each projection's weight, assembled from its checkpoint pieces
    triton_common.py  what the two Triton matmuls share
    triton_w8a16.py   Triton W8A16 matmul
    triton_w4a16.py   Triton W4A16 matmul
"""

"""GGUF quantized blocks -> Int8Weight / Int4Weight, straight from the file's bytes.

No float pass: the 4-bit codes are moved, never recomputed, and every scale and min
is the fp16 number (or fp16 x 6-bit product, exact in float32) the file holds, so
formats.dequantize gives bit for bit what gguf.quants.dequantize gives. The blocks
(ggml-common.h; a row of K values is K / block_values blocks, in order):

    Q8_0  34 B / 32:   d fp16 | qs int8[32]                       W = d q
    Q4_0  18 B / 32:   d fp16 | qs[16]                            W = d (q - 8)
    Q4_1  20 B / 32:   d fp16 | m fp16 | qs[16]                   W = d q + m
          qs byte j: low nibble = value j, high nibble = value j + 16
    Q4_K 144 B / 256:  d fp16 | dmin fp16 | scales[12] | qs[128]  W = d sc_j q - dmin m_j
          8 sub-blocks of 32, 6-bit (sc_j, m_j) packed in scales[12] (get_scale_min_k4);
          qs in 4 chunks of 32 bytes: low nibbles = sub-block 2c, high = 2c + 1

Ours pairs neighbours instead (byte j of a row = values 2j and 2j + 1, low first), so
the codes are unpacked to one per byte and repacked; the values do not change.
"""
from __future__ import annotations

import numpy as np
import torch

from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight

BLOCK_VALUES = 32          # Q8_0/Q4_0/Q4_1 values per block, and Q4_K's sub-block
Q4_K_VALUES = 256          # QK_K
# bytes per block (ggml-common.h)
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q4_K": 144}
PACKED_TYPES = tuple(BLOCK_BYTES)   # the types served as they are; the rest are dequantized


def _blocks(raw: np.ndarray, shape: tuple[int, ...], ggml_type: str) -> np.ndarray:
    """uint8 [N, blocks per row, block bytes]."""
    n, k = shape
    per_block = Q4_K_VALUES if ggml_type == "Q4_K" else BLOCK_VALUES
    if k % per_block:
        raise ValueError(f"a {ggml_type} row of {k} values is not a whole number of {per_block}-value blocks")
    return np.ascontiguousarray(raw).view(np.uint8).reshape(n, k // per_block, BLOCK_BYTES[ggml_type])


def _pair_nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., B] bytes holding values 0..B-1 in their low nibbles and B..2B-1 in their high ones
    (ggml's order) -> [..., B] bytes, byte j = values 2j (low nibble) and 2j + 1 (ours). Values
    2j and 2j + 1 sit in the low nibbles of bytes 2j and 2j + 1 for 2j < B, in the high nibbles
    of bytes 2j - B and 2j - B + 1 past it: four operations on the even and odd bytes, with no
    array of one code a byte in between (2x faster than unpacking and repacking, the default
    model's load 0.17 -> 0.10 s)."""
    even, odd = qs[..., 0::2], qs[..., 1::2]
    out = np.empty(qs.shape, dtype=np.uint8)
    half = qs.shape[-1] // 2
    np.bitwise_or(even & 0x0F, odd << 4, out=out[..., :half])      # uint8 << 4 drops the high nibble
    np.bitwise_or(even >> 4, odd & 0xF0, out=out[..., half:])
    return out


def _int4(packed: np.ndarray, scales: np.ndarray, mins: np.ndarray, n: int, k: int) -> Int4Weight:
    """formats.pack_int4's layout (two codes a byte, low nibble first), from _pair_nibbles."""
    return Int4Weight(qweight=torch.from_numpy(packed.reshape(n, k // 2)),
                      scales=torch.from_numpy(np.ascontiguousarray(scales.reshape(n, -1), dtype=np.float32)),
                      mins=torch.from_numpy(np.ascontiguousarray(mins.reshape(n, -1), dtype=np.float32)),
                      group_size=BLOCK_VALUES)


def q4_k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., 12] bytes -> (sc, m), each [..., 8] in [0, 63] (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    lo, hi = s[..., 0:4], s[..., 4:8]
    tail = s[..., 8:12]
    sc = np.concatenate((lo & 63, (tail & 0x0F) | ((lo >> 6) << 4)), axis=-1)
    m = np.concatenate((hi & 63, (tail >> 4) | ((hi >> 6) << 4)), axis=-1)
    return sc, m


def pack_gguf(raw: np.ndarray, ggml_type: str, shape: tuple[int, ...]) -> QuantizedWeight:
    """One stored matrix (torch order [N, K]) of a PACKED_TYPES type, as formats.py's weight."""
    if ggml_type not in BLOCK_BYTES or len(shape) != 2:
        raise ValueError(f"pack_gguf: a {ggml_type} tensor of shape {shape} has no packed form")
    n, k = shape
    b = _blocks(raw, shape, ggml_type)
    h = b.view(np.float16)          # every block size is even: d and m / dmin are h[..., 0] and h[..., 1], no copy
    if ggml_type == "Q8_0":
        q = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, k))
        return Int8Weight(qweight=q, scales=torch.from_numpy(h[..., 0].astype(np.float32)), group_size=BLOCK_VALUES)
    if ggml_type == "Q4_0":
        d = h[..., 0].astype(np.float32)
        return _int4(_pair_nibbles(b[..., 2:]), d, -8 * d, n, k)
    if ggml_type == "Q4_1":
        return _int4(_pair_nibbles(b[..., 4:]), h[..., 0], h[..., 1], n, k)
    # Q4_K
    d, dmin = h[..., 0].astype(np.float32), h[..., 1].astype(np.float32)
    sc, m = q4_k_scale_min(b[..., 4:16])                           # [N, blocks, 8]
    qs = b[..., 16:].reshape(n, k // Q4_K_VALUES, 4, 32)            # 4 chunks of 32 bytes: sub-blocks 2c, 2c + 1
    scales = d[..., None] * sc.astype(np.float32)
    mins = -(dmin[..., None] * m.astype(np.float32))
    return _int4(_pair_nibbles(qs), scales, mins, n, k)

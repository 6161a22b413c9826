"""A GGUF file's header (metadata and tensor table) read in bulk, for start-up in seconds.

gguf-py's GGUFReader builds a field object per array element, so the default model's
49,152 tokens, token types and 48,900 merges take seconds to read (docs/benchmarks.md
"Start-up"); this reads the same bytes with one numpy view per numeric array and one
slice per string, and gives what GGUFReader gives (tests/engine/test_gguf_header.py
compares them field by field and tensor by tensor on real and generated files):

    metadata   key -> ReaderField.contents(): int, float, bool, str, or a list of them
    tensors    name, ggml type, dims (innermost first), byte count, and the data as a
               read-only memory-map view in GGUFReader's dtype and shape

Layout (GGUF v2/v3, little-endian, per the GGUF specification in the ggml repository): magic "GGUF", u32 version, u64
tensor count, u64 key count, the keys (string key, u32 value type, value), the tensor
infos (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset), padding to
general.alignment (32 unless set), then the data. Big-endian files are refused.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_U64 = struct.Struct("<Q")
STRING, ARRAY = 8, 9
# GGUF value type -> numpy dtype (little-endian); STRING and ARRAY are read apart
SCALARS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
           7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
# ggml types stored as plain numbers (GGUFReader's dtypes); the rest are blocks of bytes
PLAIN_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
               "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    ggml_type: str            # "Q4_1", "F32", ...
    dims: tuple[int, ...]     # GGUF order: innermost first
    n_bytes: int
    data: np.ndarray          # read-only view of the file


class _Cursor:
    """Reads little-endian values at `offset` of the file's bytes (a memoryview of the map):
    struct for scalars and string lengths, one numpy view for a numeric array."""

    def __init__(self, buf: np.ndarray):
        self.mv, self.size, self.offset = buf.data, len(buf), 0

    def _need(self, size: int) -> None:
        if self.offset + size > self.size:
            raise ValueError(f"truncated GGUF header at byte {self.offset}")

    def take(self, dtype, count: int = 1) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        self._need(size)
        out = np.frombuffer(self.mv, dtype=dtype, count=count, offset=self.offset)
        self.offset += size
        return out

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(fmt, self.mv, self.offset)
        self.offset += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self._need(n)
        text = str(self.mv[self.offset:self.offset + n], "utf-8")
        self.offset += n
        return text

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row: string() in one loop with local names (3x faster)."""
        mv, size, offset, out = self.mv, self.size, self.offset, []
        length = _U64.unpack_from
        for _ in range(count):
            if offset + 8 > size:
                break
            (n,) = length(mv, offset)
            offset += 8
            if offset + n > size:
                break
            out.append(str(mv[offset:offset + n], "utf-8"))
            offset += n
        self.offset = offset
        if len(out) < count:
            raise ValueError(f"truncated GGUF header at byte {offset}")
        return out

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in SCALARS:                          # the bulk read: one view for the whole array
                return self.take(SCALARS[item], count).tolist()
            if item == STRING:                           # a vocabulary or merges: ~50k strings each
                return self.strings(count)
            return [self.value(item) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.offset}")
        return self.take(SCALARS[kind])[0].item()


def read_header(path: Path, quant_sizes: dict[str, tuple[int, int]]) -> tuple[dict[str, Any], list[TensorInfo]]:
    """(metadata, tensors) of the GGUF file at `path`. quant_sizes: ggml type name -> (values
    per block, bytes per block) (gguf.GGML_QUANT_SIZES by name); ValueError on a malformed file."""
    buf = np.memmap(path, mode="r")
    cur = _Cursor(buf)
    if bytes(cur.take(np.uint8, 4)) != MAGIC:
        raise ValueError("GGUF magic invalid")
    version = cur.scalar("<I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} is not supported (big-endian files neither)")
    n_tensors, n_keys = cur.scalar("<Q"), cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_keys):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.take(np.uint64, cur.scalar("<I")).tolist())
        infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError("Invalid alignment: must be a non-zero power of two")
    start = -(-cur.offset // alignment) * alignment
    names = {code: name for name, code in _type_codes().items()}
    tensors, seen = [], set()
    for name, dims, code, offset in infos:
        if name in seen:
            raise ValueError(f"Found duplicated tensor with name {name}")
        seen.add(name)
        kind = names.get(code)
        if kind is None or kind not in quant_sizes:
            raise ValueError(f"tensor {name!r}: unknown ggml type {code}")
        n_elems = int(np.prod(dims, dtype=np.int64))
        block, size = quant_sizes[kind]
        n_bytes = n_elems * size // block
        shape = tuple(reversed(dims))
        if kind in PLAIN_TYPES:
            dtype = PLAIN_TYPES[kind]
        else:
            dtype, shape = np.uint8, (*shape[:-1], shape[-1] * size // block)
        begin = start + offset
        if begin + n_bytes > len(buf):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        tensors.append(TensorInfo(name, kind, dims, n_bytes, buf[begin:begin + n_bytes].view(dtype).reshape(shape)))
    return metadata, tensors


def _type_codes() -> dict[str, int]:
    from gguf import GGMLQuantizationType
    return {t.name: int(t.value) for t in GGMLQuantizationType}

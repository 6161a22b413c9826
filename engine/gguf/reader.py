"""One GGUF file: its metadata, and its tensors one at a time.

The header is read in bulk by engine/gguf/header.py (what gguf-py's GGUFReader gives, in
milliseconds rather than seconds); the `gguf` package dequantizes the types we do not keep packed.

The per-tensor seam every weight path goes through:

    GGUFFile.tensors()  ->  GGUFTensor(name, ggml_type, shape, raw)  ->  dequantize(t)  ->  float32

`raw` is the file's bytes for that tensor (a read-only memory map, never copied), so a
loader that keeps weights quantized (issue 20) takes `raw` and `ggml_type` and skips
`dequantize`. `shape` is in torch order (rows first); GGUF stores dims innermost first.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from pagedkube.engine.gguf.header import read_header

# The ggml types we load, dequantized by gguf.quants (issue 16's list). The others in
# GGMLQuantizationType (Q2_K, IQ*, TQ*, ...) are refused by name rather than half-supported.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
HASH_CHUNK_BYTES = 16 * 2**20   # sha256 streams the file; 16 MiB reads keep memory flat


def _gguf():
    try:
        import gguf
    except ImportError as e:   # an engine extra; say so at start-up, not as a NameError later
        raise ValueError("GGUF models need the `gguf` package (pip install 'pagedkube[engine]')") from e
    return gguf


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str                   # the file's name, e.g. "blk.0.attn_q.weight"
    ggml_type: str              # "Q4_1", "F32", ...
    shape: tuple[int, ...]      # torch order: (rows, cols) for a matrix
    raw: np.ndarray             # the stored data (uint8 blocks for quantized types)


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        sizes = {t.name: v for t, v in _gguf().GGML_QUANT_SIZES.items()}
        try:
            self.metadata, self._tensors = read_header(self.path, sizes)
        except (ValueError, OSError) as e:
            raise ValueError(f"cannot read GGUF file {str(self.path)!r}: {e}") from None

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tensor_types(self) -> dict[str, str]:
        return {t.name: t.ggml_type for t in self._tensors}

    def tensor_bytes(self) -> dict[str, int]:
        """name -> the bytes the file stores for it."""
        return {t.name: t.n_bytes for t in self._tensors}

    def tensors(self) -> Iterator[GGUFTensor]:
        for t in self._tensors:
            yield GGUFTensor(name=t.name, ggml_type=t.ggml_type, shape=tuple(reversed(t.dims)), raw=t.data)

    def check_types(self) -> None:
        bad = sorted({f"{name} ({kind})" for name, kind in self.tensor_types().items() if kind not in SUPPORTED_TYPES})
        if bad:
            kinds = sorted({b.rsplit("(", 1)[1].rstrip(")") for b in bad})
            raise ValueError(f"{self.path.name}: unsupported GGUF tensor types {kinds} (in {bad[:3]}...); "
                             f"supported: {', '.join(SUPPORTED_TYPES)}")


def dequantize(tensor: GGUFTensor) -> np.ndarray:
    """The tensor's values as float32, in its torch shape."""
    if tensor.ggml_type not in SUPPORTED_TYPES:
        raise ValueError(f"tensor {tensor.name!r}: unsupported GGUF type {tensor.ggml_type}; "
                         f"supported: {', '.join(SUPPORTED_TYPES)}")
    gguf = _gguf()
    qtype = gguf.GGMLQuantizationType[tensor.ggml_type]
    values = gguf.quants.dequantize(tensor.raw, qtype)
    return np.asarray(values, dtype=np.float32).reshape(tensor.shape)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()

"""The loader's side of QuantLinear: each projection's weight, assembled from its pieces.

A fused projection arrives in pieces (q, k, v; gate, up) from the checkpoint, each
covering a row range (engine/loader.py). ProjectionWeights collects the pieces of each
QuantLinear and, once every row is in, gives the layer its weight:

    method "gguf"        the pieces as stored: packed ones concatenate when they share
                         format and group size; otherwise (or for float pieces) the
                         rows are dequantized and the layer runs dense
    method "int8"/"int4" the float rows quantized at load (engine/quant/quantize.py)

Rows are output channels, so concatenating pieces is exact in every format.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from pagedkube.engine.quant.calibrate import KernelCalibration
from pagedkube.engine.quant.formats import QuantizedWeight, dequantize
from pagedkube.engine.quant.linear import QuantLinear
from pagedkube.engine.quant.quantize import concat_rows, quantize

METHODS = ("gguf", "int8", "int4")


class ProjectionWeights:
    def __init__(self, model: nn.Module, method: str, dtype: torch.dtype, device: torch.device,
                 calibration: KernelCalibration | None = None):
        """calibration: the measured kernel choice for packed weights (CPU); None = make_kernel's."""
        if method not in METHODS:
            raise ValueError(f"ProjectionWeights: method must be one of {METHODS}, got {method!r}")
        self.method, self.dtype, self.device = method, dtype, device
        self.calibration = calibration
        self.layers = {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, QuantLinear)}
        self.pieces: dict[str, list[tuple[int, torch.Tensor | QuantizedWeight, str]]] = {n: [] for n in self.layers}
        self.rows = {name: 0 for name in self.layers}
        self.done: set[str] = set()
        self.dequantized: Counter[str] = Counter()   # stored type -> pieces dequantized (mixed fusions)
        self.kernels: Counter[str] = Counter()       # kernel name -> layers

    def __contains__(self, name: str) -> bool:
        return name in self.layers

    def put(self, name: str, rows: slice | None, value: torch.Tensor | QuantizedWeight, stored: str) -> None:
        layer = self.layers[name]
        start, stop = (0, layer.out_features) if rows is None else (rows.start, rows.stop)
        expected = (stop - start, layer.in_features)
        if tuple(value.shape) != expected:
            raise ValueError(f"tensor for {name!r} rows [{start}, {stop}) has shape {tuple(value.shape)}, "
                             f"expected {expected}")
        if name in self.done or self.rows[name] + expected[0] > layer.out_features:
            raise ValueError(f"checkpoint has more rows than {name!r} holds (a duplicated tensor)")
        self.pieces[name].append((start, value, stored))
        self.rows[name] += expected[0]
        if self.rows[name] == layer.out_features:
            self._finish(name, layer)

    def _finish(self, name: str, layer: QuantLinear) -> None:
        pieces = sorted(self.pieces.pop(name), key=lambda p: p[0])
        values = [v for _, v, _ in pieces]
        stored = sorted({s for _, _, s in pieces})
        weight: torch.Tensor | QuantizedWeight | None = None
        quantized = [v for v in values if not isinstance(v, torch.Tensor)]
        # pieces already in the method's format (quantized whole, then cut for a tensor-parallel rank:
        # engine/distributed/sharding.py) stay as they are
        if (self.method == "gguf" or set(stored) == {self.method}) and len(quantized) == len(values):
            weight = concat_rows(quantized)
            if weight is None:
                self.dequantized.update(s for _, _, s in pieces)
        if weight is None:
            dense = torch.cat([v.float() if isinstance(v, torch.Tensor) else dequantize(v) for v in values])
            weight = dense if self.method == "gguf" else quantize(dense, self.method)
        source = "+".join(stored) if self.method == "gguf" else f"{self.method} from {'+'.join(stored)}"
        kernel, label = None, None
        if self.calibration is not None and not isinstance(weight, torch.Tensor):
            kernel, label = self.calibration.kernel(weight)
        layer.set_weight(weight, self.dtype, self.device, source, kernel)
        assert layer.kernel is not None     # set_weight chose it
        self.kernels[label or layer.kernel.name] += 1
        self.done.add(name)

    def missing(self) -> list[str]:
        return [name for name in self.layers if name not in self.done]

"""A decode-only step as one call into our C++ library (engine/quant/native_decode.cpp).

On the GGUF default path (our Q4 and Q8_0 kernels loaded, float32 activations, CPU) a one-row
decode step is ~8-10 ms, of which our kernels are ~75%; the rest was Python around them: the
eager step's ~40 module and operator calls a layer, or, captured (engine/decode_capture.py),
Inductor's generated wrapper (~2 ms a step) and Dynamo's entry. Here the embedding lookup is
one Python call, the 30 layers and the final norm one more; the projections run the kernels the
calibration chose for each (the decode kernel up to its row limit, the prefill one above), so
the tokens are the eager step's, and any number of rows decodes without padding or buckets.

There is nothing to compile: a process serves at full speed from its first decode step, with
no background compile taking CPU from requests and no Inductor cache to ship. So where it
applies, `--decode-capture auto` takes it over torch.compile (runner_setup.resolve_decode_capture;
measured: docs/benchmarks.md "One call a decode step"), and `--decode-capture native` asks for it
(an error where it does not apply). It applies to the decoder of engine/models/decoder.py
without q/k norms, whose every projection runs a kernel of a form listed in FORMS, with our
attention backend (CpuKernelBackend) and float32 activations: not under LoRA or tensor
parallelism (the runner checks those).
"""
from __future__ import annotations

import logging
from typing import cast

import torch
from torch import nn

from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
from pagedkube.engine.models.decoder import DecoderForCausalLM, DecoderLayer
from pagedkube.engine.quant.linear import DenseKernel, QuantLinear, SplitKernel
from pagedkube.engine.quant.q4_fused import Q4DequantKernel, Q4FusedKernel, Q4Int16Kernel, Q4Ops

log = logging.getLogger(__name__)

# native_decode.cpp's kernel forms (its enum Form), by kernel class
FORMS: dict[type, int] = {DenseKernel: 0, Q4FusedKernel: 1, Q4Int16Kernel: 2, Q4DequantKernel: 3}
NO_ROW_LIMIT = 1 << 62        # a projection with one kernel: it serves every row count
_EMPTY = torch.empty(0)


def _kernel_tensors(kernel) -> tuple[int, list[torch.Tensor]]:
    """(form, [a, b, c]) of one kernel; ValueError for a kernel the C++ step cannot run."""
    form = FORMS.get(type(kernel))
    if form is None:
        raise ValueError(f"kernel {getattr(kernel, 'name', type(kernel).__name__)!r}")
    if isinstance(kernel, DenseKernel):
        return form, [kernel.weight, _EMPTY, _EMPTY]
    w = kernel.weight
    return form, [w.qweight, w.scales, w.mins]


def _split(module: nn.Module) -> tuple[object, object, int]:
    """(decode kernel, prefill kernel, max decode rows) of one projection module."""
    if isinstance(module, QuantLinear):
        kernel = module.kernel
        if isinstance(kernel, SplitKernel):
            return kernel.decode, kernel.prefill, kernel.max_decode_rows
        return kernel, kernel, NO_ROW_LIMIT
    if type(module) is nn.Linear:
        dense = DenseKernel(module.weight)
        return dense, dense, NO_ROW_LIMIT
    raise ValueError(f"projection {type(module).__name__}")


def _projection(module: nn.Module) -> tuple[list[int], list[torch.Tensor]]:
    """([decode form, prefill form, max decode rows], the 7 tensors) of one projection."""
    decode, prefill, rows = _split(module)
    (df, dt), (pf, pt) = _kernel_tensors(decode), _kernel_tensors(prefill)
    bias = cast("torch.Tensor | None", module.bias)           # QuantLinear's and nn.Linear's (_split checked)
    return [df, pf, rows], [*dt, *pt, bias if bias is not None else _EMPTY]


def _layers(model: DecoderForCausalLM) -> list[DecoderLayer]:
    return cast("list[DecoderLayer]", list(model.model.layers))


def _projections(layer: DecoderLayer) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    """qkv, o, gate_up, down: native_decode.cpp's order."""
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def why_not_native(model: nn.Module, ops: Q4Ops | None) -> str | None:
    """None where NativeDecode can run this model, else why not (for the log and for
    `--decode-capture native`'s error)."""
    if ops is None or ops.ext is None or not ops.has_attention():
        return "our C++ kernels (with their AVX2 attention) are not loaded in this process"
    if not isinstance(model, DecoderForCausalLM):
        return f"model class {type(model).__name__}"
    layers = _layers(model)
    if not isinstance(layers[0].self_attn.backend, CpuKernelBackend):
        return "the attention backend is not our CPU kernel backend"
    if model.config.qk_norm:
        return "q/k RMSNorm (Qwen3) is not in the C++ step"
    if model.model.norm.weight.dtype != torch.float32 or model.rotary.cos.dtype != torch.float32:
        return "activations are not float32"
    try:
        for layer in layers:
            for proj in _projections(layer):
                _projection(proj)
    except ValueError as e:
        return f"a projection's kernel has no C++ form: {e}"
    return None


class NativeDecode:
    """run(step) -> the final norm's hidden rows of a decode-only step, None for any other step
    (the runner then runs the model eagerly); DecodeCapture's interface."""

    def __init__(self, model: DecoderForCausalLM, kv_caches: list, ops: Q4Ops | None):
        reason = why_not_native(model, ops)
        if reason is not None or ops is None:
            raise ValueError(f"native decode does not apply: {reason}")
        cfg, layers = model.config, _layers(model)
        tensors, forms = [], []
        for layer, (k_cache, v_cache) in zip(layers, kv_caches, strict=True):
            layer_tensors = [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                             k_cache, v_cache]
            layer_forms: list[int] = []
            for proj in _projections(layer):
                f, t = _projection(proj)
                layer_forms += f
                layer_tensors += [x.detach() for x in t]
            tensors.append(layer_tensors)
            forms.append(layer_forms)
        self.embed: nn.Module = model.model.embed_tokens
        self.decoder = ops.ext.NativeDecoder(         # type: ignore[union-attr]   # why_not_native checked it
            tensors, forms, model.model.norm.weight.detach(), model.rotary.cos, model.rotary.sin_signed,
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, model.model.norm.eps,
            layers[0].self_attn.scale)
        self.num_captured_steps = 0              # steps run here (the engine's stats, tests)
        log.info("decode steps run natively: one C++ call a step (engine/native_decode.py)")

    def run(self, step) -> torch.Tensor | None:
        meta = step.meta
        if meta.max_query_len != 1:
            return None
        self.num_captured_steps += 1
        return self.decoder.step(self.embed(step.input_ids).contiguous(), step.positions, meta.slot_mapping,
                                 meta.seq_lens, meta.block_tables)

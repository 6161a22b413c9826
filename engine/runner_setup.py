"""What an engine decides before its runner builds anything (engine/model_runner.py): the device,
the attention backend, how decode steps run (eager, natively in C++, captured before serving, or
compiled in the background), the model's local folder or file, and whether its projections stay quantized.
"""
from __future__ import annotations

import logging
import os
import shutil
import sysconfig
from importlib import import_module

import torch

from pagedkube.engine.attention.backend import AttentionBackend
from pagedkube.engine.config import DECODE_CAPTURE_ENV, DECODE_CAPTURES, EngineConfig
from pagedkube.engine.gguf.reader import GGUFFile
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.quant.q4_fused import Q4Ops

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


def select_backend(name: str, device: torch.device, kernels: Q4Ops | None = None) -> AttentionBackend:
    """"torch": torch_ref's math with decodes batched (torch_backend); "triton": the kernels
    (CUDA); "auto": triton on CUDA when importable; on CPU our decode kernel over torch_backend
    (cpu_backend) where `kernels`, this process's built C++ kernels, have it, else torch_backend."""
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        if name == "auto" and kernels is not None and kernels.has_attention():
            from pagedkube.engine.attention.cpu_backend import CpuKernelBackend
            return CpuKernelBackend(kernels)
        return import_module("pagedkube.engine.attention.torch_backend")
    try:
        return import_module("pagedkube.engine.attention.triton_backend")
    except ImportError as e:
        if name == "triton":
            raise ValueError(f"attention_backend 'triton' is not available: {e}") from e
        log.warning("triton attention backend unavailable (%s); using the torch backend", e)
        return import_module("pagedkube.engine.attention.torch_backend")


def resolve_decode_capture(config: EngineConfig, device: torch.device, tensor_parallel: bool = False,
                           why_not_native: str | None = "not checked") -> str:
    """How decode steps run (EngineConfig.decode_capture): "off" (eager), "native" (one C++ call
    a step, engine/native_decode.py), "on" (every bucket captured before serving) or "background"
    (compiled on a thread while eager steps serve). `why_not_native`: None where the loaded model
    can run natively, else why not (native_decode.why_not_native).
    auto = native where it can run (no LoRA, one rank): a one-row step measured 9.2 against
    14.1 ms captured and 15.3 ms eager, the same tokens, nothing to compile (docs/benchmarks.md
    "One call a decode step"); else background on CPU where it can run (a C++ toolchain for
    torch.compile, the torch attention backend, no LoRA, one rank): a bucket compiles for 1-3
    minutes on a 2-core CPU for a ~1.4x shorter one-client decode step (docs/benchmarks.md "Whole
    decode-step capture"), and in the background start-up does not wait for it. On CUDA auto = on
    (the Triton attention backend, no LoRA, one rank): CUDA graphs of buckets 1-8 took 1.9 s to
    capture on an H200 and made a Qwen2.5-0.5B-shaped decode step 3.7x shorter at one client, 2.7x
    at eight (docs/benchmarks.md "GPU (Triton)"). $PAGEDKUBE_DECODE_CAPTURE (one of
    DECODE_CAPTURES) stands in for an `auto` setting: a deployment's (or a test suite's) default."""
    mode = config.decode_capture
    if mode == "auto":
        mode = os.environ.get(DECODE_CAPTURE_ENV) or "auto"
        if mode not in DECODE_CAPTURES:
            raise ValueError(f"${DECODE_CAPTURE_ENV} must be one of {DECODE_CAPTURES}, got {mode!r}")
    if mode == "off":
        return "off"
    if mode == "native":                  # LoRA and tensor parallelism: refused by EngineConfig and the runner
        if why_not_native is not None:
            raise ValueError(f"decode_capture 'native' does not apply to this model: {why_not_native}")
        return "native"
    if mode == "auto":
        if config.enable_lora or tensor_parallel:
            return "off"
        if why_not_native is None:
            return "native"
        if device.type == "cuda":
            return "on" if config.attention_backend != "torch" else "off"
        runnable = device.type == "cpu" and config.attention_backend != "triton" and has_cxx_toolchain()
        return "background" if runnable else "off"
    if device.type == "cpu" and config.attention_backend == "triton":
        raise ValueError("decode_capture 'on' on CPU needs the torch attention backend, not triton")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"decode_capture 'on' supports cpu and cuda, not {device.type}")
    if device.type == "cpu" and not has_cxx_toolchain():
        raise ValueError("decode_capture 'on' on CPU needs a C++ compiler and Python's headers for torch.compile "
                         "(Debian: apt-get install g++ python3-dev; `make cxx`)")
    return "on"


def has_cxx_toolchain() -> bool:
    """Whether torch.compile can build CPU code here: Inductor's C++ is built with $CXX (default g++)
    against Python.h."""
    return (shutil.which(os.environ.get("CXX", "g++")) is not None
            and os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))


def resolve_model_dir(model: str | None) -> str:
    """The local model directory or GGUF file a --model value names (pagedkube.model_source);
    a Hub model's config is checked before its weights are downloaded."""
    from pagedkube.engine.gguf.config import check_gguf_architecture
    from pagedkube.engine.model_config import check_hub_config
    from pagedkube.model_source import resolve_model_source

    return str(resolve_model_source(model, check_hub_config, check_gguf_architecture).path)


def serves_quantized_weights(config: EngineConfig, model_config: ModelConfig, gguf: GGUFFile | None = None) -> bool:
    """Whether the projections will hold packed int8/int4 weights (engine/quant): asked for
    with quantization int8/int4, or "auto" on a GGUF file with a projection stored in a type
    the loader keeps packed (engine/gguf/packing.py PACKED_TYPES). gguf: the file, already open."""
    if config.quantization in ("int8", "int4"):
        return True
    if config.quantization != "auto" or model_config.gguf_file is None:
        return False
    from pagedkube.engine.gguf.packing import PACKED_TYPES
    from pagedkube.engine.gguf.weights import is_projection

    types = (gguf or GGUFFile(model_config.gguf_file)).tensor_types()
    return any(kind in PACKED_TYPES and is_projection(name) for name, kind in types.items())

"""Build a decoder and fill it from a Hugging Face safetensors checkpoint or a GGUF file.

The model is constructed on the meta device (no memory, no random init),
materialised on the target device in the target dtype, then every parameter is
copied from the checkpoint by its Hugging Face name. Checkpoint pieces of our
fused projections land in row slices:

    q_proj | k_proj | v_proj   -> qkv_proj     rows [0, q) [q, q+kv) [q+kv, q+2kv)
    gate_proj | up_proj        -> gate_up_proj rows [0, I) [I, 2I)

Every parameter (and every slice of a fused one) must be loaded exactly once;
a missing or unexpected tensor or a shape mismatch is a ValueError naming it.
lm_head shares embed_tokens' weight when the config ties them or when the
checkpoint has no lm_head.weight (as Hugging Face does). A GGUF file's tensors
arrive already renamed and dequantized (engine/gguf/weights.py) and take the
same path.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import torch
from safetensors import safe_open

from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.models.decoder import DecoderForCausalLM

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Used on CUDA when dtype is "auto" and the checkpoint does not say (the usual release dtype).
DEFAULT_CUDA_DTYPE = "bfloat16"
# /proc/cpuinfo flags of CPUs with bf16 dot-product instructions (Intel Cooper Lake+/Sapphire
# Rapids AMX, AMD Zen 4+): oneDNN runs bf16 matmuls natively there, and emulates them elsewhere.
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # precomputed tables some old checkpoints carry


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU multiplies bf16 in hardware (x86 AVX512_BF16 or AMX-BF16, as Linux's
    /proc/cpuinfo flags name them); False where that file does not exist."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return bool(flags & CPU_BF16_FLAGS)


def resolve_dtype(requested: str, device: torch.device, cfg: ModelConfig, quantized: bool = False,
                  native_bf16: bool | None = None) -> torch.dtype:
    """The activation (and KV cache) dtype. "auto":
    - CUDA: the checkpoint's torch_dtype (bfloat16 when it does not say; float16 without bf16);
    - CPU, quantized weights, a CPU with native bf16: bfloat16. torch's packed int8/int4 CPU
      matmuls are 5-30x faster with bf16 activations than with float32 ones (docs/benchmarks.md,
      "Activation dtype on CPU");
    - CPU otherwise: float32. A float model in float32 computes what Hugging Face's float32
      reference computes, token for token; bf16 is faster here too but changes outputs, so it
      is asked for with dtype "bfloat16" rather than given silently.
    `native_bf16` None = detected (cpu_has_native_bf16)."""
    if requested == "auto":
        if device.type == "cpu":
            if quantized and (cpu_has_native_bf16() if native_bf16 is None else native_bf16):
                return torch.bfloat16
            return torch.float32
        name = cfg.torch_dtype or DEFAULT_CUDA_DTYPE
        if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            name = "float16"
        return DTYPES[name]
    if requested not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {requested!r}")
    return DTYPES[requested]


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        files = [path / name for name in dict.fromkeys(weight_map.values())]
    else:
        files = [path / "model.safetensors"]
    for f in files:
        if not f.is_file():
            raise ValueError(f"checkpoint file {str(f)!r} is missing")
    return files


def _fused_targets(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """checkpoint suffix -> (our suffix, row start, row end)."""
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    inter = cfg.intermediate_size
    targets = {}
    for kind in ("weight", "bias"):
        targets[f"self_attn.q_proj.{kind}"] = (f"self_attn.qkv_proj.{kind}", 0, q)
        targets[f"self_attn.k_proj.{kind}"] = (f"self_attn.qkv_proj.{kind}", q, q + kv)
        targets[f"self_attn.v_proj.{kind}"] = (f"self_attn.qkv_proj.{kind}", q + kv, q + 2 * kv)
        targets[f"mlp.gate_proj.{kind}"] = (f"mlp.gate_up_proj.{kind}", 0, inter)
        targets[f"mlp.up_proj.{kind}"] = (f"mlp.gate_up_proj.{kind}", inter, 2 * inter)
    return targets


def _destination(name: str, fused: dict[str, tuple[str, int, int]]) -> tuple[str, slice | None]:
    for src, (dst, start, end) in fused.items():
        if name.endswith("." + src):
            return name[: -len(src)] + dst, slice(start, end)
    return name, None


class _Sink:
    """Places checkpoint tensors (Hugging Face names) into the model's parameters and
    checks that every parameter (and every slice of a fused one) is filled exactly once."""

    def __init__(self, model: DecoderForCausalLM, cfg: ModelConfig):
        self.model, self.cfg = model, cfg
        self.params = dict(model.named_parameters())        # tied lm_head appears once, as embed_tokens
        self.loaded: dict[str, int] = {name: 0 for name in self.params}   # rows loaded per parameter
        self.expected = {name: p.shape[0] for name, p in self.params.items()}
        self.fused = _fused_targets(cfg)
        self.has_lm_head = False

    def put(self, name: str, tensor: torch.Tensor, source: str) -> None:
        if name == "lm_head.weight":
            self.has_lm_head = True
            if self.cfg.tie_word_embeddings:
                return                                      # tied: embed_tokens is the one copy
        dst, rows = _destination(name, self.fused)
        if dst not in self.params:
            raise ValueError(f"unexpected tensor {name!r} in {source} for a {self.cfg.architecture}")
        target = self.params[dst].data if rows is None else self.params[dst].data[rows]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        target.copy_(tensor)
        self.loaded[dst] += target.shape[0] if target.dim() else 1

    def finish(self, where: str) -> None:
        if not self.cfg.tie_word_embeddings and not self.has_lm_head:
            self.model.lm_head.weight = self.model.model.embed_tokens.weight  # Hugging Face ties when lm_head is absent
            self.loaded["lm_head.weight"] = self.expected["lm_head.weight"]
        missing = [n for n in self.params if self.loaded[n] != self.expected[n]]
        if missing:
            raise ValueError(f"checkpoint in {where!r} lacks (or duplicates) tensors for {missing}")


def load_model(cfg: ModelConfig, backend: ModuleType, device: torch.device, dtype: torch.dtype,
               max_positions: int) -> DecoderForCausalLM:
    with torch.device("meta"):
        model = DecoderForCausalLM(cfg, backend, max_positions, device=device)
    model.to(dtype=dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:                          # to_empty() unties shared parameters
        model.lm_head.weight = model.model.embed_tokens.weight
    sink = _Sink(model, cfg)
    if cfg.gguf_file is not None:
        from pagedkube.engine.gguf.reader import GGUFFile
        from pagedkube.engine.gguf.weights import hf_tensors

        for name, tensor in hf_tensors(GGUFFile(cfg.gguf_file), cfg):
            sink.put(name, tensor, Path(cfg.gguf_file).name)
        sink.finish(cfg.gguf_file)
    else:
        for file in checkpoint_files(cfg.model_dir):
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if not name.endswith(IGNORED_SUFFIXES):
                        sink.put(name, f.get_tensor(name), file.name)
        sink.finish(cfg.model_dir)
    model.eval()
    return model

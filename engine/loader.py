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
arrive already renamed (engine/gguf/weights.py) and take the same path.

Quantization (EngineConfig.quantization, resolved by `resolve_quantization`):

    none   every weight dense in the engine dtype (GGUF types dequantized): the reference
    gguf   (auto on a GGUF file) projections keep the file's Q8_0/Q4_0/Q4_1/Q4_K blocks
    int8   projections quantized at load, per output channel
    int4   projections quantized at load, groups of 32 with scale and min

With any but none the projections (qkv, o, gate_up, down) are QuantLinear layers whose
weights engine/quant/assemble.py puts together from the pieces; embeddings, norms and
lm_head stay dense in the engine dtype (lm_head: docs/engine.md says why).
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from pagedkube.engine.config import QUANTIZATIONS
from pagedkube.engine.distributed.sharding import ShardPlan
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.models.decoder import DecoderForCausalLM
from pagedkube.engine.gguf.packing import BLOCK_VALUES, PACKED_TYPES, pack_gguf
from pagedkube.engine.attention.backend import AttentionBackend
from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.gguf.reader import GGUFFile
from pagedkube.engine.gguf.weights import hf_name, hf_tensors, is_projection
from pagedkube.engine.quant.assemble import ProjectionWeights
from pagedkube.engine.quant.calibrate import MEMORY_FACTOR, KernelCalibration, Shape
from pagedkube.engine.quant.formats import dequantize
from pagedkube.engine.quant.linear import QuantLinear
from pagedkube.engine.quant.formats import Int8Weight
from pagedkube.engine.quant.packed_vocab import pack_vocab
from pagedkube.engine.quant.q4_fused import Q4Ops, q4_ext

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Used on CUDA when dtype is "auto" and the checkpoint does not say (the usual release dtype).
DEFAULT_CUDA_DTYPE = "bfloat16"
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # precomputed tables some old checkpoints carry
FLOAT_GGML_TYPES = ("F32", "F16", "BF16")


def resolve_dtype(requested: str, device: torch.device, cfg: ModelConfig) -> torch.dtype:
    """The activation (and KV cache) dtype. "auto":
    - CUDA: the checkpoint's torch_dtype (bfloat16 when it does not say; float16 without bf16);
    - CPU: float32, quantized weights or not, whatever the CPU's bf16 instructions. Measured on
      the default model (docs/benchmarks.md "Fidelity per component"): bf16 in the residual
      stream, the norms, the KV cache or the embeddings each costs greedy agreement with the
      float32 reference (0.86-0.94 alone, 0.64 with bf16 projection kernels), where the
      projections' exact float32 Q4 kernel (engine/quant/q4_fused.py) keeps it at 1.0.
      bf16 is faster on CPUs with native bf16, so it is asked for with dtype "bfloat16"
      rather than given silently."""
    if requested == "auto":
        if device.type == "cpu":
            return torch.float32
        name = cfg.torch_dtype or DEFAULT_CUDA_DTYPE
        if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            name = "float16"
        return DTYPES[name]
    if requested not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {requested!r}")
    return DTYPES[requested]


def resolve_kv_cache_dtype(requested: str, activation: torch.dtype, device: torch.device,
                           calibrated: bool) -> torch.dtype:
    """The KV cache's dtype. "auto": float16 on the CPU's exact packed path (packed projections
    whose kernels the calibration chooses, i.e. --quantization and --dtype both auto; float32
    activations; our float32 Q4 kernel built: the GGUF default), else the activation dtype.
    Measured on the default model, 32 quality chats x 32 greedy tokens against the float32
    reference (docs/benchmarks.md "A float16 KV cache"): on the exact path a float16 cache kept
    all 32 chats identical (|dlogprob| 0.0005) at half the bytes per token (bfloat16: 0.89);
    beside torch's bf16 projection kernels (no C++ toolchain) it moved agreement from 0.83 to
    0.72, so there the cache stays float32. Attention reads it in float32. The float path
    (--quantization none) keeps its activation dtype: exact with transformers. On CUDA the
    Triton kernels read the cache in the activation dtype: another one is refused."""
    if requested == "auto":
        exact_packed = (device.type == "cpu" and calibrated and activation == torch.float32
                        and q4_ext(cache_root()) is not None)
        return torch.float16 if exact_packed else activation
    if requested not in DTYPES:
        raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(DTYPES)}, got {requested!r}")
    dtype = DTYPES[requested]
    if device.type == "cuda" and dtype != activation:
        raise ValueError(f"kv_cache_dtype {requested} on CUDA must match the activation dtype ({activation}): "
                         "the Triton attention kernels read the cache as activations")
    return dtype


def resolve_quantization(requested: str, cfg: ModelConfig) -> str:
    """--quantization -> "none", "gguf" (a GGUF file's types as stored), "int8" or "int4".
    auto: the GGUF file's types as stored; a float checkpoint stays float."""
    if requested not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {requested!r}")
    if requested == "auto":
        return "gguf" if cfg.gguf_file is not None else "none"
    return requested


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

    def __init__(self, model: DecoderForCausalLM, cfg: ModelConfig, projections: ProjectionWeights | None,
                 shard: ShardPlan | None = None):
        """cfg: the config the model was built from (a rank's local one under tensor parallelism,
        whose ShardPlan `shard` cuts every checkpoint tensor first)."""
        self.model, self.cfg, self.projections, self.shard = model, cfg, projections, shard
        self.params = dict(model.named_parameters())        # tied lm_head appears once, as embed_tokens
        self.loaded: dict[str, int] = {name: 0 for name in self.params}   # rows loaded per parameter
        self.expected = {name: p.shape[0] for name, p in self.params.items()}
        self.fused = _fused_targets(cfg)
        self.has_lm_head = False

    def put(self, name: str, tensor, source: str, stored: str = "float") -> None:
        """tensor: a torch tensor, or a QuantizedWeight (a GGUF projection kept packed)."""
        if self.shard is not None:
            tensor, stored = self.shard.tensor(name, tensor, stored)
        if name == "lm_head.weight":
            self.has_lm_head = True
            if self.cfg.tie_word_embeddings:
                return                                      # tied: embed_tokens is the one copy
        dst, rows = _destination(name, self.fused)
        if self.projections is not None and dst in self.projections:
            self.projections.put(dst, rows, tensor, stored)
            return
        if not isinstance(tensor, torch.Tensor):
            tensor = dequantize(tensor)
        if dst not in self.params:
            raise ValueError(f"unexpected tensor {name!r} in {source} for a {self.cfg.architecture}")
        target = self.params[dst].data if rows is None else self.params[dst].data[rows]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        target.copy_(tensor)
        self.loaded[dst] += target.shape[0] if target.dim() else 1

    def finish(self, where: str) -> None:
        if not self.cfg.tie_word_embeddings and not self.has_lm_head and "lm_head.weight" in self.params:
            self.model.lm_head.weight = self.model.model.embed_tokens.weight  # Hugging Face ties when lm_head is absent
            self.loaded["lm_head.weight"] = self.expected["lm_head.weight"]
        missing = [n for n in self.params if self.loaded[n] != self.expected[n]]
        missing += self.projections.missing() if self.projections is not None else []
        if missing:
            raise ValueError(f"checkpoint in {where!r} lacks (or duplicates) tensors for {missing}")


def calibrated_shapes(f: GGUFFile, cfg: ModelConfig) -> tuple[Counter[Shape], int]:
    """(projection shape -> layers of it, the file's bytes of projection tensors) for the
    projections whose pieces all share one packed type (they stay packed, engine/quant/assemble.py)."""
    fused = _fused_targets(cfg)
    kinds: dict[str, set[str]] = {}
    file_bytes = 0
    sizes = f.tensor_bytes()
    for name, kind in f.tensor_types().items():
        if is_projection(name):
            dst, _ = _destination(hf_name(name), fused)
            kinds.setdefault(dst, set()).add(kind)
            file_bytes += sizes[name]
    counts: Counter[Shape] = Counter()
    for dst, types in kinds.items():
        stored = next(iter(types)) if len(types) == 1 else None
        if stored not in PACKED_TYPES:
            continue
        n, k = _projection_shape(dst, cfg)
        counts[Shape("int8" if stored == "Q8_0" else "int4", n, k, BLOCK_VALUES)] += 1
    return counts, file_bytes


def _projection_shape(name: str, cfg: ModelConfig) -> tuple[int, int]:
    """(out, in) of one of our projections, by its Hugging Face name."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    shapes = {"qkv_proj": (q + 2 * kv, h), "o_proj": (h, q), "gate_up_proj": (2 * inter, h), "down_proj": (h, inter)}
    return shapes[name.rsplit(".", 2)[-2]]


def load_model(cfg: ModelConfig, backend: AttentionBackend, device: torch.device, dtype: torch.dtype,
               max_positions: int, quantization: str = "none", gguf: GGUFFile | None = None,
               calibrate: bool = False, shard: ShardPlan | None = None) -> DecoderForCausalLM:
    """gguf: cfg.gguf_file already open (one parse serves the caller's checks and the load).
    calibrate: choose each packed projection's kernel by measurement (engine/quant/calibrate.py).
    shard: one tensor-parallel rank's part (engine/distributed/sharding.py); the model is then
    that rank's local decoder, before engine/distributed/layers.py's parallelize."""
    method = resolve_quantization(quantization, cfg)
    linear = nn.Linear if method == "none" else QuantLinear
    full_cfg, cfg = cfg, (shard.local if shard is not None else cfg)
    with torch.device("meta"):
        model = DecoderForCausalLM(cfg, backend, max_positions, device=device, linear=linear)
    # to_empty() without its empty_like: on meta tensors that runs torch's Python reference
    # kernels, whose first use imports sympy (~0.6 s of a start).
    model.to(dtype=dtype)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    if cfg.tie_word_embeddings:                          # to_empty() unties shared parameters
        model.lm_head.weight = model.model.embed_tokens.weight
    if cfg.gguf_file is not None and gguf is None:
        gguf = GGUFFile(cfg.gguf_file)
    calibration, fused = None, None
    if calibrate and method == "gguf" and device.type == "cpu" and gguf is not None:
        counts, file_bytes = calibrated_shapes(gguf, cfg)
        fused = q4_ext(cache_root()) if dtype == torch.float32 else None
        if counts:
            world = shard.world_size if shard is not None else 1
            calibration = KernelCalibration(counts, dtype, int(MEMORY_FACTOR * file_bytes) // world, cache_root(),
                                            fused=fused)
    projections = None if method == "none" else ProjectionWeights(model, method, dtype, device, calibration)
    # The vocabulary kept packed is placed before the load, which then skips it (never dequantized).
    packed_vocab = _pack_vocab(model, gguf, cfg, fused) if fused is not None and shard is None and gguf is not None \
        else frozenset()
    sink = _Sink(model, cfg, projections, shard)
    if gguf is not None:
        dequantized: Counter[str] = Counter()
        for t in hf_tensors(gguf, full_cfg, packed=method == "gguf", skip=packed_vocab):
            if isinstance(t.value, torch.Tensor) and t.ggml_type not in FLOAT_GGML_TYPES:
                dequantized[t.ggml_type] += 1
            sink.put(t.name, t.value, gguf.path.name, t.ggml_type)
        sink.finish(str(gguf.path))
        _log_gguf(gguf.path.name, method, dtype, dequantized, projections)
    else:
        for file in checkpoint_files(cfg.model_dir):
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if not name.endswith(IGNORED_SUFFIXES):   # a rank reads only its part (ShardPlan.tensor)
                        sink.put(name, f.get_slice(name) if shard is not None else f.get_tensor(name), file.name)
        sink.finish(cfg.model_dir)
    if projections is not None:
        log.info("quantization %s: projections run as %s", quantization if quantization != "auto" else
                 f"auto ({method})", dict(projections.kernels))
    model.eval()
    return model


def _pack_vocab(model: DecoderForCausalLM, gguf: GGUFFile, cfg: ModelConfig, ops: Q4Ops) -> frozenset[str]:
    """The embedding and lm_head as the file's Q8_0 blocks (engine/quant/packed_vocab.py), when
    the file stores them so, in place of the dense parameters; the GGUF names it placed."""
    types = gguf.tensor_types()
    lm_name = "output.weight" if "output.weight" in types and not cfg.tie_word_embeddings else None
    if types.get("token_embd.weight") != "Q8_0" or (lm_name is not None and types[lm_name] != "Q8_0"):
        return frozenset()
    raw = {t.name: t for t in gguf.tensors() if t.name in ("token_embd.weight", lm_name)}
    embed, lm_head = (None if name is None else pack_gguf(raw[name].raw, "Q8_0", raw[name].shape)
                      for name in ("token_embd.weight", lm_name))
    assert isinstance(embed, Int8Weight) and (lm_head is None or isinstance(lm_head, Int8Weight))
    pack_vocab(model, embed, lm_head, ops)
    log.info("%s: embeddings and lm_head kept as Q8_0 (%s), float32 arithmetic", gguf.path.name,
             "tied, one copy" if lm_head is None else "two tensors")
    return frozenset(name for name in ("token_embd.weight", lm_name) if name is not None)


def _log_gguf(file: str, method: str, dtype: torch.dtype, dequantized: Counter[str],
              projections: ProjectionWeights | None) -> None:
    """One line per stored type that the engine computes with dequantized, with a count."""
    dtype_name = str(dtype).removeprefix("torch.")
    for kind, count in sorted(dequantized.items()):
        if method == "none":
            why = f"to {dtype_name}: --quantization none"
        elif method != "gguf":
            why = f"(projections requantized as {method}; the rest to {dtype_name})"
        elif kind in PACKED_TYPES:
            why = f"to {dtype_name}: embeddings and lm_head, dense unless a line below says they stay packed"
        else:
            why = f"to {dtype_name}: no exact packed form"
        log.info("%s: %d %s tensor(s) dequantized %s", file, count, kind, why)
    mixed = projections.dequantized if projections is not None else Counter()
    for kind, count in sorted(mixed.items()):
        log.info("%s: %d %s tensor(s) dequantized to %s: fused with a piece of another format",
                 file, count, kind, dtype_name)

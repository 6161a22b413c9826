"""What the model runner needs from a Hugging Face model directory's config.json.

Torch-free: parsing a config must not pull in torch (the server validates flags
before it builds a model). One decoder class covers four families; the family
only decides a few flags (vLLM's llama.py does the same):

    family   q/k/v bias            o bias           q/k RMSNorm  head_dim
    llama    attention_bias        attention_bias   no           head_dim key or hidden/heads
    qwen2    always (implied)      no               no           hidden/heads
    qwen3    attention_bias        attention_bias   yes          head_dim key
    mistral  no                    no               no           head_dim key or hidden/heads

Both config spellings are read: transformers < 5 writes `rope_theta` and
`rope_scaling` at the top level and `torch_dtype`; transformers 5 writes a
`rope_parameters` dict (with `rope_theta` inside) and `dtype`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}
ROPE_TYPES = ("default", "linear", "llama3")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
DTYPE_NAMES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
               "bfloat16": "bfloat16"}


def check_hub_config(raw: dict[str, Any]) -> None:
    """A Hub repo's config.json, checked before its weights are downloaded: ValueError naming
    an architecture (or a setting) the engine does not implement."""
    ModelConfig.from_dict(raw, model_dir="config.json")


@dataclass(slots=True)
class ModelConfig:
    model_dir: str
    architecture: str
    family: str                      # llama | qwen2 | qwen3 | mistral
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str                   # default | linear | llama3
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # the type's parameters (factor, ...)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    sliding_window: int | None = None  # None = full attention in every layer
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None   # the checkpoint's dtype name, e.g. "bfloat16"
    gguf_file: str | None = None     # weights from this GGUF file (model_dir then holds its converted config/tokenizer)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        """A Hugging Face directory, or a GGUF file (its config and tokenizer converted once
        into a cache folder keyed by the file's sha256, engine/gguf/prepare.py)."""
        path = Path(model_dir)
        if path.is_file():
            from pagedkube.engine.gguf.prepare import gguf_model_dir

            converted = gguf_model_dir(path)
            cfg = cls.from_dict(json.loads((converted / "config.json").read_text()), model_dir=str(converted))
            cfg.gguf_file = str(path)
            return cfg
        if not path.is_dir():
            raise ValueError(f"model directory {str(path)!r} does not exist")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ValueError(f"model directory {str(path)!r} has no config.json")
        if not (path / "model.safetensors").is_file() and not (path / "model.safetensors.index.json").is_file():
            raise ValueError(f"model directory {str(path)!r} has no model.safetensors "
                             "(nor model.safetensors.index.json)")
        try:
            raw = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_file} is not valid JSON: {e}") from None
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
        return cls.from_dict(raw, model_dir=str(path), generation_config=gen)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], model_dir: str = "",
                  generation_config: dict[str, Any] | None = None) -> "ModelConfig":
        try:
            return cls._from_dict(raw, model_dir, generation_config or {})
        except KeyError as e:
            raise ValueError(f"config of {model_dir or 'the model'} lacks {e.args[0]!r}") from None

    @classmethod
    def _from_dict(cls, raw: dict[str, Any], model_dir: str, generation_config: dict[str, Any]) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"unsupported architecture {archs!r} in {model_dir or 'config'}; "
                             f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        family = SUPPORTED_ARCHITECTURES[arch]
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} (only 'silu' is implemented)")
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")
        head_dim = raw.get("head_dim")
        if head_dim is None or family == "qwen2":  # Qwen2 has no head_dim key
            head_dim = hidden // heads
        rope_theta, rope_type, rope_scaling = _parse_rope(raw)
        attention_bias = bool(raw.get("attention_bias", False))
        qkv_bias = {"qwen2": True, "mistral": False}.get(family, attention_bias)
        o_bias = {"qwen2": False, "mistral": False}.get(family, attention_bias)
        # Mistral uses its window; Qwen2/Qwen3 configs carry one they use only with use_sliding_window.
        uses_window = family == "mistral" or (family != "llama" and raw.get("use_sliding_window", False))
        sliding_window = raw.get("sliding_window") if uses_window else None
        return cls(
            model_dir=model_dir, architecture=arch, family=family,
            vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta, rope_type=rope_type, rope_scaling=rope_scaling,
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            sliding_window=int(sliding_window) if sliding_window else None,
            eos_token_ids=_eos_ids(raw, generation_config),
            torch_dtype=_dtype_name(raw.get("torch_dtype", raw.get("dtype"))),
        )

    def resolve_max_model_len(self, requested: int | None) -> int:
        """The context length the engine serves: `requested`, or the model's limit.

        A sliding-window model (Mistral) attends only to its last `sliding_window`
        tokens, which our attention does not implement; within the window, sliding and
        full attention are the same. So an unset max_model_len is capped at the window,
        and an explicit one beyond it is rejected.
        """
        limit = self.max_position_embeddings
        if requested is not None and requested > limit:
            raise ValueError(f"max_model_len {requested} exceeds the model's max_position_embeddings ({limit})")
        if self.sliding_window is not None and self.sliding_window < (requested or limit):
            if requested is not None:
                raise ValueError(f"max_model_len {requested} exceeds the model's sliding_window "
                                 f"({self.sliding_window}); sliding-window attention is not implemented, "
                                 f"so serve at most {self.sliding_window} tokens")
            return self.sliding_window
        return requested or limit

    def kv_bytes_per_block(self, block_size: int, dtype_bytes: int) -> int:
        """K and V of one block in every layer."""
        return 2 * self.num_hidden_layers * block_size * self.num_key_value_heads * self.head_dim * dtype_bytes


def _parse_rope(raw: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
    params = raw.get("rope_parameters")
    if params is not None and any(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    scaling = dict(params or raw.get("rope_scaling") or {})
    theta = float(scaling.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {list(ROPE_TYPES)}")
    if float(scaling.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if rope_type == "linear" and "factor" not in scaling:
        raise ValueError("rope type 'linear' needs a 'factor'")
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_ROPE_KEYS if k not in scaling]
        if missing:
            raise ValueError(f"rope type 'llama3' is missing {missing}")
        if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise ValueError("rope type 'llama3' needs high_freq_factor > low_freq_factor")
    if not (theta > 0 and math.isfinite(theta)):
        raise ValueError(f"rope_theta must be positive, got {theta}")
    return theta, rope_type, scaling


def _eos_ids(raw: dict[str, Any], gen: dict[str, Any]) -> list[int]:
    """generation_config.json wins (it is what `generate` stops on), then config.json."""
    eos = gen.get("eos_token_id", raw.get("eos_token_id"))
    if eos is None:
        return []
    return [int(e) for e in ([eos] if isinstance(eos, int) else eos) if e is not None]


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise ValueError(f"unsupported checkpoint dtype {value!r}; supported: {sorted(set(DTYPE_NAMES.values()))}")
    return DTYPE_NAMES[name]

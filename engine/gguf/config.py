"""GGUF metadata -> the config.json transformers builds for the same file.

The keys follow transformers' GGUF_CONFIG_MAPPING (integrations/ggml.py) for the two
architectures we serve; llama.cpp spells them `<arch>.<key>`:

    context_length -> max_position_embeddings      embedding_length -> hidden_size
    block_count -> num_hidden_layers               feed_forward_length -> intermediate_size
    attention.head_count(_kv) -> num_(key_value_)heads / num_attention_heads
    attention.layer_norm_rms_epsilon -> rms_norm_eps      rope.freq_base -> rope_theta
    rope.dimension_count -> head_dim (llama only; Qwen2's head_dim is hidden / heads)

As in transformers, the embeddings are tied exactly when the file has no output.weight,
and EOS/BOS come from tokenizer.ggml.*_token_id.
"""
from __future__ import annotations

from typing import Any

from pagedkube.engine.gguf.reader import GGUFFile

# general.architecture -> the Hugging Face class our decoder implements it as
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# llama.cpp's default when a file has no context_length (llama.cpp's n_ctx_train fallback)
DEFAULT_CONTEXT_LENGTH = 2048
KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}


def check_gguf_architecture(arch: str) -> None:
    """ValueError naming an architecture the engine does not implement."""
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(GGUF_ARCHITECTURES))}")


def gguf_config(f: GGUFFile) -> dict[str, Any]:
    arch = f.architecture
    try:
        check_gguf_architecture(arch)
    except ValueError as e:
        raise ValueError(f"{f.path.name}: {e}") from None
    meta = f.metadata
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{f.path.name}: unsupported GGUF rope scaling {scaling!r}")
    config: dict[str, Any] = {"architectures": [GGUF_ARCHITECTURES[arch]], "model_type": arch,
                              "hidden_act": "silu"}
    for key, name in KEYS.items():
        if f"{arch}.{key}" in meta:
            config[name] = meta[f"{arch}.{key}"]
    config.setdefault("max_position_embeddings", DEFAULT_CONTEXT_LENGTH)
    if "vocab_size" not in config:   # older files: the vocabulary's length
        config["vocab_size"] = len(meta.get("tokenizer.ggml.tokens") or [])
    if arch == "llama" and f"{arch}.rope.dimension_count" in meta:
        config["head_dim"] = meta[f"{arch}.rope.dimension_count"]
    names = {t.name for t in f.tensors()}
    config["tie_word_embeddings"] = "output.weight" not in names
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in names
    for token in ("bos", "eos", "pad"):
        value = meta.get(f"tokenizer.ggml.{token}_token_id" if token != "pad" else "tokenizer.ggml.padding_token_id")
        if value is not None:
            config[f"{token}_token_id"] = int(value)
    missing = [n for n in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
               if n not in config]
    if missing:
        raise ValueError(f"{f.path.name}: GGUF metadata lacks {[k for k, v in KEYS.items() if v in missing]} "
                         f"for architecture {arch!r}")
    return config

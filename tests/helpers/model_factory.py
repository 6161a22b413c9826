"""Random tiny Hugging Face model directories, one per supported family.

Each family exercises its own feature (the reason it is in the list):

    llama    GQA (4 q heads, 2 kv heads), untied lm_head, llama3 rope_scaling
    qwen2    q/k/v biases (random, not HF's zero init), tied embeddings
    qwen3    q/k RMSNorm, explicit head_dim (32 != hidden / heads)
    mistral  one kv head (MQA), sliding_window smaller than max_position_embeddings

Weights are drawn with a fixed torch seed and every norm weight and bias is
perturbed away from HF's ones/zeros init, so a loader that drops them fails the
logits comparison. Saved in float32 with safetensors. When the built-in tiny
model exists, its tokenizer files are copied in (vocab_size is made to cover
them); tests can also feed token ids directly.

    path = make_tiny_model("qwen2", tmp_path / "qwen2")
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
BUILTIN_TINY = Path(__file__).resolve().parents[2] / "pagedkube" / "builtin" / "tiny"

_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-6,
               initializer_range=0.1, bos_token_id=1, eos_token_id=2)


def family_config(family: str, **overrides: Any):
    import transformers as tf
    if family == "llama":
        kw = dict(num_key_value_heads=2, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
        cls = tf.LlamaConfig
    elif family == "qwen2":
        kw = dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1_000_000.0)
        cls = tf.Qwen2Config
    elif family == "qwen3":
        kw = dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
        cls = tf.Qwen3Config
    elif family == "mistral":
        kw = dict(num_key_value_heads=1, head_dim=16, sliding_window=256, tie_word_embeddings=False)
        cls = tf.MistralConfig
    else:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    return cls(**{**_COMMON, **kw, **overrides})


def make_tiny_model(family: str, path: str | Path, *, seed: int = 0, max_shard_size: str | None = None,
                    **overrides: Any) -> Path:
    """Save a random tiny `family` model to `path`; max_shard_size (e.g. "40KB") shards it."""
    import transformers as tf
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = BUILTIN_TINY if (BUILTIN_TINY / "tokenizer.json").is_file() else None
    if tokenizer_dir is not None and "vocab_size" not in overrides:
        from tokenizers import Tokenizer
        vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        overrides["vocab_size"] = max(_COMMON["vocab_size"], vocab)
    config = family_config(family, **overrides)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy(tokenizer_dir / name, path / name)
    return path


def load_hf_model(path: str | Path):
    """The Hugging Face reference in float32 with eager attention."""
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()

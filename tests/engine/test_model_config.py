"""ModelConfig parsing from config.json dicts in both transformers spellings (no torch)."""
from __future__ import annotations

import sys

import pytest

from pagedkube.engine.model_config import ModelConfig

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100, max_position_embeddings=1024)


def parse(arch: str, **extra) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": [arch], **BASE, **extra}, model_dir="m")


def test_family_flags():
    qwen2 = parse("Qwen2ForCausalLM", sliding_window=32, use_sliding_window=False)
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm, qwen2.head_dim, qwen2.sliding_window) == (
        True, False, False, 16, None)
    qwen3 = parse("Qwen3ForCausalLM", head_dim=32, attention_bias=False)
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim) == (False, True, 32)
    llama = parse("LlamaForCausalLM", attention_bias=True)
    assert (llama.qkv_bias, llama.o_bias, llama.head_dim) == (True, True, 16)
    mistral = parse("MistralForCausalLM", head_dim=8, sliding_window=4096)
    assert (mistral.qkv_bias, mistral.head_dim, mistral.sliding_window) == (False, 8, 4096)


def test_rope_spellings():
    old = parse("LlamaForCausalLM", rope_theta=500000.0, torch_dtype="bfloat16", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    new = parse("LlamaForCausalLM", dtype="bfloat16", rope_parameters={
        "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    assert old == new
    assert (old.rope_theta, old.rope_type, old.rope_scaling["factor"], old.torch_dtype) == (
        500000.0, "llama3", 8.0, "bfloat16")
    legacy_type = parse("LlamaForCausalLM", rope_scaling={"type": "linear", "factor": 2.0})
    assert (legacy_type.rope_type, legacy_type.rope_scaling) == ("linear", {"factor": 2.0})
    assert parse("LlamaForCausalLM", rope_scaling=None).rope_type == "default"


@pytest.mark.parametrize("bad, message", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "unsupported rope type 'yarn'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "missing"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(num_key_value_heads=3), "multiple"),
    (dict(torch_dtype="int8"), "dtype"),
])
def test_bad_configs(bad, message):
    with pytest.raises(ValueError, match=message):
        parse("LlamaForCausalLM", **bad)


def test_unsupported_architecture_and_missing_key():
    with pytest.raises(ValueError, match=r"'GPTNeoXForCausalLM'.*supported.*Qwen3ForCausalLM"):
        parse("GPTNeoXForCausalLM")
    with pytest.raises(ValueError, match="lacks 'vocab_size'"):
        ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], **{k: v for k, v in BASE.items()
                                                                          if k != "vocab_size"}})


def test_eos_ids_prefer_generation_config():
    raw = {"architectures": ["LlamaForCausalLM"], **BASE, "eos_token_id": 2}
    assert ModelConfig.from_dict(raw).eos_token_ids == [2]
    assert ModelConfig.from_dict(raw, generation_config={"eos_token_id": [7, 8]}).eos_token_ids == [7, 8]


def test_parsing_imports_no_torch():
    import subprocess
    code = ("import sys; from pagedkube.engine.model_config import ModelConfig; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)

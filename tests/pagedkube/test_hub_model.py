"""Hub model names and the files the engine reads of a repo (pagedkube/hub_model.py): no network."""
from __future__ import annotations

import pytest

from pagedkube.hub_model import HubFiles, HubModel, choose_files, gguf_architecture, parse_hub_model, quant_matches
from pagedkube.model_source import model_name

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
CHECKPOINT = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "model.safetensors", "README.md", ".gitattributes", "onnx/model.onnx"]
SHARDED = ["config.json", "tokenizer.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
           "model-00002-of-00002.safetensors", "consolidated.safetensors", "params.json"]
GGUF_REPO = ["README.md", "smollm2.Q4_K_M.gguf", "smollm2.Q4_K_S.gguf", "smollm2.Q4_K.gguf", "smollm2-q8_0.gguf",
             "Q6_K/smollm2-Q6_K-00001-of-00002.gguf"]


@pytest.mark.parametrize("name, parsed", [
    (QWEN, HubModel(QWEN)),
    (f"hf://{QWEN}", HubModel(QWEN)),
    (f"hf://{QWEN}@v1.0", HubModel(QWEN, revision="v1.0")),
    (f"{QWEN}@0123456789abcdef0123456789abcdef01234567", HubModel(QWEN, revision="0123456789abcdef0123456789abcdef01234567")),
    ("unsloth/Qwen3-0.6B-GGUF:Q4_K_M", HubModel("unsloth/Qwen3-0.6B-GGUF", quant="Q4_K_M")),
    ("hf.co/unsloth/Qwen3-0.6B-GGUF:UD-Q4_K_XL", HubModel("unsloth/Qwen3-0.6B-GGUF", quant="UD-Q4_K_XL")),
    ("org/repo/model.Q8_0.gguf@main", HubModel("org/repo", revision="main", filename="model.Q8_0.gguf")),
])
def test_hub_names_parse_as_vllm_llama_cpp_and_ollama_write_them(name: str, parsed: HubModel) -> None:
    assert parse_hub_model(name) == parsed


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "builtin://tiny", "model.gguf", "org/repo/x.bin",
                                  "org/../etc", "/abs/path", "org/repo:", "hf://org"])
def test_what_is_not_a_hub_name(name: str) -> None:
    assert parse_hub_model(name) is None


def test_the_served_name_is_the_repo_id_with_the_quant_or_file_and_never_fetches() -> None:
    assert model_name(f"hf://{QWEN}@main") == QWEN
    assert model_name("org/repo:Q4_K_M") == "org/repo:Q4_K_M"
    assert model_name("org/repo/a.gguf") == "org/repo/a.gguf"


def test_a_checkpoint_repo_fetches_config_tokenizer_and_weights_only() -> None:
    assert choose_files(HubModel(QWEN), CHECKPOINT) == HubFiles((
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"))
    assert choose_files(HubModel("mistralai/M"), SHARDED).paths == (
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer.json")   # never consolidated.safetensors


@pytest.mark.parametrize("quant, file", [("Q4_K_M", "smollm2.Q4_K_M.gguf"), ("q4_k_s", "smollm2.Q4_K_S.gguf"),
                                         ("Q4_K", "smollm2.Q4_K.gguf"), ("Q8_0", "smollm2-q8_0.gguf")])
def test_a_quant_picks_the_one_file_whose_name_carries_that_whole_tag(quant: str, file: str) -> None:
    assert choose_files(HubModel("o/r", quant=quant), GGUF_REPO) == HubFiles((file,), file)


def test_a_gguf_repo_without_a_quant_takes_q4_k_m_as_llama_cpp_does() -> None:
    assert choose_files(HubModel("o/r"), GGUF_REPO).gguf == "smollm2.Q4_K_M.gguf"
    assert choose_files(HubModel("o/r"), ["only.Q2_K.gguf"]).gguf == "only.Q2_K.gguf"


def test_what_a_repo_lacks_is_named_with_what_it_has() -> None:
    with pytest.raises(ValueError, match=r"^o/r has no GGUF file for Q5_K; name one of smollm2-q8_0.gguf, "):
        choose_files(HubModel("o/r", quant="Q5_K"), GGUF_REPO)
    with pytest.raises(ValueError, match=r"^o/r has no file 'x.gguf'; its GGUF files: smollm2-q8_0.gguf"):
        choose_files(HubModel("o/r", filename="x.gguf"), GGUF_REPO)
    with pytest.raises(ValueError, match=r"^2 GGUF files of o/r match Q4_0: a.Q4_0.gguf, b.Q4_0.gguf; name one"):
        choose_files(HubModel("o/r", quant="Q4_0"), ["a.Q4_0.gguf", "b.Q4_0.gguf"])
    with pytest.raises(ValueError, match=r"^o/r holds neither a safetensors checkpoint"):
        choose_files(HubModel("o/r"), ["README.md", "pytorch_model.bin", "config.json"])


def test_quant_tags_match_whole() -> None:
    assert quant_matches("m.Q4_K_M.gguf", "q4_k_m") and not quant_matches("m.Q4_K_M.gguf", "Q4_K")
    assert not quant_matches("m.IQ4_XS.gguf", "Q4_XS") and quant_matches("m-IQ4_XS.gguf", "iq4_xs")


def test_a_gguf_names_its_architecture_in_its_first_bytes(tmp_path) -> None:
    from gguf_factory import write_tiny_gguf

    data = write_tiny_gguf(tmp_path / "t.gguf", "qwen2", "Q8_0").read_bytes()
    assert gguf_architecture(data[:4096]) == "qwen2"
    assert gguf_architecture(data[:40]) is None          # cut before the value: unknown, not an error
    with pytest.raises(ValueError, match="no GGUF magic"):
        gguf_architecture(b"\x00" * 64)

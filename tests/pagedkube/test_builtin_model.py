"""The built-in tiny model (docs/design.md "Models"): a complete, small Hugging Face
directory that transformers loads, that answers a pet-care question in English,
and whose tokenizer and chat template pagedkube reproduces exactly."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pagedkube.builtin import BUILTIN_MODELS, TINY, builtin_model_dir, resolve_model
from pagedkube.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "scripts" / "data" / "petcare_corpus.txt"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json", "README.md")
MAX_DIR_BYTES = 10 * 1024 * 1024  # the budget for the built-in model
CONVERSATION = [
    {"role": "system", "content": "You are a friendly pet-care assistant."},
    {"role": "user", "content": "My dog is limping. What should I do?"},
    {"role": "assistant", "content": "Check the paw for thorns, and rest your dog."},
    {"role": "user", "content": "Café crème? Ünïcode 🐶 and  two  spaces\nnew line."},
]
TEXTS = [
    "How often should I walk my puppy?",
    "  leading spaces, trailing space ",
    "<|im_start|>user\nhi<|im_end|>\n",          # special tokens stay single ids
    "naïve résumé 🐕 — dog’s \t tab\r\n",        # bytes outside the corpus still encode
    "MY DOG'S 2 PUPPIES, aged 10 and 12 weeks, ate 350g!",  # Qwen2 splits digits, any-case 's
    "one\n\n\ntwo   \n  three\t\n",              # runs of whitespace and newlines
    "",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return builtin_model_dir()


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


def corpus_words() -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]+", CORPUS.read_text(encoding="utf-8"))}


def test_directory_is_complete_and_small(model_dir):
    assert model_dir.is_dir()
    for name in MODEL_FILES:
        assert (model_dir / name).is_file(), name
    total = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
    assert total <= MAX_DIR_BYTES, total
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert config["torch_dtype"] == "float32"


def test_special_tokens_and_eos_ids(model_dir):
    tok = Tokenizer.from_pretrained(model_dir)
    ids = {t: tok.encode(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert ids == {"<|endoftext|>": [0], "<|im_start|>": [1], "<|im_end|>": [2]}
    assert tok.eos_token_ids == [2, 0]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    config = json.loads((model_dir / "config.json").read_text())
    assert tok.vocab_size == config["vocab_size"]


def test_pagedkube_tokenizer_matches_transformers(model_dir, hf_tokenizer):
    tok = Tokenizer.from_pretrained(model_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_tokenizer.encode(text), text
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_start|>user\nhi<|im_end|>\n") == [1, *tok.encode("user\nhi"), 2, *tok.encode("\n")]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_rendering_matches_transformers(model_dir, hf_tokenizer, add_generation_prompt):
    tok = Tokenizer.from_pretrained(model_dir)
    rendered = tok.render_chat(CONVERSATION, add_generation_prompt=add_generation_prompt)
    expected = hf_tokenizer.apply_chat_template(CONVERSATION, tokenize=False,
                                                add_generation_prompt=add_generation_prompt)
    assert rendered == expected
    assert rendered.startswith("<|im_start|>system\nYou are a friendly pet-care assistant.<|im_end|>\n"
                               "<|im_start|>user\nMy dog is limping.")
    assert rendered.endswith("<|im_start|>assistant\n" if add_generation_prompt else "new line.<|im_end|>\n")
    expected_ids = hf_tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True,
                                                    add_generation_prompt=add_generation_prompt)["input_ids"]
    assert tok.encode_chat(CONVERSATION, add_generation_prompt=add_generation_prompt) == list(expected_ids)


def test_answers_a_petcare_question_in_english(model_dir, hf_model, hf_tokenizer):
    torch = pytest.importorskip("torch")
    tok = Tokenizer.from_pretrained(model_dir)
    prompt_ids = tok.encode_chat([{"role": "user", "content": "How often should I walk my puppy?"}])
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=48, do_sample=False)
    answer = tok.decode(out[0, len(prompt_ids):].tolist())
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", answer)]
    assert len(words) >= 10, answer
    known = corpus_words()
    assert sum(w in known for w in words) / len(words) >= 0.8, answer
    assert {"walk", "walks", "walking", "puppy", "minutes"} & set(words), answer  # on topic


def test_resolve_model_builtin_names(model_dir):
    assert BUILTIN_MODELS == (TINY,) == ("tiny",)
    assert model_dir.name == "tiny" and model_dir.parent.name == "builtin"
    assert resolve_model(None) == model_dir
    assert resolve_model("") == model_dir
    assert resolve_model("builtin://tiny") == model_dir
    with pytest.raises(ValueError, match="unknown built-in model 'huge'"):
        resolve_model("builtin://huge")


def test_resolve_model_paths(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path / "m")) == tmp_path / "m"
    assert resolve_model(tmp_path / "m") == tmp_path / "m"
    monkeypatch.chdir(tmp_path)
    assert resolve_model("m") == tmp_path / "m"  # relative paths come back absolute
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ValueError, match="got int"):
        resolve_model(3)

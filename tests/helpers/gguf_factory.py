"""Tiny random GGUF files, written with the `gguf` package's writer as llama.cpp's converter would.

    write_tiny_gguf(path, "llama", "Q4_0")   # every 2-D weight in Q4_0, norms (and biases) F32

Weights are random (seeded); the tokenizer is the built-in tiny model's byte-level BPE
(pagedkube/builtin/tiny/tokenizer.json) stored as llama.cpp stores one: token list, token
types (3 = control for the special tokens), merges, tokenizer.ggml.pre. For the llama
architecture the q/k rows are permuted as convert_hf_to_gguf.py's LlamaModel.permute does.

Types the writer can quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, BF16) go through
gguf.quants.quantize; the k-quants (Q4_K, Q5_K, Q6_K), which gguf can only dequantize,
get random blocks with sane fp16 scales, which is still a valid file of that type.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from model_factory import BUILTIN_TINY

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# hidden 256: k-quant blocks hold 256 values, so every row is whole blocks
TINY = dict(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, context=512)
# byte offsets of the fp16 scale(s) in one block of each k-quant (ggml-common.h block_q*_K)
K_SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
K_TYPES = tuple(K_SCALE_OFFSETS)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(gguf, values: np.ndarray, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
        return values.astype(np.float32), None
    if kind == "F16":
        return values.astype(np.float16), None
    if kind in K_TYPES:
        block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        rows, cols = values.shape
        blocks = rng.integers(0, 256, size=(rows, cols // block_values, block_bytes), dtype=np.uint8)
        for offset in K_SCALE_OFFSETS[kind]:
            scale = rng.uniform(0.001, 0.01, size=(rows, cols // block_values)).astype(np.float16)
            blocks[:, :, offset:offset + 2] = scale.view(np.uint8).reshape(rows, cols // block_values, 2)
        return blocks.reshape(rows, -1), qtype
    return gguf.quants.quantize(values.astype(np.float32), qtype), qtype


def tokenizer_metadata() -> dict:
    tok = json.loads((BUILTIN_TINY / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return dict(tokens=tokens, types=[3 if t in special else 1 for t in tokens], merges=merges,
                eos=vocab["<|im_end|>"], bos=vocab["<|endoftext|>"])


def write_tiny_gguf(path: Path, arch: str, kind: str, seed: int = 0, tie: bool = True) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    t = tokenizer_metadata()
    c = TINY
    head_dim = c["hidden"] // c["heads"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{kind}")
    w.add_context_length(c["context"])
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["intermediate"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(len(t["tokens"]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(t["tokens"])
    w.add_token_types(t["types"])
    w.add_token_merges(t["merges"])
    w.add_bos_token_id(t["bos"])
    w.add_eos_token_id(t["eos"])
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32)

    def put(name: str, values: np.ndarray, matrix_kind: str | None = None) -> None:
        data, qtype = _encode(gguf, values, matrix_kind or "F32", rng)
        w.add_tensor(name, data, raw_dtype=qtype)

    hidden, inter, q, kv = c["hidden"], c["intermediate"], c["heads"] * head_dim, c["kv_heads"] * head_dim
    put("token_embd.weight", matrix(len(t["tokens"]), hidden), kind)
    for i in range(c["layers"]):
        wq, wk = matrix(q, hidden), matrix(kv, hidden)
        if arch == "llama":
            wq, wk = _permute(wq, c["heads"]), _permute(wk, c["kv_heads"])
        put(f"blk.{i}.attn_norm.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32))
        put(f"blk.{i}.attn_q.weight", wq, kind)
        put(f"blk.{i}.attn_k.weight", wk, kind)
        put(f"blk.{i}.attn_v.weight", matrix(kv, hidden), kind)
        if arch == "qwen2":
            for name, size in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                put(f"blk.{i}.{name}.bias", rng.normal(0, 0.05, size).astype(np.float32))
        put(f"blk.{i}.attn_output.weight", matrix(hidden, q), kind)
        put(f"blk.{i}.ffn_norm.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32))
        put(f"blk.{i}.ffn_gate.weight", matrix(inter, hidden), kind)
        put(f"blk.{i}.ffn_up.weight", matrix(inter, hidden), kind)
        put(f"blk.{i}.ffn_down.weight", matrix(hidden, inter), kind)
    put("output_norm.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    if not tie:
        put("output.weight", matrix(len(t["tokens"]), hidden), kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

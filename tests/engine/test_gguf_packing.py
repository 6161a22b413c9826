"""GGUF blocks served as they are: Q8_0 -> Int8Weight, Q4_0/Q4_1/Q4_K -> Int4Weight.

For every packed type, on tensors written here (gguf.quants.quantize writes Q8_0/Q4_0/Q4_1;
Q4_K blocks are random bytes with finite fp16 d/dmin), formats.dequantize of our packed
weight equals gguf.quants.dequantize of the same bytes exactly (torch.equal), and so do
llama's un-permuted q/k rows and fused q|k|v pieces. Then a tiny GGUF model served with
--quantization auto runs its projections packed, and its weights and greedy tokens are
the dequantized (--quantization none) model's.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gguf_factory import write_tiny_gguf
from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.gguf.packing import PACKED_TYPES, pack_gguf
from pagedkube.engine.gguf.reader import GGUFTensor
from pagedkube.engine.gguf.weights import to_hf, unpermute_rows
from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, dequantize
from pagedkube.engine.quant.linear import QuantLinear
from pagedkube.engine.quant.quantize import concat_rows

gguf = pytest.importorskip("gguf")
SHAPES = [(32, 256), (48, 512), (16, 768)]    # rows x cols; cols whole Q4_K blocks (256)


def _stored(kind: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """The bytes a file holds for a [rows, cols] matrix of this type."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[kind]
    rows, cols = shape
    if kind != "Q4_K":
        values = rng.normal(0, 0.05, size=shape).astype(np.float32)
        values[0, :32] = 0.0                                 # an all-zero block (d = 0)
        values[1, :32] = np.linspace(-1, 1, 32)              # a block using the full code range
        return gguf.quants.quantize(values, qtype)
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block_values, block_bytes), dtype=np.uint8)
    for offset in (0, 2):                                    # d and dmin: finite fp16, either sign
        scale = (rng.uniform(0.0005, 0.02, size=blocks.shape[:2]) * rng.choice([-1, 1], size=blocks.shape[:2]))
        blocks[:, :, offset:offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def _reference(raw: np.ndarray, kind: str, shape) -> torch.Tensor:
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(shape))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_packed_blocks_dequantize_exactly_as_gguf(kind, shape):
    raw = _stored(kind, shape, seed=PACKED_TYPES.index(kind))
    w = pack_gguf(raw, kind, shape)
    assert isinstance(w, Int8Weight if kind == "Q8_0" else Int4Weight)
    assert w.shape == shape and w.group_size == 32
    assert torch.equal(dequantize(w), _reference(raw, kind, shape))


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_llama_qk_rows_unpermute_as_packed_rows(kind):
    """to_hf's packed path moves whole rows: equal to un-permuting the dequantized matrix."""
    shape, heads = (64, 256), 4
    raw = _stored(kind, shape, seed=7)
    cfg = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=2)   # what to_hf reads
    tensor = GGUFTensor(name="blk.0.attn_q.weight", ggml_type=kind, shape=shape, raw=raw)
    packed = to_hf(tensor, cfg, "llama", packed=True)
    dense = to_hf(tensor, cfg, "llama", packed=False)
    assert packed.name == dense.name == "model.layers.0.self_attn.q_proj.weight"
    assert not isinstance(packed.value, torch.Tensor)
    expected = torch.from_numpy(unpermute_rows(_reference(raw, kind, shape).numpy(), heads).copy())
    assert torch.equal(dequantize(packed.value), expected)
    assert torch.equal(dense.value, expected)


def test_fused_pieces_concatenate_rows_only_when_formats_match():
    q, k = (pack_gguf(_stored("Q4_1", s, seed=i), "Q4_1", s) for i, s in enumerate([(32, 256), (16, 256)]))
    fused = concat_rows([q, k])
    assert torch.equal(dequantize(fused), torch.cat([dequantize(q), dequantize(k)]))
    assert concat_rows([q, pack_gguf(_stored("Q8_0", (16, 256), 3), "Q8_0", (16, 256))]) is None


def _llm(path, quantization):
    return LLM(str(path), device="cpu", dtype="float32", attention_backend="torch", num_kv_blocks=64,
               block_size=4, quantization=quantization)


def _dense_projections(llm) -> dict[str, torch.Tensor]:
    """Every projection's weight as float32 (dequantized from its kernel's layout when packed)."""
    out = {}
    for name, m in llm.engine.runner.model.named_modules():
        if isinstance(m, QuantLinear):
            out[name] = m.kernel.weight if m.kernel.name == "dense" else m(torch.eye(m.in_features)).T
        elif isinstance(m, torch.nn.Linear) and name != "lm_head":
            out[name] = m.weight.data
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K", "Q8_0", "Q6_K"])
def test_tiny_gguf_served_as_stored(tmp_path, kind, caplog):
    path = write_tiny_gguf(tmp_path / f"llama-{kind}.gguf", "llama", kind, seed=3)
    with caplog.at_level(logging.INFO, logger="pagedkube.engine.loader"):
        packed = _llm(path, "auto")
    reference = _llm(path, "none")
    layers = {n: m for n, m in packed.engine.runner.model.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 4 * 2                                  # qkv, o, gate_up, down x 2 layers
    expected_kernel = {"Q4_1": "int4pack", "Q4_K": "int4pack", "Q8_0": "dense", "Q6_K": "dense"}[kind]
    assert {m.kernel.name for m in layers.values()} == {expected_kernel}
    assert {m.source for m in layers.values()} == {kind}
    logged = [r.getMessage() for r in caplog.records]
    if kind == "Q6_K":                                          # no exact packed form: said, with a count
        assert any(f"15 Q6_K tensor(s) dequantized to float32: no exact packed form" in m for m in logged), logged
    else:                                                       # only the embeddings
        assert any(f"1 {kind} tensor(s) dequantized to float32: embeddings" in m for m in logged), logged
    ours, ref = _dense_projections(packed), _dense_projections(reference)
    assert sorted(ours) == sorted(ref)
    for name in ref:   # the int4 kernel runs in bf16 (scale, zero, output): a read-back within bf16 rounding
        tol = 0 if expected_kernel == "dense" else 2 ** -6 * ref[name].abs().max().item()
        torch.testing.assert_close(ours[name], ref[name], atol=tol, rtol=0)
    prompts = [[5, 9, 13, 200, 7], [300, 1, 2, 3, 4, 5, 6, 7, 8]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ids = [o.outputs[0].token_ids for o in packed.generate(prompts, greedy)]
    assert all(len(t) == 6 for t in ids)
    if expected_kernel == "dense":                              # fp32 dense: the same numbers as the reference
        assert ids == [o.outputs[0].token_ids for o in reference.generate(prompts, greedy)]


def test_bad_quantization_is_a_value_error_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"quantization must be one of \('auto', 'none', 'int8', 'int4'\)"):
        LLM("builtin://tiny", device="cpu", quantization="fp8")

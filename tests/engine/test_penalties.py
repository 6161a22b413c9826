"""Repetition / presence / frequency penalties and logit bias (engine/penalties.py).

The repetition penalty is checked against Hugging Face's own processor and its
greedy generate, token for token; the OpenAI penalties against their formula.
"""
from __future__ import annotations

import pytest
import torch

from model_factory import load_hf_model, make_tiny_model
from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.penalties import apply_penalties
from pagedkube.engine.sequence import Sequence

VOCAB = 64


def _seq(prompt: list[int], output: list[int], **params) -> Sequence:
    seq = Sequence("r", prompt, SamplingParams(**params))
    for t in output:
        seq.append_token(t)
    return seq


def test_repetition_penalty_matches_hugging_face_processor():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    torch.manual_seed(0)
    logits = torch.randn(2, VOCAB)
    seqs = [_seq([1, 2, 3, 2], [5, 9], repetition_penalty=1.7), _seq([4, 4], [], repetition_penalty=0.6)]
    ours = apply_penalties(logits, seqs)
    for row, seq in enumerate(seqs):
        hf = RepetitionPenaltyLogitsProcessor(seq.params.repetition_penalty)
        expected = hf(torch.tensor([seq.token_ids]), logits[row:row + 1].clone())[0]
        assert torch.equal(ours[row], expected)


def test_presence_frequency_and_bias_follow_their_formulas():
    logits = torch.zeros(3, VOCAB)
    seqs = [_seq([7, 7], [3, 3, 3, 8], frequency_penalty=0.5),
            _seq([7, 7], [3, 3, 3, 8], presence_penalty=1.5),
            _seq([1], [], logit_bias={11: 42.0, 12: -3.0})]
    out = apply_penalties(logits, seqs)
    assert out[0, 3] == -1.5 and out[0, 8] == -0.5 and out[0, 7] == 0    # the prompt does not count
    assert out[1, 3] == -1.5 and out[1, 8] == -1.5 and out[1, 7] == 0
    assert out[2, 11] == 42 and out[2, 12] == -3 and out[2].abs().sum() == 45
    assert torch.equal(logits, torch.zeros(3, VOCAB)), "the input is left alone"
    assert apply_penalties(logits, [_seq([1], []), _seq([1], []), _seq([1], [])]) is logits


@pytest.mark.parametrize("bad", [dict(repetition_penalty=0), dict(presence_penalty=2.5),
                                 dict(frequency_penalty=-3), dict(logit_bias={"x": 1}),
                                 dict(logit_bias={5: 101})])
def test_bad_penalties_are_value_errors(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_greedy_with_repetition_penalty_equals_hugging_face(tiny):
    prompt = [5, 17, 5, 17, 5, 17, 42]
    hf = load_hf_model(tiny)
    with torch.inference_mode():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.3,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        plain = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    llm = LLM(str(tiny), device="cpu", dtype="float32", block_size=4, num_kv_blocks=32, attention_backend="torch")
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                repetition_penalty=1.3))[0]
    assert out.outputs[0].token_ids == expected
    assert expected != plain, "the penalty must change something for this test to mean anything"


def test_logit_bias_forces_a_token(tiny):
    llm = LLM(str(tiny), device="cpu", dtype="float32", block_size=4, num_kv_blocks=32, attention_backend="torch")
    out = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                   logit_bias={77: 100.0}))[0]
    assert out.outputs[0].token_ids == [77] * 5
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate([[3, 4, 5]], SamplingParams(logit_bias={10 ** 6: 1.0}))

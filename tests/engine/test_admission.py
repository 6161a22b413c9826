"""The one admission check (engine/admission.py), as the scheduler and the server use it."""
from __future__ import annotations

import pytest

from pagedkube.engine.admission import AdmissionError, AdmissionLimits, allowed_max_tokens

LIMITS = AdmissionLimits(max_model_len=64, num_kv_blocks=4, block_size=4)   # a 16-token pool


@pytest.mark.parametrize("prompt, requested, allowed", [
    (10, 7, 7),          # 16 KV tokens: exactly 4 blocks
    (10, None, 7),       # all the room the pool leaves (the last token needs no KV)
    (16, None, 1),
    (1, 1, 1),
])
def test_allowed(prompt, requested, allowed):
    assert allowed_max_tokens(LIMITS, prompt, requested) == allowed


@pytest.mark.parametrize("prompt, requested, param, message", [
    (0, 1, "prompt", "empty"),
    (64, None, "prompt", "shorter than max_model_len"),
    (10, 8, "max_tokens", "needs 5 KV blocks but the pool has only 4"),
    (17, None, "prompt", "needs 5 KV blocks"),
])
def test_rejected_with_reason_and_field(prompt, requested, param, message):
    with pytest.raises(AdmissionError, match=message) as info:
        allowed_max_tokens(LIMITS, prompt, requested)
    assert info.value.param == param
    assert isinstance(info.value, ValueError)


def test_context_length_names_the_fields():
    roomy = AdmissionLimits(max_model_len=32, num_kv_blocks=100, block_size=16)
    with pytest.raises(AdmissionError, match=r"messages \(30 tokens\) \+ max_completion_tokens \(5\) exceeds") as e:
        allowed_max_tokens(roomy, 30, 5, prompt_field="messages", tokens_field="max_completion_tokens")
    assert e.value.param == "max_completion_tokens"
    assert allowed_max_tokens(roomy, 30, None) == 2

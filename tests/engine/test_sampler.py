"""Sampler: exact tokens for greedy/truncation, seeded draws independent of the batch,
raw logprobs, min_tokens masking."""
from __future__ import annotations

import math

import pytest
import torch

from pagedkube.engine.sampler import Sampler
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.sequence import Sequence

EOS = 2
VOCAB = 50


def make_seq(num_output_tokens: int = 0, sample_index: int = 0, **params) -> Sequence:
    seq = Sequence(request_id="r", prompt_token_ids=[5, 6, 7], params=SamplingParams(**params),
                   sample_index=sample_index)
    for _ in range(num_output_tokens):
        seq.append_token(9)
    return seq


def make_sampler(seed: int = 0) -> Sampler:
    return Sampler(eos_token_ids=[EOS], generator=torch.Generator().manual_seed(seed))


def random_logits(rows: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def tokens(outputs) -> list[int]:
    return [o.token_id for o in outputs]


def test_greedy_is_argmax():
    logits = random_logits(4)
    out = make_sampler()(logits, [make_seq(temperature=0.0) for _ in range(4)])
    assert tokens(out) == logits.argmax(-1).tolist()
    assert all(o.logprob is None and o.top_logprobs is None for o in out)


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)],
                         ids=["top_k=1", "top_p=tiny", "min_p=1"])
def test_truncation_to_one_token_equals_greedy(params):
    logits = random_logits(16, seed=2)
    out = make_sampler()(logits, [make_seq(temperature=1.5, **params) for _ in range(16)])
    assert tokens(out) == logits.argmax(-1).tolist()


def test_top_k_and_min_p_restrict_support():
    probs = torch.full((VOCAB,), 0.2 / (VOCAB - 3))
    probs[[5, 7, 11]] = torch.tensor([0.45, 0.25, 0.1])
    logits = probs.log().repeat(400, 1)
    top_k = make_sampler()(logits, [make_seq(top_k=2) for _ in range(400)])
    assert set(tokens(top_k)) == {5, 7}
    # min_p 0.5: keep tokens with p >= 0.5 * 0.45 = 0.225 -> 5 and 7 only.
    min_p = make_sampler()(logits, [make_seq(min_p=0.5) for _ in range(400)])
    assert set(tokens(min_p)) == {5, 7}
    # top_p 0.6: 0.45 alone is short of 0.6, 0.45 + 0.25 reaches it -> 5 and 7.
    top_p = make_sampler()(logits, [make_seq(top_p=0.6) for _ in range(400)])
    assert set(tokens(top_p)) == {5, 7}


def test_temperature_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().repeat(4000, 1)
    out = tokens(make_sampler(seed=0)(logits, [make_seq(temperature=1.0) for _ in range(4000)]))
    freq = [out.count(t) / len(out) for t in range(3)]
    assert all(abs(f - p) < 0.03 for f, p in zip(freq, probs.tolist())), freq
    # Temperature 0.5 squares the odds: p ~ [0.36, 0.09, 0.01] / 0.46.
    hot = tokens(make_sampler(seed=0)(logits, [make_seq(temperature=0.5) for _ in range(4000)]))
    assert abs(hot.count(0) / len(hot) - 0.36 / 0.46) < 0.03
    # Exact tokens for a fixed engine seed: the stream is reproducible.
    again = tokens(make_sampler(seed=0)(logits, [make_seq(temperature=1.0) for _ in range(4000)]))
    assert again == out
    other = tokens(make_sampler(seed=1)(logits, [make_seq(temperature=1.0) for _ in range(4000)]))
    assert other != out


def test_seeded_request_is_independent_of_batch():
    logits = random_logits(1, seed=3)[0]
    mine = dict(temperature=1.0, seed=1234)
    alone = make_sampler(0)(logits[None], [make_seq(**mine)])
    others = random_logits(4, seed=4)
    batch = torch.cat([others[:2], logits[None], others[2:]])
    seqs = [make_seq(temperature=0.7), make_seq(temperature=0.0), make_seq(**mine),
            make_seq(temperature=1.0, seed=99), make_seq(top_k=3)]
    together = make_sampler(7)(batch, seqs)
    assert together[2].token_id == alone[0].token_id
    # The draw depends on (seed, sample_index, num_output_tokens): over steps and samples
    # it changes, and each (sample, step) is reproducible.
    uniform = torch.zeros(1, VOCAB)
    draws = [make_sampler()(uniform, [make_seq(num_output_tokens=n, **mine)])[0].token_id for n in range(20)]
    assert len(set(draws)) > 5
    assert draws == [make_sampler(5)(uniform, [make_seq(num_output_tokens=n, **mine)])[0].token_id
                     for n in range(20)]
    samples = [make_sampler()(uniform, [make_seq(sample_index=i, **mine)])[0].token_id for i in range(20)]
    assert len(set(samples)) > 5


def test_logprobs_are_raw_log_softmax():
    logits = random_logits(3, seed=5)
    seqs = [make_seq(temperature=0.0, logprobs=3), make_seq(temperature=0.3, top_k=2, logprobs=0),
            make_seq(temperature=0.0, logprobs=None)]
    out = make_sampler()(logits, seqs)
    expected = torch.log_softmax(logits, dim=-1)
    top3 = expected[0].topk(3)
    assert out[0].logprob == pytest.approx(expected[0, out[0].token_id].item(), abs=1e-6)
    assert [t for t, _ in out[0].top_logprobs] == top3.indices.tolist()
    assert [lp for _, lp in out[0].top_logprobs] == pytest.approx(top3.values.tolist(), abs=1e-6)
    # Reported against the raw distribution, not the temperature/top_k-processed one.
    assert out[1].logprob == pytest.approx(expected[1, out[1].token_id].item(), abs=1e-6)
    assert out[1].top_logprobs == []
    assert out[2].logprob is None and out[2].top_logprobs is None
    assert math.isclose(sum(math.exp(v) for v in expected[0].tolist()), 1.0, rel_tol=1e-5)
    # Asking for more than the vocabulary returns the whole vocabulary, ranked.
    every = make_sampler()(logits[:1], [make_seq(temperature=0.0, logprobs=VOCAB + 10)])[0]
    assert [t for t, _ in every.top_logprobs] == expected[0].argsort(descending=True).tolist()


def test_min_tokens_masks_eos_and_stop_token_ids():
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 30], logits[0, 40] = 10.0, 9.0, 8.0
    params = dict(temperature=0.0, min_tokens=3, stop_token_ids=[30], logprobs=1)
    early = make_sampler()(logits, [make_seq(num_output_tokens=2, **params)])[0]
    assert early.token_id == 40
    # logprobs stay raw: EOS is still the most likely token in the reported distribution.
    assert early.top_logprobs[0][0] == EOS
    assert make_sampler()(logits, [make_seq(num_output_tokens=3, **params)])[0].token_id == EOS
    # ignore_eos: EOS is not a stop token, so min_tokens leaves it; stop_token_ids still masked.
    ignoring = make_sampler()(logits, [make_seq(num_output_tokens=0, ignore_eos=True, **params)])[0]
    assert ignoring.token_id == EOS
    # Sampled rows are masked too.
    sampled = make_sampler()(logits.repeat(200, 1), [make_seq(num_output_tokens=0, temperature=1.0,
                                                              min_tokens=1, stop_token_ids=[30])
                                                     for _ in range(200)])
    assert not {EOS, 30} & set(tokens(sampled))

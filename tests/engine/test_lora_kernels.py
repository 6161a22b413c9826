"""The batched LoRA delta: the grouped CPU path and the Triton kernels (under TRITON_INTERPRET=1
here, compiled on CUDA when a GPU is present) against the per-token reference, on a step
that mixes base-model tokens with several adapters of different ranks and slices."""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.lora.punica import SliceRank, SlotGroup, add_lora_grouped, lora_delta_reference, slot_plan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(seed: int, num_tokens: int, in_features: int, out_sizes: tuple[int, ...], max_rank: int,
              ranks: list[list[int]]):
    """Stacked weights of len(ranks) slots (ranks[s][i]: slot s's rank on slice i, 0 = absent)."""
    gen = torch.Generator().manual_seed(seed)
    n, num_slots = len(out_sizes), len(ranks)
    lora_a = torch.zeros(num_slots, n * max_rank, in_features)
    lora_b = [torch.zeros(num_slots, size, max_rank) for size in out_sizes]
    scales = torch.zeros(num_slots, n)
    slot_slices = []
    for s, slot_ranks in enumerate(ranks):
        slices = []
        for i, r in enumerate(slot_ranks):
            scale = 0.0
            if r:
                lora_a[s, i * max_rank:i * max_rank + r] = torch.randn(r, in_features, generator=gen)
                lora_b[i][s, :, :r] = torch.randn(out_sizes[i], r, generator=gen)
                scale = 2.0 / (s + 1)
                scales[s, i] = scale
            slices.append(SliceRank(r, scale))
        slot_slices.append(slices)
    x = torch.randn(num_tokens, in_features, generator=gen)
    token_slots = torch.randint(-1, num_slots, (num_tokens,), generator=gen)
    return x, token_slots, lora_a, lora_b, scales, slot_slices


CASES = [  # (seed, tokens, in, out slices (qkv-like, gate_up-like, one), max_rank, ranks per slot)
    (0, 13, 64, (64, 32, 32), 16, [[4, 0, 4], [8, 8, 8], [16, 0, 0]]),
    (1, 1, 128, (384, 384), 64, [[64, 2]]),
    (2, 40, 96, (128,), 8, [[8], [3], [0], [5]]),
]


def offsets_of(out_sizes):
    return [sum(out_sizes[:i]) for i in range(len(out_sizes))]


@pytest.mark.parametrize("seed, tokens, in_features, out_sizes, max_rank, ranks", CASES)
def test_grouped_equals_reference(seed, tokens, in_features, out_sizes, max_rank, ranks):
    x, slots, lora_a, lora_b, scales, slot_slices = make_case(seed, tokens, in_features, out_sizes, max_rank, ranks)
    base = torch.randn(tokens, sum(out_sizes))
    expected = base + lora_delta_reference(x, slots, lora_a, lora_b, scales, max_rank)
    groups = [SlotGroup(s, (slots == s).nonzero().flatten()) for s in sorted(set(slots.tolist()) - {-1})]
    y = base.clone()
    plans = [slot_plan(lora_a, lora_b, offsets_of(out_sizes), max_rank, slices, s) for s, slices in enumerate(slot_slices)]
    add_lora_grouped(y, x, plans, groups)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-4)
    base_rows = slots == -1
    assert torch.equal(y[base_rows], base[base_rows])              # base-model tokens untouched


@pytest.mark.parametrize("seed, tokens, in_features, out_sizes, max_rank, ranks", CASES)
def test_triton_equals_reference(seed, tokens, in_features, out_sizes, max_rank, ranks):
    from pagedkube.engine.lora.triton_punica import add_lora_triton

    x, slots, lora_a, lora_b, scales, _ = make_case(seed, tokens, in_features, out_sizes, max_rank, ranks)
    base = torch.randn(tokens, sum(out_sizes))
    expected = base + lora_delta_reference(x, slots, lora_a, lora_b, scales, max_rank)
    y = base.clone().to(DEVICE)
    add_lora_triton(y, x.to(DEVICE), slots.to(DEVICE), lora_a.to(DEVICE), [b.to(DEVICE) for b in lora_b],
                    scales.to(DEVICE), offsets_of(out_sizes), max_rank)
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-4, atol=1e-3)
    assert torch.equal(y.cpu()[slots == -1], base[slots == -1])


def test_triton_wrapper_checks_shapes():
    from pagedkube.engine.lora.triton_punica import add_lora_triton

    x, slots, lora_a, lora_b, scales, _ = make_case(0, 4, 64, (64,), 8, [[8]])
    y = torch.zeros(4, 64)
    with pytest.raises(ValueError, match="does not fit"):
        add_lora_triton(y, x[:, :32].contiguous(), slots, lora_a, lora_b, scales, [0], 8)
    with pytest.raises(ValueError, match="token_slots"):
        add_lora_triton(y, x, slots.float(), lora_a, lora_b, scales, [0], 8)
    with pytest.raises(ValueError, match="scales"):
        add_lora_triton(y, x, slots, lora_a, lora_b, scales.double(), [0], 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_on_cuda_runs_the_triton_kernels_and_equals_cpu():
    from lora_adapters import trained_adapters
    from pagedkube.builtin import builtin_model_dir
    from pagedkube.engine import LLM, LoRARequest, SamplingParams

    base = builtin_model_dir()
    adapters = trained_adapters("tiny", base)
    loras = [LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(adapters.items())]
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(str(base), device=device, dtype="float32", enable_lora=True, max_loras=3, max_lora_rank=16)
        if device == "cuda":
            assert llm.engine.runner.lora.step.use_triton
        batch = [p for p in prompts for _ in range(4)]
        outs[device] = [o.outputs[0].token_ids for o in
                        llm.generate(batch, params, lora_request=[None, *loras] * len(prompts))]
    assert outs["cuda"] == outs["cpu"]

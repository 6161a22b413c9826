"""Logits -> next tokens for one step: greedy, temperature, min_p, top_k, top_p.

Order of processing (vLLM v1's): raw logprobs; penalties and logit bias
(penalties.py); the grammar bitmask of constrained rows (engine/structured/);
min_tokens masks EOS and stop_token_ids (unless the grammar allows nothing
else); greedy rows take the argmax; random rows divide by the
temperature, drop tokens under min_p * max prob, keep the top_k, keep the
smallest set whose probability reaches top_p, then draw.

Drawing uses the exponential race (argmax of p / E with E ~ Exp(1) per token),
which samples exactly from p and lets every row draw its noise from its own
generator:
- a request with a seed uses a fresh generator seeded from
  (seed, sample_index, num_output_tokens) (docs/interfaces.md), so its tokens do not
  depend on the batch it shares, chunking or preemption;
- other requests share the runner's generator (seeded by EngineConfig.seed).
No global RNG state is touched.
"""
from __future__ import annotations

import hashlib

import torch

from pagedkube.engine.penalties import apply_penalties
from pagedkube.engine.sequence import SampleOutput, Sequence
from pagedkube.engine.structured.bitmask import apply_bitmask


def request_seed(seed: int, sample_index: int, num_output_tokens: int) -> int:
    """A 63-bit generator seed for one draw of one seeded sample (stable across runs)."""
    digest = hashlib.sha256(f"{seed}:{sample_index}:{num_output_tokens}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Sampler:
    def __init__(self, eos_token_ids: list[int], generator: torch.Generator):
        self.eos_token_ids = list(eos_token_ids)
        self.generator = generator

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence],
                 grammar_mask: tuple[torch.Tensor, list[int]] | None = None) -> list[SampleOutput]:
        """logits [N, vocab] float32, one row per sequence to sample -> one output per row.
        grammar_mask: (int32 bitmask [R, words], the R constrained rows), from
        StructuredOutputManager.bitmask; the other rows are not touched."""
        assert logits.dim() == 2 and logits.shape[0] == len(seqs), (logits.shape, len(seqs))
        logits = logits.float()
        # Reported logprobs are the raw model distribution (log_softmax of the unprocessed
        # logits), before min_tokens, temperature or any truncation: vLLM's default
        # ("raw_logprobs"), and what the OpenAI API's logprobs mean.
        want_logprobs = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        logits = apply_penalties(logits, seqs)
        if grammar_mask is not None:
            logits = self._mask_grammar(logits, *grammar_mask)
        logits = self._mask_min_tokens(logits, seqs, constrained=grammar_mask is not None)
        tokens = torch.empty(len(seqs), dtype=torch.long, device=logits.device)
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        random = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if greedy:
            tokens[greedy] = logits[greedy].argmax(dim=-1)
        if random:
            tokens[random] = self._sample(logits[random], [seqs[i] for i in random])
        token_ids = tokens.tolist()
        outputs = [SampleOutput(token_id=t) for t in token_ids]
        if raw_logprobs is not None:
            self._fill_logprobs(outputs, raw_logprobs, tokens, seqs, want_logprobs)
        return outputs

    @staticmethod
    def _mask_grammar(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """-inf where the grammar disallows, in the constrained rows only (a fresh, contiguous
        tensor: the step's logits, which nobody else reads, may be masked in place)."""
        logits = logits.contiguous()
        device = logits.device
        apply_bitmask(logits, bitmask.to(device, non_blocking=True),
                      torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True))
        return logits

    def _mask_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence], constrained: bool = False) -> torch.Tensor:
        vocab = logits.shape[1]
        rows, cols = [], []
        for i, s in enumerate(seqs):
            if s.num_output_tokens < s.params.min_tokens:
                stop_ids = set(s.params.stop_token_ids or [])
                if not s.params.ignore_eos:
                    stop_ids.update(self.eos_token_ids)
                ids = [t for t in stop_ids if t < vocab]
                rows += [i] * len(ids)
                cols += ids
        if rows:
            masked = logits.clone()
            masked[rows, cols] = float("-inf")
            if constrained:   # a grammar that allows only a stop token now wins over min_tokens
                touched = sorted(set(rows))
                empty = (masked[touched] == float("-inf")).all(dim=-1).tolist()
                keep = [r for r, e in zip(touched, empty) if e]
                if keep:
                    masked[keep] = logits[keep]
            return masked
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        device, vocab = logits.device, logits.shape[1]
        params = [s.params for s in seqs]
        temperature = torch.tensor([p.temperature for p in params], device=device)
        logits = logits / temperature[:, None]
        # Which steps to run is decided from the Python params, so no device sync happens here.
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=device)
            probs = torch.softmax(logits, dim=-1)
            threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        if any(0 < p.top_k < vocab or p.top_p < 1 for p in params):
            top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
            top_p = torch.tensor([p.top_p for p in params], device=device)
            logits = _top_k_top_p(logits, top_k, top_p)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs)
        shared = [i for i, p in enumerate(params) if p.seed is None]
        if shared:
            noise[shared] = torch.empty(len(shared), vocab, device=device).exponential_(generator=self.generator)
        for i, s in enumerate(seqs):
            if s.params.seed is not None:
                gen = torch.Generator(device=device)
                gen.manual_seed(request_seed(s.params.seed, s.sample_index, s.num_output_tokens))
                noise[i].exponential_(generator=gen)
        return (probs / noise).argmax(dim=-1)

    @staticmethod
    def _fill_logprobs(outputs: list[SampleOutput], raw_logprobs: torch.Tensor, tokens: torch.Tensor,
                       seqs: list[Sequence], rows: list[int]) -> None:
        wanted = raw_logprobs[rows]                  # one gather of the rows that asked, used thrice
        sampled_t = wanted.gather(1, tokens[rows].unsqueeze(1))
        # vLLM's rank: 1 + how many tokens are likelier than the sampled one
        ranks = (wanted > sampled_t).sum(dim=-1).add_(1).tolist()
        sampled = sampled_t.squeeze(1).tolist()
        max_k = min(max(seqs[i].params.logprobs for i in rows), raw_logprobs.shape[1])
        top_values, top_ids = (wanted.topk(max_k, dim=-1) if max_k
                               else (raw_logprobs.new_empty(len(rows), 0), tokens.new_empty(len(rows), 0)))
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        for j, i in enumerate(rows):
            k = seqs[i].params.logprobs
            outputs[i].logprob = sampled[j]
            outputs[i].rank = ranks[j]
            outputs[i].top_logprobs = list(zip(top_ids[j][:k], top_values[j][:k]))


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's top_k largest logits, then the smallest prefix (by descending
    probability) whose mass reaches top_p; everything else becomes -inf.

        sorted probs   0.5  0.3  0.15  0.05      top_p = 0.7
        mass before    0    0.5  0.8   0.95      keep while mass before < top_p
        kept           yes  yes  no    no
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[1], device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    drop[:, 0] = False                                   # the most likely token always stays
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)

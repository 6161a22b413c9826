"""Repetition, presence and frequency penalties and logit bias (vLLM's semantics).

    repetition (vLLM / CTRL paper): every token seen in the prompt or the output
        logit > 0 -> logit / p,  logit <= 0 -> logit * p      (p > 1 discourages repeats)
    frequency (OpenAI): logit -= f * count of the token in the output so far
    presence  (OpenAI): logit -= p if the token occurs in the output at all
    logit_bias (OpenAI): logit += bias[token]

They run after the raw logprobs are taken (reported logprobs stay the model's) and
before min_tokens, greedy choice, temperature and truncation, as in vLLM v1. Only
rows whose params ask for one are touched; each costs O(prompt + output) for its
token counts, which vLLM pays too (it keeps them on the device instead).
"""
from __future__ import annotations

import torch

from pagedkube.engine.sequence import Sequence


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """logits [N, vocab] -> the same tensor or a penalized copy (rows as seqs)."""
    rows = [i for i, s in enumerate(seqs) if s.params.penalized]
    if not rows:
        return logits
    logits = logits.clone()
    vocab, device = logits.shape[1], logits.device
    for i in rows:
        params, seq = seqs[i].params, seqs[i]
        row = logits[i]
        output = torch.tensor(seq.output_token_ids, dtype=torch.long, device=device)
        counts = torch.bincount(output[output < vocab], minlength=vocab)[:vocab].to(row.dtype)
        if params.repetition_penalty != 1:
            prompt = torch.tensor(seq.prompt_token_ids, dtype=torch.long, device=device)
            seen = counts > 0
            seen[prompt[prompt < vocab]] = True
            penalty = params.repetition_penalty
            row.copy_(torch.where(seen, torch.where(row > 0, row / penalty, row * penalty), row))
        if params.frequency_penalty:
            row -= params.frequency_penalty * counts
        if params.presence_penalty:
            row -= params.presence_penalty * (counts > 0).to(row.dtype)
        if params.logit_bias:
            ids = [t for t in params.logit_bias if t < vocab]
            if ids:
                row[ids] += torch.tensor([params.logit_bias[t] for t in ids], dtype=row.dtype, device=device)
    return logits

"""How long one engine step takes (the simulator's only model of compute).

    step = overhead + prefill_per_token x (tokens computed for prefills this step)
                    + decode_per_seq x (sequences decoding one token this step)

Prefix-cache hits cost nothing (they are not computed). Two profiles:

* `cpu`: the built-in tiny model on this project's 2-core CI machine, four
  engines sharing the cores, fitted to bench/routing.py (docs/benchmarks.md
  "Routing": the four engines served ~27 req/s with ~18 requests in flight on
  32 petcare sessions at 0.5 s mean think time, TTFT p50 ~12 ms);
  docs/benchmarks.md "Simulator: routing at fleet scale" shows the fit.
* `h100-8b`: an 8B model (Llama 3.1 8B, bf16) on one H100 under vLLM, from
  published figures: ~10k prefill tokens/s per GPU (0.1 ms per token) and a
  decode step of ~10 ms for a small batch growing ~0.1 ms per extra sequence
  (vLLM's and NVIDIA's published Llama 3.1 8B H100 benchmarks; docs/benchmarks.md
  "Simulator: routing at fleet scale" cites them). Both are first-order: no attention-length term.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class TimeModel:
    name: str
    overhead_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float

    def __post_init__(self) -> None:
        if min(self.overhead_s, self.prefill_s_per_token, self.decode_s_per_seq) < 0:
            raise ValueError(f"time model {self.name}: costs must be >= 0")
        if self.overhead_s + self.prefill_s_per_token + self.decode_s_per_seq <= 0:
            raise ValueError(f"time model {self.name}: a step must take some time")

    def step_time(self, prefill_tokens: int, decode_seqs: int) -> float:
        return self.overhead_s + self.prefill_s_per_token * prefill_tokens + self.decode_s_per_seq * decode_seqs

    def pooled(self, n: int) -> "TimeModel":
        """n engines' compute as one (the ideal policy's engine): per-token and
        per-sequence costs shared n ways, the fixed overhead paid once."""
        return replace(self, name=f"{self.name}x{n}", prefill_s_per_token=self.prefill_s_per_token / n,
                       decode_s_per_seq=self.decode_s_per_seq / n)


PROFILES = {
    "cpu": TimeModel("cpu", overhead_s=0.008, prefill_s_per_token=0.00005, decode_s_per_seq=0.0025),
    "h100-8b": TimeModel("h100-8b", overhead_s=0.010, prefill_s_per_token=0.0001, decode_s_per_seq=0.0001),
}

"""Seeded token-level workloads for the fleet simulator.

A session is a head (what docs/design.md "Gateway" keys the ring on: for a chat, the
conversation up to its first user message) and turns; turn k's prompt is the
head's shared part, then every earlier user message and answer, then user
message k, so each turn extends the previous turn's prompt and answer, as a
chat client re-sends its history. Sessions arrive as a Poisson process (or all
at once, `rate` 0) and each turn waits for an exponential think time first.

Sessions are generated lazily from numpy's generator seeded by (seed, kind,
session index): the same seed gives the same sessions, and 100,000 of them
need no memory up front.

    petcare        a few product system prompts (500-2,000 tokens), a per-dog
                   profile, multi-turn sessions (the fleet this product is for)
    sharegpt       ShareGPT-like lengths (log-normal prompts and answers), one to
                   three turns, no shared prefix between sessions
    tenants        petcare for several tenants that use the same product prompts,
                   each with its own cache salt (salted blocks never match)
    bench-petcare  bench/workloads.py's petcare_chat as bench/routing.py sends it,
                   tokenized with the built-in model's tokenizer and chat template
                   (calibration against the real four-engine run)

With `adapters` > 0 (any kind but bench-petcare) every session runs under one LoRA
adapter, `adapter-01` .. `adapter-NN`, drawn with Zipf popularity (rank r has weight
r^-adapter_zipf): a few fine-tunes are busy, a long tail is rare.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

VOCAB = 32_000


@dataclass(slots=True)
class SimSession:
    session_id: str
    arrival_s: float
    shared: list[int]                  # the head's part before the first user message
    users: list[list[int]]
    answers: list[list[int]]
    think_s: list[float]               # pause before turn k (k >= 1; [0] unused)
    cache_salt: str | None = None
    head_len: int | None = None        # tokens of the head; None: shared + users[0]
    common_len: int = 0                # leading tokens other sessions share (a product prompt)
    lora_name: str | None = None       # the LoRA adapter every turn runs under (None: the base model)

    @property
    def num_turns(self) -> int:
        return len(self.users)

    @property
    def head(self) -> list[int]:
        head = self.shared + self.users[0]
        return head if self.head_len is None else head[:self.head_len]

    def prompt(self, turn: int) -> list[int]:
        out = list(self.shared)
        for k in range(turn):
            out += self.users[k]
            out += self.answers[k]
        return out + self.users[turn]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    kind: str = "petcare"
    sessions: int = 1000
    rate: float = 1.0                  # sessions per second (Poisson); 0: all at time 0
    seed: int = 0
    think_s: float = 20.0              # mean user think time between turns
    turns: tuple[int, int] = (2, 8)    # uniform, inclusive
    answer_tokens: tuple[int, int] = (60, 250)
    user_tokens: tuple[int, int] = (15, 60)
    products: int = 3                  # petcare: product system prompts
    system_tokens: tuple[int, int] = (500, 2000)
    profile_tokens: tuple[int, int] = (40, 120)
    tenants: int = 4
    adapters: int = 0                  # LoRA adapters the sessions draw from (0: all run the base model)
    adapter_zipf: float = 1.0          # Zipf exponent of their popularity


KINDS = ("petcare", "sharegpt", "tenants", "bench-petcare")


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1, VOCAB, size=n).tolist()


def _between(rng: np.random.Generator, lo_hi: tuple[int, int]) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1] + 1))


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormal(np.log(median), sigma)))))


def sessions(spec: WorkloadSpec) -> Iterator[SimSession]:
    if spec.kind not in KINDS:
        raise ValueError(f"workload must be one of {', '.join(KINDS)}, got {spec.kind!r}")
    if spec.adapters < 0 or spec.adapter_zipf < 0:
        raise ValueError(f"adapters and adapter_zipf must be >= 0, got {spec.adapters}, {spec.adapter_zipf}")
    if spec.kind == "bench-petcare":
        from sim.bench_workload import bench_sessions
        yield from bench_sessions(spec)
        return
    arrivals = np.random.default_rng([spec.seed, 0])
    products = [_tokens(np.random.default_rng([spec.seed, 1, p]), _between(
        np.random.default_rng([spec.seed, 2, p]), spec.system_tokens)) for p in range(spec.products)]
    weights = np.arange(1, spec.adapters + 1, dtype=float) ** -spec.adapter_zipf
    adapter_p = weights / weights.sum() if spec.adapters else None
    t = 0.0
    for i in range(spec.sessions):
        if spec.rate > 0:
            t += float(arrivals.exponential(1.0 / spec.rate))
        rng = np.random.default_rng([spec.seed, 3, i])
        n = _between(rng, spec.turns)
        think = [0.0] + [float(rng.exponential(spec.think_s)) for _ in range(n - 1)]
        salt = None
        if spec.kind == "sharegpt":
            shared: list[int] = []
            users = [_tokens(rng, _lognormal(rng, 250, 1.0, 4, 3000)) for _ in range(n)]
            answers = [_tokens(rng, _lognormal(rng, 200, 0.8, 4, 1000)) for _ in range(n)]
        else:
            product = products[int(rng.integers(0, len(products)))]
            shared = product + _tokens(rng, _between(rng, spec.profile_tokens))
            users = [_tokens(rng, _between(rng, spec.user_tokens)) for _ in range(n)]
            answers = [_tokens(rng, _between(rng, spec.answer_tokens)) for _ in range(n)]
            if spec.kind == "tenants":
                salt = f"tenant-{int(rng.integers(0, spec.tenants))}"
        common = 0 if spec.kind == "sharegpt" else len(product)
        lora = None
        if adapter_p is not None:   # its own stream: the sessions are the same with and without adapters
            lora = f"adapter-{int(np.random.default_rng([spec.seed, 4, i]).choice(spec.adapters, p=adapter_p)) + 1:02d}"
        yield SimSession(f"{spec.kind}-{i}", t, shared, users, answers, think, salt, common_len=common,
                         lora_name=lora)

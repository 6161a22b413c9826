"""bench/routing.py's petcare workload, token for token where it can be.

bench/workloads.py's petcare_chat sessions (8 turns, the same seed), rendered
with the built-in model's chat template and tokenizer as the engine does; the
answers, which the real run gets from the model, are 32 seeded tokens each
(bench/routing.py asks for max_tokens 32). All sessions start at once and each
turn waits for bench/routing.py's think time (exponential, mean spec.think_s,
seeded by session and turn, turn 0 included), so arrivals match the real run's.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from sim.workloads import SimSession, WorkloadSpec

BENCH = Path(__file__).resolve().parents[1]
ANSWER_TOKENS = 32   # bench/routing.py: petcare_chat(..., max_tokens=32)


def bench_sessions(spec: WorkloadSpec) -> Iterator[SimSession]:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    from routing import think_time  # noqa: E402  (bench/routing.py: the real run's pauses)
    from workloads import petcare_chat  # noqa: E402  (bench/workloads.py)

    from pagedkube.builtin import builtin_model_dir
    from pagedkube.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(builtin_model_dir())
    for i, session in enumerate(petcare_chat(num_sessions=spec.sessions, turns=8, seed=spec.seed).sessions):
        rng = np.random.default_rng([spec.seed, 4, i])
        answers = [rng.integers(1000, 20000, size=ANSWER_TOKENS).tolist() for _ in range(session.num_turns)]
        shared = tok.encode_chat([{"role": "system", "content": session.system}], add_generation_prompt=False)
        users, previous = [], shared
        for k in range(session.num_turns):
            # Rendered with empty replies, turn k's prompt is turn k-1's plus what the
            # template puts after a reply and the new user message; the sim inserts
            # the answer's tokens between the two, where the model's reply goes.
            session.replies = [""] * k
            full = tok.encode_chat(session.messages(k), add_generation_prompt=True)
            users.append(full[len(previous):])
            previous = full
        head_len = len(tok.encode_chat(session.messages(0), add_generation_prompt=False))
        think = [think_time(spec.seed, session.session_id, k, spec.think_s) for k in range(session.num_turns)]
        yield SimSession(session.session_id, think[0], shared, users, answers, [0.0] + think[1:],
                         head_len=head_len)


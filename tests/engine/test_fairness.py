"""Requests share freed slots round-robin (engine/waiting_queue.py), end to end in the engine.

The server puts all prompts of one HTTP request in one group (their engine request ids
differ); this drives the engine the same way, deterministically, step by step.
"""
from __future__ import annotations

from pagedkube.engine import LLM, SamplingParams


def test_a_later_small_request_is_not_stuck_behind_a_big_one():
    engine = LLM(model="builtin://tiny", device="cpu", max_num_seqs=4, max_model_len=256).engine
    long = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i, text in enumerate(["Dogs", "Cats", "Birds", "Fish"]):
        engine.add_request(f"first-{i}", text, long, group="first")
    engine.step_deltas()                                   # first's four prompts take the four slots
    for i, text in enumerate(["Horses", "Mice", "Goats", "Frogs"]):
        engine.add_request(f"second-{i}", text, long, group="second")
    engine.add_request("small", "Hamsters", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    finished: list[str] = []
    while engine.has_unfinished_requests():
        finished += [d.request_id for d in engine.step_deltas() if d.finished]
    groups = [rid.split("-")[0] for rid in finished]
    # FIFO would give first x4, second x4, small: second's four sequences would take every
    # slot first's free. Round-robin lets small in with them.
    assert groups.index("small") < groups.index("second")
    assert groups.count("first") == 4 and groups.count("second") == 4
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.pool.num_blocks

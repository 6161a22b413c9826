"""The scheduler's waiting queue: FIFO within a group, round-robin between groups."""
from __future__ import annotations

import pytest

from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.sequence import Sequence
from pagedkube.engine.waiting_queue import WaitingQueue


def seq(name: str, group: str | None = None) -> Sequence:
    return Sequence(name, [1, 2], SamplingParams(), group=group)


def names(queue: WaitingQueue) -> list[str]:
    return [s.request_id for s in queue]


def test_round_robin_between_groups_fifo_within():
    q = WaitingQueue()
    big = [seq(f"big-{i}", "big") for i in range(4)]
    for s in big:
        q.append(s)
    small = seq("small")
    q.append(small)
    assert len(q) == 5 and q[0] is big[0]
    order = [q.popleft().request_id for _ in range(5)]
    assert order == ["big-0", "small", "big-1", "big-2", "big-3"]
    assert not q and len(q) == 0


def test_one_sequence_per_group_is_plain_fifo():
    q = WaitingQueue()
    seqs = [seq(f"r{i}") for i in range(5)]
    for s in seqs:
        q.append(s)
    assert [q.popleft() for _ in range(5)] == seqs


def test_appendleft_puts_the_sequence_and_its_group_first():
    q = WaitingQueue()
    a0, a1, b0 = seq("a0", "a"), seq("a1", "a"), seq("b0", "b")
    q.append(b0)
    q.append(a1)
    q.appendleft(a0)                      # a preempted sequence resumes first
    assert names(q) == ["a0", "a1", "b0"]
    q.extendleft(reversed([seq("c1", "c"), seq("c2", "c")]))   # forked siblings, in order
    assert names(q) == ["c1", "c2", "a0", "a1", "b0"]
    assert [s.request_id for s in reversed(q)] == ["b0", "a1", "a0", "c2", "c1"]


def test_remove_and_membership():
    q = WaitingQueue()
    a, b, c = seq("a", "g"), seq("b", "g"), seq("c")
    for s in (a, b, c):
        q.append(s)
    q.remove(b)
    assert b not in q and a in q and names(q) == ["a", "c"]
    q.remove(a)
    assert names(q) == ["c"] and len(q) == 1
    with pytest.raises(IndexError):
        WaitingQueue()[0]

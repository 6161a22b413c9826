"""The scheduler's waiting queue, fair across request groups.

One FIFO per group (a group is one HTTP request: all its prompts and samples;
by default a request id), served round-robin: each admission takes the head of
the first group and moves that group to the back. So a request that queued a
thousand sequences gets one slot in turn with every other waiting request,
instead of all the slots that free up before them (docs/design.md "Pitfalls": one request must
not lock everyone out). Within a group, and with one sequence per group, it is
plain FIFO. `appendleft` (preempted sequences, forked siblings) puts a sequence
at the front of its group and its group at the front, as the scheduler's
"resume first" rule wants.

    groups:  [g1: s1 s2 s3] [g2: t1] [g3: u1 u2]
    popleft -> s1;  groups: [g2: t1] [g3: u1 u2] [g1: s2 s3]

Every operation the scheduler uses is O(1) except `remove` (O(group size)),
which runs only when a waiting sequence is aborted. Torch-free.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterator

from pagedkube.engine.sequence import Sequence


class WaitingQueue:
    def __init__(self) -> None:
        self._groups: OrderedDict[str, deque[Sequence]] = OrderedDict()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Sequence]:
        for group in self._groups.values():
            yield from group

    def __reversed__(self) -> Iterator[Sequence]:
        for group in reversed(self._groups.values()):
            yield from reversed(group)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self._groups.get(seq.group_key, ())

    def __getitem__(self, index: int) -> Sequence:
        if index != 0 or not self._len:
            raise IndexError("WaitingQueue only peeks at its head ([0])")
        return next(iter(self._groups.values()))[0]

    def append(self, seq: Sequence) -> None:
        self._groups.setdefault(seq.group_key, deque()).append(seq)
        self._len += 1

    def appendleft(self, seq: Sequence) -> None:
        key = seq.group_key
        self._groups.setdefault(key, deque()).appendleft(seq)
        self._groups.move_to_end(key, last=False)
        self._len += 1

    def extendleft(self, seqs) -> None:
        """As deque.extendleft: each item goes to the front in turn."""
        for seq in seqs:
            self.appendleft(seq)

    def popleft(self) -> Sequence:
        key, group = next(iter(self._groups.items()))
        seq = group.popleft()
        if group:
            self._groups.move_to_end(key)
        else:
            del self._groups[key]
        self._len -= 1
        return seq

    def remove(self, seq: Sequence) -> None:
        key = seq.group_key
        group = self._groups[key]
        group.remove(seq)
        if not group:
            del self._groups[key]
        self._len -= 1

"""n > 1: where a request's other samples wait until sample 0's prompt is computed.

Only sample 0 of a request is queued at first. Once its prompt is computed, the
scheduler takes its siblings from here and they share its full prompt blocks
(KVCacheManager.fork, by reference count) instead of prefilling the prompt n times.
The scheduler's whole view of forking is this small interface:

    add(parent, siblings)      at admission
    ready(parent) / take()     after a step computed the parent's prompt
    remove(seq)                a sibling ended before it was forked (aborted)
    take(parent) on finish     a parent ended first: its siblings are aborted or queued

Torch-free.
"""
from __future__ import annotations

from pagedkube.engine.sequence import Sequence


class PendingForks:
    def __init__(self) -> None:
        self._siblings: dict[Sequence, list[Sequence]] = {}   # parent -> siblings not yet forked
        self._parent: dict[Sequence, Sequence] = {}           # sibling -> its parent
        self._count = 0

    def __len__(self) -> int:
        """Siblings waiting to be forked (they count as waiting sequences)."""
        return self._count

    def add(self, parent: Sequence, siblings: list[Sequence]) -> None:
        if not siblings:
            return
        self._siblings[parent] = list(siblings)
        for sibling in siblings:
            self._parent[sibling] = parent
        self._count += len(siblings)

    def ready(self, parent: Sequence) -> bool:
        """Whether `parent` has siblings waiting and its whole prompt is computed."""
        return parent in self._siblings and parent.num_computed_tokens >= parent.num_prompt_tokens

    def take(self, parent: Sequence) -> list[Sequence]:
        """The parent's waiting siblings (none if it has none), no longer tracked here."""
        siblings = self._siblings.pop(parent, [])
        for sibling in siblings:
            del self._parent[sibling]
        self._count -= len(siblings)
        return siblings

    def remove(self, sibling: Sequence) -> None:
        """Forget a sibling that ended before its fork (no-op for any other sequence)."""
        parent = self._parent.pop(sibling, None)
        if parent is not None:
            self._siblings[parent].remove(sibling)
            self._count -= 1

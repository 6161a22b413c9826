"""Which engine's cache is worth least: prefix-cache hits per engine, lately.

Each autoscaler tick reads `vllm:prefix_cache_hits_total` (cached prompt
tokens served, cumulative) of every ready engine as the engine watcher last
scraped it (gateway/engine_metrics.py, kept in the EndpointSet). The worth of an engine's
cache is the growth of that counter over the last `window` seconds: an engine
whose blocks nobody has reused lately loses least when it goes, so a scale-in
removes it first. A counter that went down (engine restarted) restarts its history.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

DEFAULT_WORTH_WINDOW_S = 300.0   # as long as HPA's default scale-down window


class CacheWorth:
    def __init__(self, window: float = DEFAULT_WORTH_WINDOW_S, max_samples: int = 1024):
        self.window = window
        self.max_samples = max_samples       # bound per engine, whatever the tick rate
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def observe(self, url: str, hits_total: float, now: float) -> None:
        samples = self._samples.setdefault(url, deque(maxlen=self.max_samples))
        if samples and hits_total < samples[-1][1]:
            samples.clear()
        samples.append((now, hits_total))
        while len(samples) > 1 and samples[1][0] <= now - self.window:
            samples.popleft()   # keep one sample at or before the window start as the baseline

    def forget(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        for url in [u for u in self._samples if u not in keep]:
            del self._samples[url]

    def recent_hits(self, url: str) -> float:
        samples = self._samples.get(url)
        if not samples:
            return 0.0
        return samples[-1][1] - samples[0][1]

    def least_worth(self, urls: Iterable[str], count: int) -> list[str]:
        """`count` URLs with the fewest recent hits; ties broken by URL (highest
        first), so every gateway replica picks the same ones."""
        ranked = sorted(urls, key=lambda u: (self.recent_hits(u), _reverse(u)))
        return ranked[:max(0, count)]


def _reverse(url: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in url)

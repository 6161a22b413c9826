"""pagedkube_gateway_cache_feed_age_seconds{endpoint}: how stale this gateway's
view of each engine's prefix cache may be.

The gateway follows every engine's cache feed with long-polls that answer at
least every --feed-wait seconds (5 s by default) even when nothing changed, so
the age of the last answer stays under about feed_wait + a round trip while
the feed works. A growing age means routing decisions use an old picture of
that engine's cache (predicted cached tokens drift from realized ones); the
chart's PrometheusRule alerts on it (PagedkubeCacheFeedLagging).
"""
from __future__ import annotations

import time

from prometheus_client.core import GaugeMetricFamily

NAME = "pagedkube_gateway_cache_feed_age_seconds"


class CacheFeedAge:
    """A collector over EngineWatcher.feed_heard, read at scrape time."""

    def __init__(self, watcher, label=lambda url: url) -> None:
        """`label(url)`: the endpoint's name in the metric (EndpointSet.label)."""
        self.watcher = watcher
        self.label = label

    def collect(self):
        family = GaugeMetricFamily(NAME, "Seconds since each followed engine's cache feed last answered",
                                   labels=["endpoint"])
        now = time.monotonic()
        for url, heard in sorted(self.watcher.feed_heard.items()):
            family.add_metric([self.label(url)], round(now - heard, 3))
        yield family

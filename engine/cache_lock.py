"""One process at a time on a cache entry: a file lock that says when it had to wait.

What the engine writes into its cache before serving (a GGUF's converted tokenizer, the CPU
kernel timings) is made once per content; two engines started together on one machine (`pagedkube
up` starts two; two pods of a node share a hostPath cache) must not both make it. Each maker takes
`cache_lock(path)` around "check the cache, make it if missing"; the one that waited finds the
other's result on its second check. The lock is a `filelock` lock file beside the entry (an
flock(2) on Linux: released by the kernel when its holder dies, so a killed engine never wedges
the next one). Entries are still written to a temporary sibling and renamed, so a reader that
takes no lock never sees half of one.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)

WAIT_LOG_INTERVAL_S = 10.0   # while waiting, a line this often, so a long wait is never silent


@contextmanager
def cache_lock(lock_path: Path, what: str) -> Iterator[bool]:
    """Holds the lock at `lock_path` for the body; yields whether another process held it first
    (then the body should find that process's result). `what` names the work in the log lines."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    waited = False
    start = time.monotonic()
    while True:
        try:
            lock.acquire(timeout=0 if not waited else WAIT_LOG_INTERVAL_S)
            break
        except Timeout:
            log.info("%s: waiting for another process that holds %s (%.0f s so far)", what, lock_path,
                     time.monotonic() - start)
            waited = True
    try:
        if waited:
            log.info("%s: got %s after %.1f s", what, lock_path, time.monotonic() - start)
        yield waited
    finally:
        lock.release()

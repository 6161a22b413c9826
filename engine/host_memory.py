"""How much host memory an allocation can still take: the kernel's MemAvailable, bounded by the
container's cgroup limit (in a pod MemAvailable is the node's). The CPU KV pool is sized from it
(engine/model_runner.py)."""
from __future__ import annotations

import os
from pathlib import Path


def available_host_memory(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes a new allocation can get without swapping or the container's OOM kill: the kernel's
    MemAvailable, or this cgroup's limit less its usage where that is less (in a pod MemAvailable
    is the node's)."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    headroom = cgroup_headroom(cgroup)
    return available if headroom is None else min(available, headroom)


def cgroup_headroom(root: Path) -> int | None:
    """limit - usage of the cgroup mounted at root (v2: memory.max/current; v1: memory/
    limit_in_bytes/usage_in_bytes); None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit, usage = (root / limit_file).read_text().strip(), (root / usage_file).read_text().strip()
        except OSError:
            continue
        if limit == "max" or int(limit) >= 2**60:     # v1 writes "no limit" as a huge number
            return None
        return max(0, int(limit) - int(usage))
    return None

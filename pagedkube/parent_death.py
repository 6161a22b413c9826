"""Ending a child process when its parent dies (Linux PR_SET_PDEATHSIG), for the
engine core (SIGKILL: the HTTP process is gone, nothing is left to serve) and the
engines `pagedkube up` starts (SIGTERM: they drain first). Torch-free."""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Asks the kernel to send `sig` to this process when its parent thread exits.

    With `parent_pid`, also exits at once if the parent already died before the
    request took effect (the child was re-parented). Elsewhere than Linux this is
    a no-op: callers keep their other signal (EOF on a pipe, a closed socket)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)

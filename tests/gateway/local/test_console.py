"""`pagedkube up`'s status block: redrawn in place on a terminal (ANSI), printed only on change
anywhere else (a pipe or a log file gets one line per change, no ticking counters)."""
from __future__ import annotations

import io
import os
import pty

from pagedkube.gateway.local.console import Console

UP_AND_CLEAR_2 = "\x1b[2F\x1b[J"


def test_off_a_terminal_the_block_prints_only_on_change():
    out = io.StringIO()
    console = Console(out)
    assert console.live is False
    console.set_state("gateway", "listening", "http://127.0.0.1:8080")
    console.set_state("engine-0", "loading", "http://127.0.0.1:9000")
    console.set_state("engine-0", "loading", "http://127.0.0.1:9000")   # no change: nothing
    console.tick()                                                       # a log gets no ticks
    console.log("engine-0", "INFO: loading weights")
    console.set_state("engine-0", "ready", "http://127.0.0.1:9000")
    assert out.getvalue().splitlines() == [
        "status   | gateway   listening http://127.0.0.1:8080",
        "status   | gateway   listening http://127.0.0.1:8080",
        "status   | engine-0  loading   http://127.0.0.1:9000  (0 s)",
        "engine-0 | INFO: loading weights",
        "status   | gateway   listening http://127.0.0.1:8080",
        "status   | engine-0  ready     http://127.0.0.1:9000",
    ]
    assert "\x1b" not in out.getvalue()


def test_on_a_terminal_the_block_stays_below_the_logs_and_is_redrawn_in_place():
    out = io.StringIO()
    console = Console(out, live=True)
    console.set_state("gateway", "listening", "http://127.0.0.1:8080")
    console.set_state("engine-0", "loading", "http://127.0.0.1:9000")
    start = len(out.getvalue())
    console.log("engine-0", "INFO: loading weights")
    assert out.getvalue()[start:] == (UP_AND_CLEAR_2 + "engine-0 | INFO: loading weights\n"
                                      "status   | gateway   listening http://127.0.0.1:8080\n"
                                      "status   | engine-0  loading   http://127.0.0.1:9000  (0 s)\n")
    start = len(out.getvalue())
    console.tick()                      # still loading: redrawn, nothing scrolls
    assert out.getvalue()[start:].startswith(UP_AND_CLEAR_2) and out.getvalue()[start:].count("\n") == 2
    console.set_state("engine-0", "ready", "http://127.0.0.1:9000")
    start = len(out.getvalue())
    console.tick()                      # nothing loads: no redraw
    assert out.getvalue()[start:] == ""


def test_a_terminal_is_detected():
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            assert Console(tty).live is True
    finally:
        os.close(leader)
        os.close(follower)

"""What `pagedkube up` prints: component-prefixed logs and one status line per component.

    engine-0 | INFO:     Uvicorn running on http://127.0.0.1:41233
    gateway  | scale up: 1 -> 2 engines (ready 1, queue depth 9, target 2 per engine)
    status   | gateway   listening http://127.0.0.1:8080
    status   | engine-0  ready     http://127.0.0.1:41233  (loaded in 11.2 s)
    status   | engine-1  loading   http://127.0.0.1:40117  (6 s)

On a terminal the status block stays below the logs and is redrawn in place: when a component
changes state, and every few seconds while an engine loads (its seconds count up). Anywhere
else (a pipe, a log file) the block is printed again only when a component changes state, so
a log holds one line per change and no ticking counters.
"""
from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from typing import TextIO

# ANSI: to the start of the line N lines up, then clear to the end of the screen.
_UP_AND_CLEAR = "\x1b[{n}F\x1b[J"


class Console:
    def __init__(self, stream: TextIO | None = None, width: int = 8, live: bool | None = None):
        """`live`: redraw the status block in place (default: when the stream is a terminal)."""
        self.stream = stream or sys.stdout
        self.width = width
        self.live = _isatty(self.stream) if live is None else live
        self.components: dict[str, tuple[str, str, float]] = {}   # name -> (state, detail, since)
        self._drawn = 0                  # status lines on screen below the logs (live only)
        self._lock = threading.Lock()    # the in-process gateway's log handler may write from threads

    def log(self, component: str, line: str) -> None:
        with self._lock:
            self._erase()
            self.stream.write(self._line(component, line) + "\n")
            self._draw()
            self.stream.flush()

    def set_state(self, component: str, state: str, detail: str = "") -> None:
        old = self.components.get(component)
        if old is not None and old[0] == state and old[1] == detail:
            return
        self.components[component] = (state, detail, time.monotonic())
        self.print_status()

    def loading(self) -> bool:
        return any(state in ("starting", "loading") for state, _, _ in self.components.values())

    def print_status(self) -> None:
        """The status block: redrawn in place when live, printed again otherwise."""
        with self._lock:
            if self.live:
                self._erase()
                self._draw()
            else:
                for line in self._status_lines():
                    self.stream.write(self._line("status", line) + "\n")
            self.stream.flush()

    def tick(self) -> None:
        """Every few seconds: a live block counts up its loading engines' seconds; a log gets nothing."""
        if self.live and self.loading():
            self.print_status()

    def _status_lines(self) -> list[str]:
        now = time.monotonic()
        lines = []
        for name, (state, detail, since) in self.components.items():
            extra = f"  ({now - since:.0f} s)" if state in ("starting", "loading") else ""
            lines.append(f"{name:<9} {state:<9} {detail}{extra}".rstrip())
        return lines

    def _line(self, component: str, text: str) -> str:
        return f"{component:<{self.width}} | {text}"

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(_UP_AND_CLEAR.format(n=self._drawn))
            self._drawn = 0

    def _draw(self) -> None:
        if not self.live:
            return
        columns = shutil.get_terminal_size().columns
        lines = [self._line("status", line)[:columns - 1] for line in self._status_lines()]   # no wrapping:
        for line in lines:                                                                  # one row each
            self.stream.write(line + "\n")
        self._drawn = len(lines)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ComponentLogHandler(logging.Handler):
    """Python logging of the in-process gateway -> `gateway | ...` lines."""

    def __init__(self, console: Console, component: str = "gateway"):
        super().__init__()
        self.console = console
        self.component = component
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.log(self.component, self.format(record))
        except Exception:  # noqa: BLE001  never let logging break the supervisor
            self.handleError(record)

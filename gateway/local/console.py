"""What `pagedkube up` prints: component-prefixed logs and one status line per component.

    engine-0 | INFO:     Uvicorn running on http://127.0.0.1:41233
    gateway  | scale up: 1 -> 2 engines (ready 1, queue depth 9, target 2 per engine)
    status   | gateway   listening http://127.0.0.1:8080
    status   | engine-0  ready     http://127.0.0.1:41233  (loaded in 11.2 s)
    status   | engine-1  loading   http://127.0.0.1:40117  (6 s)

The status block is printed again whenever a component changes state, and every
`progress_every` seconds while an engine loads.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import TextIO


class Console:
    def __init__(self, stream: TextIO | None = None, width: int = 8):
        self.stream = stream or sys.stdout
        self.width = width
        self.components: dict[str, tuple[str, str, float]] = {}   # name -> (state, detail, since)

    def log(self, component: str, line: str) -> None:
        self.stream.write(f"{component:<{self.width}} | {line}\n")
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
        now = time.monotonic()
        for name, (state, detail, since) in self.components.items():
            extra = f"  ({now - since:.0f} s)" if state in ("starting", "loading") else ""
            self.log("status", f"{name:<9} {state:<9} {detail}{extra}".rstrip())


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

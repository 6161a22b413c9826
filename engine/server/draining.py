"""uvicorn.Server whose first SIGTERM drains instead of stopping at once.

Drain (what Kubernetes expects between SIGTERM and SIGKILL):
  1. /ready answers 503 and new generation requests get 503 + Retry-After,
  2. requests in flight run to completion, for at most `drain_timeout` seconds,
  3. what still runs then is aborted (its clients get an error event), and
  4. the process exits 0. A second SIGTERM, or a SIGINT, stops at once.

uvicorn re-raises the signals it caught after shutting down, which would end the
process with -SIGTERM instead of 0: ours are handled, never replayed.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import uvicorn

from pagedkube.engine.server.state import ServerState

logger = logging.getLogger("pagedkube.serve")

# After the drain timeout, how long aborted requests get to send their last bytes.
ABORT_GRACE_S = 2.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        state.stop_server = self.stop_now

    def stop_now(self) -> None:
        """A fatal engine failure: stop at once (open streams get their error events first,
        within uvicorn's graceful-shutdown timeout); the process then exits with state.exit_code."""
        self.should_exit = True

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM and self.started and self._drain_task is None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_drain)
            return
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    def _begin_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        state, loop = self.state, asyncio.get_running_loop()
        state.draining = True
        if state.feed_waiters is not None:
            state.feed_waiters.wake()   # cache-feed long-polls answer now, not after their wait
        timeout = state.config.drain_timeout
        logger.info("SIGTERM: draining %d in-flight request(s) for up to %.1fs", state.in_flight, timeout)
        deadline = loop.time() + timeout
        while state.in_flight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if state.in_flight > 0:
            logger.warning("drain timeout: aborting %d request(s)", state.in_flight)
            state.engine.abort_all()
            deadline = loop.time() + ABORT_GRACE_S
            while state.in_flight > 0 and loop.time() < deadline:
                await asyncio.sleep(0.05)
        logger.info("drained; shutting down")
        self.should_exit = True

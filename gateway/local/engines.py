"""Engine processes of `pagedkube up`: the local ScaleTarget.

Each engine is `python -m pagedkube serve --host 127.0.0.1 --port <free> <engine flags>`
in its own session (Ctrl-C in the terminal reaches only the supervisor, which
drains the engines itself) with PR_SET_PDEATHSIG = SIGTERM, so an engine drains
and exits even when the supervisor is SIGKILLed.

    state:  starting -> loading -> ready -> draining -> stopped
                                 \\-> failed (exited on its own)

The supervisor, not a probe, tells the gateway's EndpointSet what is routable:
an engine joins as not_ready, turns ready when GET /ready answers 200, and
turns terminating *before* it gets SIGTERM, so no new request reaches an engine
that drains (DESIGN.md §5); it leaves the set once its process has exited.
"""
from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import httpx

from pagedkube.gateway.endpoints import NOT_READY, READY, TERMINATING, EndpointSet

STARTING, LOADING, DRAINING, STOPPED, FAILED = "starting", "loading", "draining", "stopped", "failed"
LIVE = (STARTING, LOADING, READY)
KILL_GRACE_S = 5.0     # after the engine's own drain timeout, before SIGKILL
_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the supervisor dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass(eq=False)
class LocalEngine:
    name: str
    port: int
    host: str = "127.0.0.1"
    state: str = STARTING
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    proc: asyncio.subprocess.Process | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class LocalEngines:
    def __init__(self, endpoints: EndpointSet, engine_args: Sequence[str], *,
                 on_change: Callable[[LocalEngine], None] = lambda e: None,
                 on_log: Callable[[str, str], None] = lambda name, line: None,
                 drain_timeout: float = 25.0, host: str = "127.0.0.1", ready_poll: float = 0.25):
        self.endpoints = endpoints
        self.engine_args = list(engine_args)
        self.on_change = on_change
        self.on_log = on_log
        self.drain_timeout = drain_timeout
        self.host = host
        self.ready_poll = ready_poll
        self.engines: list[LocalEngine] = []
        self._next_index = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(2.0))

    # -- ScaleTarget ------------------------------------------------------------------
    async def is_leader(self) -> bool:
        return True

    def live(self) -> list[LocalEngine]:
        return [e for e in self.engines if e.state in LIVE]

    async def get_replicas(self) -> int:
        return len(self.live())

    async def scale(self, replicas: int, victims: Sequence[str] = (), worth: Mapping[str, float] | None = None) -> None:
        live = self.live()
        for _ in range(replicas - len(live)):
            await self.spawn()
        if replicas >= len(live):
            return
        # Engines still loading go first (nothing cached, nothing served), then the
        # victims the autoscaler chose by cache worth, then the newest.
        by_url = {e.url: e for e in live}
        order = [e for e in reversed(live) if e.state != READY]
        order += [by_url[u] for u in victims if u in by_url and by_url[u] not in order]
        order += [e for e in reversed(live) if e not in order]
        for engine in order[:len(live) - replicas]:
            self.stop(engine)

    async def close(self) -> None:
        pass   # the supervisor stops the engines (stop_all) after the gateway

    # -- processes ------------------------------------------------------------------------
    def _publish(self) -> None:
        states = {}
        for e in self.engines:
            if e.state in (STARTING, LOADING):
                states[e.url] = NOT_READY
            elif e.state == READY:
                states[e.url] = READY
            elif e.state == DRAINING:
                states[e.url] = TERMINATING
        self.endpoints.update(states)

    def _set_state(self, engine: LocalEngine, state: str) -> None:
        if engine.state != state:
            engine.state = state
            if state == READY:
                engine.ready_at = time.monotonic()
            self._publish()
            self.on_change(engine)

    async def spawn(self) -> LocalEngine:
        engine = LocalEngine(f"engine-{self._next_index}", free_port(self.host), self.host)
        self._next_index += 1
        self.engines.append(engine)
        cmd = [sys.executable, "-P", "-m", "pagedkube", "serve", "--host", self.host, "--port", str(engine.port),
               *self.engine_args]
        engine.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        self._set_state(engine, LOADING)
        engine.tasks = [asyncio.create_task(self._pump(engine), name=f"{engine.name} log"),
                        asyncio.create_task(self._watch(engine), name=f"{engine.name} watch")]
        return engine

    async def _pump(self, engine: LocalEngine) -> None:
        assert engine.proc is not None and engine.proc.stdout is not None
        async for raw in engine.proc.stdout:
            self.on_log(engine.name, raw.decode(errors="replace").rstrip())

    async def _watch(self, engine: LocalEngine) -> None:
        """Readiness until ready, then the process's exit."""
        proc = engine.proc
        assert proc is not None
        wait = asyncio.ensure_future(proc.wait())
        while engine.state == LOADING and not wait.done():
            try:
                r = await self._client.get(f"{engine.url}/ready")
                if r.status_code == 200 and engine.state == LOADING:
                    self._set_state(engine, READY)
                    break
            except httpx.HTTPError:
                pass
            await asyncio.wait({wait}, timeout=self.ready_poll)
        code = await wait
        self._set_state(engine, STOPPED if engine.state == DRAINING else FAILED)
        if code and engine.state == FAILED:
            self.on_log(engine.name, f"exited with code {code}")

    def stop(self, engine: LocalEngine) -> asyncio.Task | None:
        """Stop routing to it, then SIGTERM (it drains) and SIGKILL after its drain timeout."""
        if engine.state not in LIVE or engine.proc is None:
            return None
        self._set_state(engine, DRAINING)     # terminating in the EndpointSet first
        engine.proc.send_signal(signal.SIGTERM)
        task = asyncio.create_task(self._reap(engine), name=f"{engine.name} stop")
        engine.tasks.append(task)
        return task

    async def _reap(self, engine: LocalEngine) -> None:
        proc = engine.proc
        assert proc is not None
        try:
            await asyncio.wait_for(proc.wait(), self.drain_timeout + KILL_GRACE_S)
        except asyncio.TimeoutError:
            self.on_log(engine.name, "did not exit after its drain timeout: SIGKILL")
            proc.kill()
            await proc.wait()

    async def stop_all(self) -> None:
        for engine in list(self.engines):
            self.stop(engine)
        for engine in list(self.engines):
            if engine.proc is not None and engine.proc.returncode is None:
                await self._reap(engine)
        tasks = [t for e in self.engines for t in e.tasks]
        await asyncio.wait(tasks, timeout=KILL_GRACE_S) if tasks else None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

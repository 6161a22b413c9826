"""Engine processes of `pagedkube up`: the local ScaleTarget, supervised like a process manager.

Each engine is `python -m pagedkube serve --host 127.0.0.1 --port <free> <engine flags>`
in its own session (Ctrl-C in the terminal reaches only the supervisor, which
drains the engines itself) with PR_SET_PDEATHSIG = SIGTERM, so an engine drains
and exits even when the supervisor is SIGKILLed. Every engine of one run wants
the same random API key (PAGEDKUBE_API_KEY, in its environment, not its argv),
which the gateway sends, so engine ports on localhost answer 401 to anyone else,
and the same random cache hash seed (PAGEDKUBE_HASH_SEED), as the operator does.

    state:  starting -> loading -> ready <-> unhealthy
                           ^                    |
                           |    exited, or /health failed N times (killed)
                           |                    v
                           +---- (back-off) - restarting
            any live state -> draining -> stopped    (scale-in, Ctrl-C)

An engine slot (engine-0, ...) keeps its name across restarts and gets a fresh
port each time, so the gateway sees a new endpoint with an empty cache. The
back-off and the health check are restart.py's.

The supervisor, not a probe, tells the gateway's EndpointSet what is routable:
an engine joins as not_ready, turns ready when GET /ready answers 200, turns
not_ready while /health answers an error (unhealthy) and leaves the set when its
process exits; it turns terminating *before* it gets SIGTERM, so no new request
reaches an engine that drains (docs/design.md "Engine server").
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import httpx

from pagedkube.gateway.endpoints import NOT_READY, READY, TERMINATING, EndpointSet
from pagedkube.gateway.local.restart import Backoff, RestartPolicy
from pagedkube.parent_death import die_with_parent

STARTING, LOADING, UNHEALTHY, RESTARTING = "starting", "loading", "unhealthy", "restarting"
DRAINING, STOPPED = "draining", "stopped"
LIVE = (STARTING, LOADING, READY, UNHEALTHY, RESTARTING)
KILL_GRACE_S = 5.0     # after the engine's own drain timeout, before SIGKILL
MAX_LOG_LINE_BYTES = 16 * 1024   # longer engine log lines are shown cut (`up` is for people to read)
READY_POLL_S = 0.25    # GET /ready while loading: the status line turns within a quarter second

# `pagedkube serve`'s exit code for a mistake in its flags or model (one line says which): another
# start would fail the same way, so `up` stops at once before any engine of the run has served.
USAGE_ERROR = 2


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(eq=False)
class LocalEngine:
    name: str
    port: int
    host: str = "127.0.0.1"
    state: str = STARTING
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0                      # processes started after the first
    last_exit: str = ""                    # why the previous process ended
    refused: bool = False                  # it exited with USAGE_ERROR before ready: its flags or model are wrong
    retry_at: float | None = None          # while restarting: when the next process starts
    failed_starts: int = 0                 # processes in a row that ended before ready
    stopping: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)   # stop() ends a back-off wait
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class LocalEngines:
    def __init__(self, endpoints: EndpointSet, engine_args: Sequence[str], *,
                 on_change: Callable[[LocalEngine], None] = lambda e: None,
                 on_log: Callable[[str, str], None] = lambda name, line: None,
                 on_give_up: Callable[[LocalEngine], None] = lambda e: None,
                 drain_timeout: float = 25.0, host: str = "127.0.0.1", ready_poll: float = READY_POLL_S,
                 api_key: str | None = None, hash_seed: str | None = None,
                 policy: RestartPolicy = RestartPolicy()):
        self.endpoints = endpoints
        self.engine_args = list(engine_args)
        self.on_change = on_change
        self.on_log = on_log
        self.on_give_up = on_give_up   # policy.give_up_after failed starts before any engine was ready
        self.ever_ready = False
        self.drain_timeout = drain_timeout
        self.host = host
        self.ready_poll = ready_poll
        self.policy = policy
        secrets = {"PAGEDKUBE_API_KEY": api_key, "PAGEDKUBE_HASH_SEED": hash_seed}
        self.env = {**os.environ, **{k: v for k, v in secrets.items() if v}}   # not argv: `ps` shows that
        self.engines: list[LocalEngine] = []
        self._next_index = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(policy.health_timeout_s))

    removes_not_ready_first = False   # scale() stops the victims it is given
    # -- ScaleTarget ------------------------------------------------------------------
    async def is_leader(self) -> bool:
        return True

    def live(self) -> list[LocalEngine]:
        return [e for e in self.engines if e.state in LIVE and not e.stopping]

    async def get_replicas(self) -> int:
        return len(self.live())

    async def scale(self, replicas: int, victims: Sequence[str] = (), worth: Mapping[str, float] | None = None) -> None:
        live = self.live()
        for _ in range(replicas - len(live)):
            await self.spawn()
        if replicas >= len(live):
            return
        # The victims the autoscaler drained go first (idle by now), then engines not
        # serving (nothing cached, nothing served), then the newest.
        by_url = {e.url: e for e in live}
        order = [by_url[u] for u in victims if u in by_url]
        order += [e for e in reversed(live) if e.state != READY and e not in order]
        order += [e for e in reversed(live) if e not in order]
        for engine in order[:len(live) - replicas]:
            self.stop(engine)

    async def close(self) -> None:
        pass   # the supervisor stops the engines (stop_all) after the gateway

    # -- states ---------------------------------------------------------------------------
    def _publish(self) -> None:
        routable = {STARTING: NOT_READY, LOADING: NOT_READY, UNHEALTHY: NOT_READY, READY: READY,
                    DRAINING: TERMINATING}
        self.endpoints.update({e.url: routable[e.state] for e in self.engines if e.state in routable})

    def _set_state(self, engine: LocalEngine, state: str) -> None:
        if engine.state != state:
            engine.state = state
            if state == READY and engine.ready_at is None:
                engine.ready_at = time.monotonic()
                self.ever_ready = True
            self._publish()
            self.on_change(engine)

    # -- processes ------------------------------------------------------------------------
    async def spawn(self) -> LocalEngine:
        engine = LocalEngine(f"engine-{self._next_index}", free_port(self.host), self.host)
        self._next_index += 1
        self.engines.append(engine)
        await self._start(engine)
        engine.tasks.append(asyncio.create_task(self._supervise(engine), name=f"{engine.name} supervise"))
        return engine

    async def _start(self, engine: LocalEngine) -> None:
        engine.started_at, engine.ready_at, engine.retry_at = time.monotonic(), None, None
        engine.tasks = [t for t in engine.tasks if not t.done()]
        cmd = [sys.executable, "-P", "-m", "pagedkube", "serve", "--host", self.host, "--port", str(engine.port),
               *self.engine_args]
        engine.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=self.env,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)   # SIGTERM: the engine drains
        engine.tasks.append(asyncio.create_task(self._pump(engine.name, engine.proc), name=f"{engine.name} log"))
        if not engine.stopping:
            self._set_state(engine, LOADING)

    async def _pump(self, name: str, proc: asyncio.subprocess.Process) -> None:
        """Relays the engine's output line by line. It reads in chunks, never with
        readline(): a line over the stream's 64 KiB limit would raise there, end this
        task, and leave the engine blocked writing into a pipe nobody reads."""
        assert proc.stdout is not None
        pending, skipping = b"", False   # skipping: the rest of a line already shown cut
        while chunk := await proc.stdout.read(64 * 1024):
            *lines, pending = (pending + chunk).split(b"\n")
            if skipping:
                if not lines:
                    pending = b""
                    continue
                lines, skipping = lines[1:], False
            if len(pending) > MAX_LOG_LINE_BYTES:   # shown cut, not held without bound
                lines.append(pending[:MAX_LOG_LINE_BYTES] + b" [...]")
                pending, skipping = b"", True
            for raw in lines:
                self.on_log(name, raw.decode(errors="replace").rstrip())
        if pending and not skipping:
            self.on_log(name, pending.decode(errors="replace").rstrip())

    async def _supervise(self, engine: LocalEngine) -> None:
        """Run, and after every exit that nobody asked for, wait the back-off and start again."""
        backoff = Backoff(self.policy)
        while True:
            why = await self._run(engine)
            if engine.stopping:
                break
            ready_for = None if engine.ready_at is None else time.monotonic() - engine.ready_at
            engine.failed_starts = engine.failed_starts + 1 if ready_for is None else 0
            engine.refused = ready_for is None and engine.proc is not None and engine.proc.returncode == USAGE_ERROR
            if not self.ever_ready and (engine.failed_starts >= self.policy.give_up_after or engine.refused):
                engine.last_exit = why
                await self._last_words(engine)
                self.on_give_up(engine)
                break
            delay = backoff.delay(ready_for)
            engine.last_exit, engine.retry_at = why, time.monotonic() + delay
            self._set_state(engine, RESTARTING)   # out of the EndpointSet first
            await self._last_words(engine)
            self.on_log(engine.name, f"{why}; restarting in {delay:g} s")
            try:
                await asyncio.wait_for(engine.wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
            if engine.stopping:
                break
            engine.restarts += 1
            engine.port = free_port(self.host)
            await self._start(engine)
            if engine.stopping:   # stop() came while the process was being created
                self._signal(engine, signal.SIGTERM)
                await self._reap(engine)
                break
        self._set_state(engine, STOPPED)

    async def _last_words(self, engine: LocalEngine) -> None:
        """Lets the log relay show what the dead process printed (a traceback) before we speak."""
        logs = [t for t in engine.tasks if t.get_name() == f"{engine.name} log" and not t.done()]
        if logs:
            await asyncio.wait(logs, timeout=1.0)

    async def _run(self, engine: LocalEngine) -> str:
        """One process, until it exits: readiness while loading, then liveness. Returns why it ended."""
        proc = engine.proc
        assert proc is not None
        exited = asyncio.ensure_future(proc.wait())
        failures, killed = 0, ""
        while not exited.done():
            if engine.state == LOADING:
                if await self._probe(engine, "/ready") == 200 and engine.state == LOADING:
                    self._set_state(engine, READY)
                else:
                    await asyncio.wait({exited}, timeout=self.ready_poll)
                continue
            if engine.state not in (READY, UNHEALTHY):
                await exited   # draining: _reap watches the clock
                break
            await asyncio.wait({exited}, timeout=self.policy.health_period_s)
            if exited.done() or engine.state not in (READY, UNHEALTHY):
                continue
            status = await self._probe(engine, "/health")
            if status == 200:
                failures = 0
                self._set_state(engine, READY)
                continue
            failures += 1
            if status is not None:   # it answered, and said it is broken: route around it now
                self._set_state(engine, UNHEALTHY)
            if failures >= self.policy.health_failures:
                killed = f"/health failed {failures} times in a row ({status or 'no answer'}): killed"
                self._signal(engine, signal.SIGKILL)
                await exited
        return killed or f"exited with code {exited.result()}"

    async def _probe(self, engine: LocalEngine, path: str) -> int | None:
        """The HTTP status of GET path, or None for no answer (refused, timed out)."""
        try:
            return (await self._client.get(f"{engine.url}{path}")).status_code
        except httpx.HTTPError:
            return None

    def _signal(self, engine: LocalEngine, sig: int) -> None:
        """To the engine's whole process group: the server and its engine-core child."""
        if engine.proc is not None and engine.proc.returncode is None:
            try:
                os.killpg(engine.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, engine: LocalEngine) -> asyncio.Task | None:
        """Stop routing to it, then SIGTERM (it drains) and SIGKILL after its drain timeout."""
        if engine.stopping or engine.state not in LIVE:
            return None
        engine.stopping = True
        engine.wake.set()
        if engine.state == RESTARTING or engine.proc is None or engine.proc.returncode is not None:
            return None   # no process: the supervise loop ends at once, as stopped
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
            self._signal(engine, signal.SIGKILL)
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

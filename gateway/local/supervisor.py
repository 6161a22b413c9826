"""`pagedkube up`: engines as child processes and the gateway in this process.

    supervisor (this process, one event loop)
      gateway   create_app(GatewayConfig(supervised=True), endpoints=, scale_target=) served by uvicorn
      engines   LocalEngines: spawn / drain `pagedkube serve` children, feed the
                gateway's EndpointSet, and act as the autoscaler's ScaleTarget

Start: spawn the initial engines, then serve the gateway (its autoscaler, if
on, sees them from its first tick). Stop (Ctrl-C / SIGTERM, or the gateway
failing): stop the gateway (no new requests), then drain every engine, SIGKILL
stragglers, and return; PDEATHSIG covers a supervisor that is SIGKILLed.

Meanwhile LocalEngines restarts engines that exit or stop answering /health
(restart.py). Each run draws a random engine API key: the engines require it
and the gateway sends it (--engine-api-key), so nothing else on this machine can
use an engine port directly, bypassing the gateway's keys and tenant salts; and a
random cache hash seed, shared by its engines (restarts included).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import time

from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.local.config import UpConfig
from pagedkube.gateway.local.console import ComponentLogHandler, Console
from pagedkube.gateway.local.engines import READY, RESTARTING, USAGE_ERROR, LocalEngine, LocalEngines


def curl_line(host: str, port: int, model: str) -> str:
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return (f"curl http://{host}:{port}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": "
            f"\"How often should I feed my puppy?\"}}], \"max_tokens\": 32}}'")


def _quiet_server(config):
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):   # the supervisor owns SIGINT/SIGTERM
            yield

    return Server(config)


class Supervisor:
    def __init__(self, config: UpConfig, console: Console | None = None):
        self.config = config
        self.console = console or Console()
        self.stop_requested = asyncio.Event()
        self.engines: LocalEngines | None = None
        self.gateway = None
        self._announced = False
        self.gave_up: LocalEngine | None = None

    def _on_give_up(self, engine: LocalEngine) -> None:
        self.gave_up = engine
        if engine.refused:
            self.console.log("up", f"{engine.name} refused its configuration ({engine.last_exit}): giving up; "
                                   f"its error is above")
        else:
            self.console.log("up", f"{engine.name} ended {engine.failed_starts} times without getting ready "
                                   f"(last: {engine.last_exit}) and no engine of this run has served: giving up; "
                                   f"its errors are above")
        self.stop_requested.set()

    def _on_engine(self, engine: LocalEngine) -> None:
        notes = []
        if engine.state == READY and engine.ready_at is not None:
            notes.append(f"loaded in {engine.ready_at - engine.started_at:.1f} s")
        if engine.state == RESTARTING and engine.retry_at is not None:
            notes.append(f"{engine.last_exit}; next start in {max(0.0, engine.retry_at - time.monotonic()):.0f} s")
        if engine.restarts:
            notes.append(f"restarts {engine.restarts}")
        detail = engine.url + (f"  ({', '.join(notes)})" if notes else "")
        self.console.set_state(engine.name, engine.state, detail)
        if engine.state == READY and not self._announced:
            self._announced = True
            self.console.log("up", "ready; try:")
            self.console.log("up", curl_line(self.config.host, self.config.port, self.config.model_name))

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.console.tick()

    async def run(self) -> int:
        from pagedkube.gateway.app import create_app
        from pagedkube.gateway.config import GatewayConfig
        from pagedkube.gateway.errors import error_body
        from pagedkube.http_head_limits import limited_http_protocol

        import uvicorn

        c = self.config
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_requested.set)
        handler = ComponentLogHandler(self.console)
        for name in ("pagedkube.gateway", "pagedkube.autoscaler", "uvicorn.error"):
            logger = logging.getLogger(name)
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False

        try:   # uvicorn exits the process on a bind error: find out before any engine starts
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((c.host, c.port))
        except OSError as e:
            self.console.log("up", f"cannot listen on {c.host}:{c.port}: {e}")
            return 1
        # This run's engine key and cache hash seed, 256 random bits each; never printed.
        api_key, hash_seed = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        gateway_config = GatewayConfig(supervised=True, host=c.host, port=c.port, routing=c.routing,
                                       hold_timeout=c.hold_timeout, autoscale=c.autoscale, route_headers=c.route_headers,
                                       scrape_interval=c.scrape_interval, engine_api_key=api_key,
                                       observability=c.observability)
        # The engines fill the gateway's endpoint set and are its autoscaler's scale target.
        endpoints = EndpointSet(gateway_config.eject_after_failures, gateway_config.eject_seconds)
        self.engines = LocalEngines(endpoints, c.engine_args, on_change=self._on_engine,
                                    on_log=self.console.log, on_give_up=self._on_give_up, drain_timeout=c.drain_timeout, api_key=api_key,
                                    hash_seed=hash_seed)
        app = create_app(gateway_config, endpoints=endpoints,
                         scale_target=self.engines if c.autoscale is not None else None)
        self.gateway = app.state.gateway
        self.console.set_state("gateway", "starting", f"http://{c.host}:{c.port}")
        http = limited_http_protocol(gateway_config.head_limits, error_body)
        server = _quiet_server(uvicorn.Config(app, host=c.host, port=c.port, log_config=None, http=http,
                                              access_log=False, timeout_graceful_shutdown=5))
        progress = asyncio.create_task(self._progress())
        code = 0
        try:
            await self.engines.scale(c.initial_replicas())
            serving = asyncio.create_task(server.serve(), name="gateway")
            while not server.started and not serving.done():
                await asyncio.sleep(0.05)
            if server.started:
                # "listening", not "ready": requests succeed once an engine is ready ("up | ready; try:")
                self.console.set_state("gateway", "listening", f"http://{c.host}:{c.port}")
                if c.initial_replicas() == 0:
                    self.console.log("up", "no engine yet: the first request starts one; try:")
                    self.console.log("up", curl_line(c.host, c.port, c.model_name))
                stopped = asyncio.create_task(self.stop_requested.wait())
                await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
            if serving.done() and not self.stop_requested.is_set():
                code = 1   # the gateway could not start or stopped by itself (port in use?)
            if self.gave_up is not None:
                code = USAGE_ERROR if self.gave_up.refused else 1
            self.console.log("up", "stopping: gateway first, then draining the engines")
            self.console.set_state("gateway", "draining", f"http://{c.host}:{c.port}")
            server.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
            self.console.set_state("gateway", "stopped", f"http://{c.host}:{c.port}")
        finally:
            progress.cancel()
            await self.engines.stop_all()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        self.console.log("up", "all stopped")
        return code

"""Forwards one request to the engines of a routing decision, in order.

* Connect errors and 5xx answered before the first byte go to the next
  endpoint (at most `max_attempts`); each counts toward that endpoint's
  passive-health ejection (a 503, an engine shedding load, does not).
* The response passes through unchanged: status, body bytes (streamed as they
  come for SSE), headers less hop-by-hop ones, plus x-pagedkube-endpoint and
  x-pagedkube-route.
* A client that disconnects cancels the upstream request: while waiting for
  the engine we race its answer against the client's http.disconnect; while
  streaming, Starlette stops the body iterator and we close the upstream.

The upstream client is aiohttp, not httpx: per request it costs a fraction of
httpx's (the gateway's overhead was mostly the proxy hop).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import aiohttp
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.errors import GatewayError, upstream_timeout, upstream_unreachable
from pagedkube.gateway.metrics import GatewayMetrics, SSEUsageScanner, cached_tokens_of
from pagedkube.gateway.routing.types import Decision

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "host", "content-length"}
# The gateway's own server sets these; passing the engine's too would duplicate them.
_DROP_RESPONSE = _HOP_BY_HOP | {"date", "server"}
# accept-encoding is dropped so engines answer uncompressed: usage is read from the bytes.
_DROP_REQUEST = _HOP_BY_HOP | {"accept-encoding"}


class ClientGone(Exception):
    pass


@dataclass(slots=True)
class ProxyOptions:
    max_attempts: int = 3
    upstream_timeout: float = 600.0
    strip_authorization: bool = False
    route_headers: bool = True
    engine_authorization: str | None = None   # replaces the client's Authorization upstream


async def _until_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _race_disconnect(watcher: asyncio.Future, awaitable: Awaitable):
    """Awaits `awaitable` unless the client leaves first (`watcher`, which waits
    for http.disconnect, finishes): then it is cancelled and ClientGone raised."""
    task = asyncio.ensure_future(awaitable)

    def client_gone(_: asyncio.Future) -> None:
        task.cancel()

    watcher.add_done_callback(client_gone)
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled() and watcher.done() and not watcher.cancelled():
            raise ClientGone() from None
        raise
    finally:
        watcher.remove_done_callback(client_gone)


class Proxy:
    def __init__(self, client: aiohttp.ClientSession, endpoints: EndpointSet, metrics: GatewayMetrics,
                 options: ProxyOptions):
        self.client = client
        self.endpoints = endpoints
        self.metrics = metrics
        self.options = options

    def _request_headers(self, request: Request) -> dict[str, str]:
        own = self.options.engine_authorization
        drop = _DROP_REQUEST | ({"authorization"} if self.options.strip_authorization or own else set())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in drop}
        if own:
            headers["Authorization"] = own
        return headers

    def _response_headers(self, upstream: aiohttp.ClientResponse, url: str, decision: Decision) -> dict[str, str]:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
        if self.options.route_headers:
            headers["x-pagedkube-endpoint"] = url
            headers["x-pagedkube-route"] = decision.reason
        return headers

    async def forward(self, request: Request, path: str, body: bytes, decision: Decision,
                      model_label: str, started: float) -> Response:
        # One watcher for the client's http.disconnect for the whole wait (all
        # attempts and a non-streamed body); a streamed body is Starlette's to watch.
        watcher = asyncio.ensure_future(_until_disconnect(request.receive))
        try:
            return await self._forward(request, watcher, path, body, decision, model_label, started)
        finally:
            watcher.cancel()

    async def _forward(self, request: Request, watcher: asyncio.Future, path: str, body: bytes,
                       decision: Decision, model_label: str, started: float) -> Response:
        headers = self._request_headers(request)
        last: GatewayError | Response | None = None
        for attempt, url in enumerate(decision.endpoints[:self.options.max_attempts]):
            self.endpoints.acquire(url)
            try:
                upstream = await _race_disconnect(watcher, self.client.post(url + path, data=body, headers=headers))
            except ClientGone:
                self.endpoints.release(url)
                self._count(model_label, 499, started)
                return Response(status_code=499)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                self.endpoints.release(url)
                self.endpoints.report_failure(url)
                self.metrics.retries.labels("connect").inc()
                last = upstream_unreachable(f"{url}: {type(e).__name__}")
                continue
            except asyncio.TimeoutError:
                self.endpoints.release(url)
                self.endpoints.report_failure(url)
                return self._error(upstream_timeout(self.options.upstream_timeout), model_label, started)
            except aiohttp.ClientError as e:
                # The connection broke before any response byte (e.g. the engine closed
                # a kept-alive connection as we reused it, or died mid-request): the
                # client has seen nothing yet, so the next engine may answer instead.
                self.endpoints.release(url)
                self.endpoints.report_failure(url)
                self.metrics.retries.labels("network").inc()
                last = upstream_unreachable(f"{url}: {type(e).__name__}")
                continue
            if upstream.status >= 500:
                try:
                    content = await upstream.read()
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    content = b""
                upstream.release()
                self.endpoints.release(url)
                if upstream.status != 503:
                    self.endpoints.report_failure(url)
                self.metrics.retries.labels(str(upstream.status)).inc()
                last = Response(content, upstream.status, self._response_headers(upstream, url, decision))
                continue
            self.endpoints.report_success(url)
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                watcher.cancel()
                return self._stream(upstream, url, decision, model_label, started)
            return await self._whole(watcher, upstream, url, decision, model_label, started)
        if isinstance(last, Response):
            self._count(model_label, last.status_code, started)
            return last
        return self._error(last or upstream_unreachable("no endpoint"), model_label, started)

    async def _whole(self, watcher: asyncio.Future, upstream: aiohttp.ClientResponse, url: str, decision: Decision,
                     model_label: str, started: float) -> Response:
        try:
            content = await _race_disconnect(watcher, upstream.read())
        except ClientGone:
            upstream.close()
            self._count(model_label, 499, started)
            return Response(status_code=499)
        except asyncio.TimeoutError:
            upstream.close()
            return self._error(upstream_timeout(self.options.upstream_timeout), model_label, started)
        except aiohttp.ClientError as e:  # broke off mid-body: too late to retry (the engine did the work)
            upstream.close()
            return self._error(upstream_unreachable(f"{url}: {type(e).__name__} while reading the answer"),
                               model_label, started)
        finally:
            upstream.release()  # back to the pool if read to the end, else closed
            self.endpoints.release(url)
        if 200 <= upstream.status < 300 and b"cached_tokens" in content:
            try:
                cached = cached_tokens_of(json.loads(content).get("usage"))
            except (ValueError, AttributeError):
                cached = None
            if cached:
                self.metrics.realized_cached_tokens.inc(cached)
        self._count(model_label, upstream.status, started)
        return Response(content, upstream.status, self._response_headers(upstream, url, decision))

    def _stream(self, upstream: aiohttp.ClientResponse, url: str, decision: Decision, model_label: str,
                started: float) -> Response:
        scanner = SSEUsageScanner()
        state = {"done": False, "code": upstream.status}

        async def body():
            first = True
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        self.metrics.ttft.labels(model_label).observe(time.monotonic() - started)
                        first = False
                    scanner.feed(chunk)
                    yield chunk
            except (aiohttp.ClientError, asyncio.TimeoutError):
                state["code"] = 502  # the engine broke off mid-stream; the client sees a cut stream

        async def cleanup() -> None:
            if state["done"]:
                return
            state["done"] = True
            if upstream.content.at_eof():
                upstream.release()
            else:
                upstream.close()  # cut short: the engine sees the connection go and stops
            self.endpoints.release(url)
            if scanner.cached_tokens:
                self.metrics.realized_cached_tokens.inc(scanner.cached_tokens)
            self._count(model_label, state["code"], started)

        return _CleanupStreamingResponse(body(), cleanup, status_code=upstream.status,
                                         headers=self._response_headers(upstream, url, decision))

    def _count(self, model_label: str, code: int, started: float) -> None:
        self.metrics.requests.labels(model_label, str(code)).inc()
        self.metrics.request_duration.labels(model_label).observe(time.monotonic() - started)

    def _error(self, error: GatewayError, model_label: str, started: float) -> Response:
        self._count(model_label, error.status, started)
        return error.response()


class _CleanupStreamingResponse(StreamingResponse):
    """Runs `cleanup` however the response ends: finished, client gone before
    or during the body, or cancelled."""

    def __init__(self, content, cleanup: Callable[[], Awaitable[None]], **kwargs):
        super().__init__(content, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await asyncio.shield(self._cleanup())

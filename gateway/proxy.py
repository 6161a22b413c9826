"""Forwards one request to the engines of a routing decision, in order.

* Connect errors and 5xx answered before the first byte go to the next
  endpoint (at most `max_attempts`); each counts toward that endpoint's
  passive-health ejection (a 503, an engine shedding load, does not).
* An engine that answers 503 `draining` or `not_ready` did no work: the answer
  is not an attempt, and the request goes on to every other engine routable
  now, waiting up to `hold_timeout` for one when none is. A draining engine
  also leaves the routable set at once (discovery may lag it by seconds). Only
  when no engine answers does the client see a 503.
* The response passes through unchanged: status, body bytes (streamed as they
  come for SSE), headers less hop-by-hop ones, plus x-pagedkube-endpoint and
  x-pagedkube-route when `route_headers` is on (off by default: they show
  internal addresses to every client).
* A stream is committed once its headers go out, so a failure after that
  (the engine died, the connection broke, no byte within the upstream
  timeout, or the stream ended without `data: [DONE]`) cannot be retried: the
  stream ends with an OpenAI-style error event, `data: {"error": {...}}`, and
  no `[DONE]`, so clients (the official `openai` one raises APIError) never
  take a truncated answer for a whole one. SSE events are passed on whole
  (the bytes after the last blank line wait for the rest of their event), so
  the error event never lands inside a half-sent one. It is counted as a 502
  in requests_total and in `stream_errors_total{cause}`.
* A client that disconnects cancels the upstream request: while waiting for
  the engine we race its answer against the client's http.disconnect; while
  streaming, Starlette stops the body iterator and we close the upstream.

Every response is counted once by gateway/counting.py; this module only fills
in the request's Outcome.

The upstream client is aiohttp, not httpx: per request it costs a fraction of
httpx's (the gateway's overhead was mostly the proxy hop).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive

from pagedkube.gateway.counting import Outcome
from pagedkube.gateway.endpoints import TERMINATING, EndpointSet
from pagedkube.gateway.errors import GatewayError, stream_broken, upstream_timeout, upstream_unreachable
from pagedkube.gateway.metrics import GatewayMetrics, SSEUsageScanner, cached_tokens_of
from pagedkube.gateway.routing.types import Decision
from pagedkube.openai_errors import DID_NOT_START, DRAINING, sse_error_event

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
    route_headers: bool = False   # x-pagedkube-endpoint / -route (GatewayConfig.route_headers)
    engine_authorization: str | None = None   # replaces the client's Authorization upstream
    hold_timeout: float = 0.0   # after a drain answer with no engine left, wait this long for one


# Of the 503 codes of an engine that did not start the request (DID_NOT_START), only a
# draining engine is taken out of routing here: it never comes back (its pod is going). A
# not-ready one may recover without its EndpointSlice changing, and with EndpointSlices
# nothing else would put it back.


def _did_not_start(status: int, content: bytes) -> str | None:
    """The engine's 503 code when its answer says it did not start the request, else None."""
    if status != 503:
        return None
    try:
        code = json.loads(content)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if code in DID_NOT_START else None


async def _until_disconnect(receive: Receive) -> None:
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
                      outcome: Outcome, started: float) -> Response:
        # One watcher for the client's http.disconnect for the whole wait (all
        # attempts and a non-streamed body); a streamed body is Starlette's to watch.
        watcher = asyncio.ensure_future(_until_disconnect(request.receive))
        try:
            return await self._forward(request, watcher, path, body, decision, outcome, started)
        finally:
            watcher.cancel()

    async def _forward(self, request: Request, watcher: asyncio.Future, path: str, body: bytes,
                       decision: Decision, outcome: Outcome, started: float) -> Response:
        headers = self._request_headers(request)
        last: GatewayError | Response | None = None
        queue, attempts, wait_for_other = list(decision.endpoints), 0, False
        tried: set[str] = set()
        while attempts < self.options.max_attempts:
            if not queue and tried:
                try:
                    queue = await _race_disconnect(watcher, self._others(tried, wait=wait_for_other))
                except ClientGone:
                    return Response(status_code=499)
            if not queue:
                break
            url = queue.pop(0)
            if url in tried:
                continue
            tried.add(url)
            attempts += 1
            self.endpoints.acquire(url)
            try:
                upstream = await _race_disconnect(watcher, self.client.post(url + path, data=body, headers=headers))
            except ClientGone:
                self.endpoints.release(url)
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
                return upstream_timeout(self.options.upstream_timeout).response()
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
                if code := _did_not_start(upstream.status, content):
                    if code == DRAINING:
                        self.endpoints.set_discovered(url, TERMINATING)
                    attempts -= 1   # no work was done: not an attempt
                    wait_for_other = True
                continue
            self.endpoints.report_success(url)
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                watcher.cancel()
                return self._stream(upstream, url, decision, outcome, started)
            return await self._whole(watcher, upstream, url, decision)
        if isinstance(last, Response):
            return last
        return (last or upstream_unreachable("no endpoint")).response()

    async def _others(self, tried: set[str], wait: bool) -> list[str]:
        """Endpoints routable now that this request has not tried (the decision predates an
        engine saying it is leaving); with `wait`, up to hold_timeout for one to appear."""
        others = [u for u in self.endpoints.routable() if u not in tried]
        if others or not wait or self.options.hold_timeout <= 0:
            return others
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.hold_timeout
        while not others and (left := deadline - loop.time()) > 0:
            await self.endpoints.changed(left)
            others = [u for u in self.endpoints.routable() if u not in tried]
        return others

    async def _whole(self, watcher: asyncio.Future, upstream: aiohttp.ClientResponse, url: str,
                     decision: Decision) -> Response:
        try:
            content = await _race_disconnect(watcher, upstream.read())
        except ClientGone:
            upstream.close()
            return Response(status_code=499)
        except asyncio.TimeoutError:
            upstream.close()
            return upstream_timeout(self.options.upstream_timeout).response()
        except aiohttp.ClientError as e:  # broke off mid-body: too late to retry (the engine did the work)
            upstream.close()
            return upstream_unreachable(f"{url}: {type(e).__name__} while reading the answer").response()
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
        return Response(content, upstream.status, self._response_headers(upstream, url, decision))

    def _stream(self, upstream: aiohttp.ClientResponse, url: str, decision: Decision, outcome: Outcome,
                started: float) -> Response:
        scanner = SSEUsageScanner()
        state = {"done": False}
        model = outcome.model

        async def body() -> AsyncIterator[bytes]:
            first = True
            tail = b""   # the bytes after the last blank line: an event still arriving
            failure: str | None = None
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        self.metrics.ttft.labels(model).observe(time.monotonic() - started)
                        first = False
                    scanner.feed(chunk)
                    tail += chunk
                    end = _events_end(tail)
                    if end:
                        out, tail = tail[:end], tail[end:]
                        yield out
            except asyncio.TimeoutError:   # before ClientError: aiohttp's read timeout is both
                failure = "timeout"
            except aiohttp.ClientError as e:
                failure = "broken"
                detail = f"{type(e).__name__} from {url}"
            else:
                if scanner.done or scanner.error:
                    if tail:
                        yield tail   # the stream's last bytes: nothing follows them
                else:
                    failure = "eof"   # a clean close without [DONE]: the tail, if any, is half an event
            if failure is None:
                return
            outcome.code = 502
            self.metrics.stream_errors.labels(failure).inc()
            if failure == "timeout":
                detail = f"no byte from {url} within {self.options.upstream_timeout:g} s"
            elif failure == "eof":
                detail = f"{url} ended the stream without [DONE]"
            yield sse_error_event(stream_broken(detail).body()).encode()

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

        return _CleanupStreamingResponse(body(), cleanup, status_code=upstream.status,
                                         headers=self._response_headers(upstream, url, decision))


def _events_end(buf: bytes) -> int:
    """The index just past the last blank line in `buf` (the end of its last whole SSE
    event), or 0. A blank line is two line ends in a row: LF, CRLF or CR (the SSE spec)."""
    end = 0
    for blank in (b"\n\n", b"\n\r\n", b"\r\r"):
        at = buf.rfind(blank)
        if at >= 0:
            end = max(end, at + len(blank))
    return end


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

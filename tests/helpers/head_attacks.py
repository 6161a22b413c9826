"""Clients that abuse a request head, over raw sockets (no HTTP library sends these):
an oversized header, thousands of headers, headers sent a byte at a time. Used by
tests/pagedkube/test_http_head_limits.py and tests/gateway/test_head_limits.py."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field

import psutil

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int | None      # None: the connection ended without an HTTP answer
    body: bytes
    sent: int               # bytes this client got into the socket before the answer


def parse(data: bytes) -> tuple[int | None, bytes]:
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    data = b""
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


async def send_head(port: int, head: bytes, chunk: int = 65536) -> Answer:
    """Sends `head` (never finished with an empty line unless it has one) and reads the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    try:
        for i in range(0, len(head), chunk):
            writer.write(head[i:i + chunk])
            await writer.drain()
            sent += len(head[i:i + chunk])
    except (ConnectionResetError, BrokenPipeError):
        pass
    status, body = parse(await read_answer(reader))
    writer.close()
    return Answer(status, body, sent)


async def slow_head(port: int, interval_s: float, give_up_after: int) -> Answer:
    """Sends a head one byte every `interval_s` seconds, forever unless answered; gives up
    (status None) after `give_up_after` bytes of header value."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD + b"X-Slow: ")
    sent = len(HEAD) + 8
    data = b""
    try:
        for _ in range(2 * give_up_after):   # bounded even if an answer began and never ends
            if sent >= len(HEAD) + 8 + give_up_after:
                break
            try:   # one read at a time: a read cut by the timeout loses nothing it had read
                chunk = await asyncio.wait_for(reader.read(65536), interval_s)
            except asyncio.TimeoutError:
                if not data:   # no answer begun: one more byte of header
                    writer.write(b"a")
                    await writer.drain()
                    sent += 1
                continue
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        data += await read_answer(reader)
    writer.close()
    status, body = parse(data)
    return Answer(status, body, sent)


def big_header(size: int) -> bytes:
    return HEAD + b"X-Big: " + b"a" * size + b"\r\n\r\n"


def many_headers(count: int) -> bytes:
    return HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(count)) + b"\r\n"


def get(port: int, path: str = "/health") -> int:
    """One plain GET on its own connection: the status."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return parse(data)[0]


@dataclass
class RssPeak:
    """The most resident memory a process (and none of its children) reached while the block ran."""
    pid: int
    baseline: int = 0
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "RssPeak":
        proc = psutil.Process(self.pid)
        self.baseline = self.peak = proc.memory_info().rss

        def sample() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, proc.memory_info().rss)
                time.sleep(0.02)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

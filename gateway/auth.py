"""API keys, per-key rate limits and per-tenant cache salts.

File format (docs/interfaces.md "API keys file"):

    keys:
      - key: sk-tenant-a-123        # the bearer token
        name: tenant-a              # shown in metrics and logs
        requests_per_minute: 60     # optional; 429 with Retry-After beyond it
        cache_salt: tenant-a        # optional; defaults to the name

Keys are looked up by their sha256, so the table holds no plaintext and a
lookup does not leak, through timing, how much of a guess matched.

Rate limits are a token bucket per key (capacity = requests_per_minute,
refilled at requests_per_minute / 60 per second), kept per gateway replica:
with R replicas behind a Service a key can reach up to R times its limit.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    cache_salt: str
    requests_per_minute: int | None = None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class ApiKeys:
    def __init__(self, entries: list[dict]):
        self._by_digest: dict[bytes, ApiKey] = {}
        names: set[str] = set()
        for i, entry in enumerate(entries):
            where = f"api keys entry {i}"
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: expected a mapping, got {type(entry).__name__}")
            unknown = set(entry) - {"key", "name", "requests_per_minute", "cache_salt"}
            if unknown:
                raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
            token, name = entry.get("key"), entry.get("name")
            if not isinstance(token, str) or not token:
                raise ValueError(f"{where}: 'key' must be a non-empty string")
            if not isinstance(name, str) or not name:
                raise ValueError(f"{where}: 'name' must be a non-empty string")
            rpm = entry.get("requests_per_minute")
            if rpm is not None and (not isinstance(rpm, int) or isinstance(rpm, bool) or rpm <= 0):
                raise ValueError(f"{where} ({name}): requests_per_minute must be a positive integer, got {rpm!r}")
            salt = entry.get("cache_salt", name)
            if not isinstance(salt, str) or not salt:
                raise ValueError(f"{where} ({name}): cache_salt must be a non-empty string")
            if name in names:
                raise ValueError(f"{where}: duplicate name {name!r}")
            digest = _digest(token)
            if digest in self._by_digest:
                raise ValueError(f"{where} ({name}): duplicate key")
            names.add(name)
            self._by_digest[digest] = ApiKey(name=name, cache_salt=salt, requests_per_minute=rpm)

    @classmethod
    def from_file(cls, path: str | Path) -> "ApiKeys":
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"cannot read api keys file {path}: {e}") from e
        except yaml.YAMLError as e:
            raise ValueError(f"api keys file {path} is not valid YAML: {e}") from e
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ValueError(f"api keys file {path} must be a mapping with a 'keys' list")
        return cls(data["keys"])

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, authorization: str | None) -> ApiKey | None:
        """The key for an `Authorization: Bearer <token>` header, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self._by_digest.get(_digest(token.strip()))


class RateLimiter:
    """Token buckets keyed by API key name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, last refill time)

    def acquire(self, name: str, requests_per_minute: int | None) -> float | None:
        """Takes one request from the key's bucket. Returns None when allowed,
        else the seconds until the next request would be."""
        if requests_per_minute is None:
            return None
        now = self.clock()
        rate = requests_per_minute / 60.0
        tokens, last = self._buckets.get(name, (float(requests_per_minute), now))
        tokens = min(float(requests_per_minute), tokens + (now - last) * rate)
        if tokens >= 1.0:
            self._buckets[name] = (tokens - 1.0, now)
            return None
        self._buckets[name] = (tokens, now)
        return (1.0 - tokens) / rate


def retry_after_header(seconds: float) -> str:
    """Retry-After takes whole seconds; round up so a client that waits is let in."""
    return str(max(1, math.ceil(seconds)))

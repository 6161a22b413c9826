"""Background loops that follow each engine: its cache feed, its load and
(for a static endpoint list) its readiness; and the tokenizer fetch.

Per endpoint, two tasks:
  feed    GET /v1/cache/config once (and after a restart), then
          GET /v1/cache/events?after=SEQ&wait=`feed_wait` -> PrefixIndex, a
          long-poll the engine answers as soon as it records an event; the
          next starts `feed_interval` after the last (which batches a busy
          engine's events), at once after a long-poll that waited
  scrape  GET /metrics every `scrape_interval`, parsed once
          (gateway/engine_metrics.py: running, waiting, prefix-cache hits,
          LoRA adapter slots)
          -> EndpointSet.set_scraped, with this gateway's own in-flight count
          around the scrape; the router, the autoscaler and the gateway's
          metrics all read that; GET /ready when probing;
          GET /v1/models now and then -> the known model names
The first engine whose cache config is read fixes the gateway's block size and
hash seed and serves the tokenizer (GET /v1/cache/tokenizer); an engine with a
different config gets no affinity (its feed is ignored) rather than silently
wrong hashes (docs/design.md, pitfall "Block size or hash seed mismatches").
"""
from __future__ import annotations

import asyncio
import time
import logging

import httpx

from pagedkube import hashing
from pagedkube.gateway.endpoints import NOT_READY, READY, EndpointSet
from pagedkube.gateway.engine_metrics import parse_engine_metrics
from pagedkube.gateway.prompt import CurrentHasher, PromptHasher
from pagedkube.gateway.routing.prefix_index import PrefixIndex
from pagedkube.tokenizer import Tokenizer

log = logging.getLogger("pagedkube.gateway")

_MODELS_EVERY = 10          # scrape ticks between /v1/models refreshes
_MODELS_MIN_GAP_S = 0.1     # least time between two reads asked for by requests for unknown models
_TOKENIZER_RETRY_S = 10.0
_MAX_BACKOFF_S = 2.0


class EngineWatcher:
    def __init__(self, endpoints: EndpointSet, index: PrefixIndex, client: httpx.AsyncClient,
                 prompt: CurrentHasher, *, probe_ready: bool, feed_interval: float = 0.05,
                 feed_wait: float = 5.0, scrape_interval: float = 1.0):
        self.endpoints = endpoints
        self.index = index
        self.client = client
        self.probe_ready = probe_ready
        self.feed_interval = feed_interval
        self.feed_wait = feed_wait
        self.scrape_interval = scrape_interval
        self.prompt = prompt                    # the request path's hasher: replaced here, read there
        self.cache_config: dict | None = None   # the config the hasher follows
        self.models: dict[str, list[dict]] = {}
        self.feed_seq: dict[str, int] = {}      # the last cache-feed seq applied, per endpoint
        self.feed_heard: dict[str, float] = {}  # time.monotonic() of each endpoint's last feed answer (feed_metrics.py)
        self._tasks: dict[str, list[asyncio.Task]] = {}
        self._tokenizer_lock = asyncio.Lock()
        self._tokenizer_next_try = 0.0
        self._models_refresh: asyncio.Task | None = None
        self._models_refreshed_at = float("-inf")

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        self.endpoints.subscribe(self._on_change)
        self._on_change(set(self.endpoints.urls()), set())

    def _on_change(self, added: set[str], removed: set[str]) -> None:
        for url in removed:
            for task in self._tasks.pop(url, []):
                task.cancel()
            self.index.drop(url)
            self.models.pop(url, None)
            self.feed_seq.pop(url, None)
            self.feed_heard.pop(url, None)
        for url in added:
            if url not in self._tasks:
                self._tasks[url] = [asyncio.create_task(self._follow_feed(url), name=f"feed {url}"),
                                    asyncio.create_task(self._scrape(url), name=f"scrape {url}")]

    async def stop(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def max_model_len(self) -> int | None:
        """The longest context any engine's models allow (vLLM's /v1/models field), None while unknown."""
        lengths = [n for models in self.models.values() for m in models
                   if isinstance(n := m.get("max_model_len"), int) and not isinstance(n, bool) and n > 0]
        return max(lengths) if lengths else None

    def known_models(self) -> set[str] | None:
        """Model names the ready engines serve; None while no engine has answered."""
        ready = set(self.endpoints.routable())
        names = {name for url, models in self.models.items() if url in ready for m in models
                 if isinstance(name := m.get("id"), str)}
        return names or None

    async def refresh_models(self) -> None:
        """Reads every ready engine's /v1/models, as of now: a request named a model the last reads
        lack (an adapter loaded since, which the gateway's own /v1/models, read live, already
        lists). Returns once a read that started after the call has finished. Callers share reads,
        and a read starts no sooner than _MODELS_MIN_GAP_S after the last (the caller waits), so
        requests for made-up names cost at most 1 / _MODELS_MIN_GAP_S reads a second."""
        asked = time.monotonic()
        while True:
            task = self._models_refresh
            if task is not None and self._models_refreshed_at >= asked:
                await asyncio.shield(task)          # started after we asked: as of now
                return
            if task is not None and not task.done():
                await asyncio.shield(task)          # older than our question: wait, then read again
                continue
            wait = self._models_refreshed_at + _MODELS_MIN_GAP_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._models_refreshed_at = time.monotonic()
            self._models_refresh = asyncio.create_task(self._read_models(self.endpoints.routable()))

    async def _read_models(self, urls: list[str]) -> None:
        async def one(url: str) -> None:
            try:
                r = await self.client.get(f"{url}/v1/models")
                if r.status_code == 200 and url in self._tasks:   # still followed
                    self.models[url] = list(r.json().get("data", []))
            except (httpx.HTTPError, ValueError, AttributeError) as e:
                log.debug("models of %s: %s", url, e)
        await asyncio.gather(*(one(u) for u in urls))

    def adapter_names(self) -> set[str]:
        """The LoRA adapters the ready engines serve: /v1/models cards with a `parent` (the base)."""
        ready = set(self.endpoints.routable())
        return {m["id"] for url, models in self.models.items() if url in ready for m in models
                if isinstance(m.get("id"), str) and isinstance(m.get("parent"), str)}

    def served_adapters(self) -> dict[str, set[str]]:
        """Each ready engine's LoRA adapters (its /v1/models cards with a `parent`), by URL."""
        ready = self.endpoints.routable()
        return {url: {m["id"] for m in self.models.get(url, ()) if isinstance(m.get("id"), str)
                      and isinstance(m.get("parent"), str)} for url in ready}

    def serving(self, model: str, urls: list[str]) -> list[str]:
        """Those of `urls` whose /v1/models lists `model` (an adapter lives on some engines only)."""
        return [url for url in urls if any(m.get("id") == model for m in self.models.get(url, ()))]

    # -- cache feed ---------------------------------------------------------------
    def _config_matches(self, config: dict) -> bool:
        mine = self.cache_config
        keys = ("block_size", "hash_algorithm", "hash_seed")
        return mine is not None and all(mine.get(k) == config.get(k) for k in keys)

    async def _adopt_config(self, url: str, config: dict) -> None:
        if config.get("hash_algorithm") != hashing.HASH_ALGORITHM:
            log.warning("engine %s hashes with %r, not %r: no prefix affinity for it",
                        url, config.get("hash_algorithm"), hashing.HASH_ALGORITHM)
            return
        if self.cache_config is None:
            self.cache_config = {k: config.get(k) for k in ("block_size", "hash_algorithm", "hash_seed")}
            self.prompt.hasher = PromptHasher(None, int(config["block_size"]), config.get("hash_seed") or "",
                                              self.prompt.hasher.ring_key_blocks)
        if self.prompt.hasher.tokenizer is None and self._config_matches(config):
            await self._load_tokenizer(url)

    async def _load_tokenizer(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        async with self._tokenizer_lock:
            if self.prompt.hasher.tokenizer is not None or loop.time() < self._tokenizer_next_try:
                return
            try:
                r = await self.client.get(f"{url}/v1/cache/tokenizer")
                r.raise_for_status()
                tokenizer = await asyncio.to_thread(Tokenizer, r.json()["files"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
                self._tokenizer_next_try = loop.time() + _TOKENIZER_RETRY_S
                log.warning("no tokenizer from %s (%s): routing falls back to raw-text keys", url, e)
                return
            old = self.prompt.hasher
            self.prompt.hasher = PromptHasher(tokenizer, old.block_size, old.seed, old.ring_key_blocks)
            log.info("tokenizer loaded from %s (block size %d)", url, old.block_size)

    async def _follow_feed(self, url: str) -> None:
        seq, engine_id, matches = 0, None, None
        backoff = self.feed_interval
        while True:
            try:
                if matches is None:
                    r = await self.client.get(f"{url}/v1/cache/config")
                    r.raise_for_status()
                    config = r.json()
                    await self._adopt_config(url, config)
                    matches = self._config_matches(config)
                    if matches:  # followed from here on (shown by /ready), even while a long-poll waits
                        self.feed_seq.setdefault(url, seq)
                        self.feed_heard.setdefault(url, time.monotonic())
                    else:
                        log.warning("engine %s cache config %s differs from %s: ignoring its feed",
                                    url, config, self.cache_config)
                if matches and self.prompt.hasher.tokenizer is None:
                    await self._load_tokenizer(url)  # retried every _TOKENIZER_RETRY_S until it works
                pause = self.feed_interval
                if matches:
                    started = asyncio.get_running_loop().time()
                    data = await self._events(url, seq)
                    seq, engine_id, matches = self._apply_events(url, data, seq, engine_id)
                    self.feed_seq[url] = seq
                    self.feed_heard[url] = time.monotonic()
                    took = asyncio.get_running_loop().time() - started
                    # Nothing new after a real wait: ask again at once. An engine that answers
                    # at once (it has events, is draining, or predates long-polls) is asked
                    # again `feed_interval` after this request began.
                    waited = (self.feed_wait > 0 and not data.get("events") and not data.get("reset")
                              and took >= self.feed_wait / 2)
                    pause = 0.0 if waited else max(0.0, self.feed_interval - took)
                backoff = self.feed_interval
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
                log.debug("cache feed of %s: %s", url, e)
                backoff = min(_MAX_BACKOFF_S, backoff * 2)
                pause = backoff
            await asyncio.sleep(pause if matches is not False else _MAX_BACKOFF_S * 5)

    async def _events(self, url: str, seq: int) -> dict:
        params: dict = {"after": seq}
        timeout = self.client.timeout
        if self.feed_wait > 0:
            params["wait"] = self.feed_wait
            timeout = httpx.Timeout(self.feed_wait + 5.0, connect=timeout.connect)
        r = await self.client.get(f"{url}/v1/cache/events", params=params, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def _apply_events(self, url: str, data: dict, seq: int, engine_id: str | None):
        """Returns the next (seq, engine_id, config-matches) state."""
        new_id = data.get("engine_id")
        if engine_id is not None and new_id != engine_id and not data.get("reset"):
            # A restarted engine numbers events from scratch: our seq means nothing
            # to it. Forget its hashes, re-read its config, start over.
            self.index.reset(url, (), new_id)
            return 0, None, None
        if data.get("reset"):
            self.index.reset(url, (bytes.fromhex(h) for h in data.get("block_hashes", [])), new_id)
        for event in data.get("events", []):
            hashes = (bytes.fromhex(h) for h in event.get("block_hashes", []))
            if event.get("type") == "stored":
                self.index.stored(url, hashes, new_id)
            elif event.get("type") == "removed":
                self.index.removed(url, hashes, new_id)
        return int(data.get("latest_seq", seq)), new_id, True

    # -- load, readiness, models ----------------------------------------------------
    async def _scrape(self, url: str) -> None:
        tick = 0
        while True:
            try:
                if self.probe_ready:
                    await self._probe(url)
                own = self.endpoints.in_flight(url)
                r = await self.client.get(f"{url}/metrics")
                if r.status_code == 200:
                    own = max(own, self.endpoints.in_flight(url))
                    scrape = parse_engine_metrics(r.text)
                    self.endpoints.set_scraped(url, scrape.running, scrape.waiting, own, scrape.prefix_cache_hits,
                                               scrape.generation_tokens, scrape.lora)
                if url not in self.models or tick % _MODELS_EVERY == 0:
                    r = await self.client.get(f"{url}/v1/models")
                    if r.status_code == 200:
                        self.models[url] = list(r.json().get("data", []))
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as e:
                log.debug("scrape of %s: %s", url, e)
            tick += 1
            await asyncio.sleep(self.scrape_interval)

    async def _probe(self, url: str) -> None:
        try:
            r = await self.client.get(f"{url}/ready")
            state = READY if r.status_code == 200 else NOT_READY
        except httpx.HTTPError:
            state = NOT_READY
        self.endpoints.set_discovered(url, state)

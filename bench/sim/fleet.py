"""A fleet: N engines, R gateway replicas and a workload's users, under one
EventLoop. `simulate(fleet, workload, policy)` runs it to the end and returns a
RunResult (one row of a sweep's CSV).

Network model: a request reaches its engine the moment a gateway routes it
(gateway overhead and RTTs are ~1 ms against steps of 10+ ms); cache events
reach every gateway `feed_delay_s` after the engine step that produced them;
each gateway scrapes every engine's running and waiting counts every
`scrape_interval_s`, at its own seeded phase (0: before every decision, the
"identical views" case). Each request goes to a gateway replica drawn at random
(seeded), as behind a Kubernetes Service.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from pagedkube.gateway.routing.keys import routing_input
from pagedkube.gateway.routing.types import OVERFLOW

from sim.engine import EngineConfig, SimEngine, SimRequest
from sim.events import EventLoop
from sim.gateway import PolicySpec, SimGateway, WalkMemo
from sim.llmd import LLMD, SCRAPE_INTERVAL_S as LLMD_SCRAPE_INTERVAL_S
from sim.timing import PROFILES, TimeModel
from sim.workloads import SimSession, WorkloadSpec, sessions


@dataclass(frozen=True, slots=True)
class FleetConfig:
    engines: int = 16
    replicas: int = 1
    engine: EngineConfig = EngineConfig(num_blocks=2048)
    time_model: TimeModel = PROFILES["h100-8b"]
    feed_delay_s: float = 0.005        # a long-poll round trip on a cluster network
    scrape_interval_s: float = 1.0     # the gateway's --scrape-interval default
    sample_interval_s: float = 1.0     # load samples for max/mean
    ideal_pooled_compute: bool = True  # ideal: n engines' compute as one; False: one engine's
    seed: int = 0
    memo_walks: bool = True            # remember ring walks (the same results, faster: gateway.WalkMemo)
    trace_load: bool = False           # record each request's engine load in requests and in prefill tokens

    def __post_init__(self) -> None:
        if self.engines < 1 or self.replicas < 1:
            raise ValueError("a fleet needs at least one engine and one gateway replica")
        if self.feed_delay_s < 0 or self.scrape_interval_s < 0 or self.sample_interval_s <= 0:
            raise ValueError("feed delay and scrape interval must be >= 0, the sample interval > 0")


@dataclass(slots=True)
class RunResult:
    workload: str
    policy: str
    engines: int
    replicas: int
    sessions: int
    requests: int
    rate: float
    profile: str
    seed: int
    hit_rate: float              # prefix-cache hit tokens / queried tokens, summed over engines
    session_hit_rate: float      # the same beyond each prompt's shared product prompt (common_len)
    ttft_p50_s: float
    ttft_p99_s: float
    queue_p50_s: float           # arrival at the engine to first scheduled
    queue_p99_s: float
    throughput_rps: float
    max_mean_run: float          # max over engines of their mean load, over the mean of those
    max_mean_sample: float       # max/mean at each sample with >= 1 request per engine, averaged
    max_mean_sample_p99: float
    overflow_share: float        # decisions the bound moved (prefix policy)
    disagreement: float          # decisions another replica would have made differently (R > 1)
    preemptions: int
    sim_s: float
    events: int
    ideal_hit_rate: float = math.nan
    reasons: dict = field(default_factory=dict)
    # With FleetConfig.trace_load: Spearman's rank correlation of TTFT with the chosen engine's
    # load at arrival, counted as requests (running + waiting: the bound's unit), as prompt
    # tokens still to prefill (the backlog), and as the backlog plus the request's own uncached tokens.
    ttft_rho_requests: float = math.nan
    ttft_rho_backlog: float = math.nan
    ttft_rho_backlog_own: float = math.nan
    # LoRA workloads (WorkloadSpec.adapters): adapters copied into slots, fleet-wide, and the share of
    # adapter requests whose adapter was in a slot of their engine when first scheduled.
    adapter_loads: int = 0
    adapter_hit_rate: float = math.nan

    def row(self) -> dict:
        out = asdict(self)
        out["reasons"] = ";".join(f"{k}={v}" for k, v in sorted(self.reasons.items()))
        return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (ties get their mean rank); NaN for fewer than 3 pairs or a constant side."""
    if len(xs) < 3:
        return math.nan

    def ranks(values: list[float]) -> np.ndarray:
        _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
        ends = np.cumsum(counts)                   # a tie group holds ranks ends - counts .. ends - 1
        return ((2 * ends - counts - 1) / 2)[inverse]

    try:
        return statistics.correlation(ranks(xs).tolist(), ranks(ys).tolist())
    except statistics.StatisticsError:             # a constant side
        return math.nan


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


class _Run:
    def __init__(self, fleet: FleetConfig, spec: WorkloadSpec, policy: PolicySpec):
        self.fleet, self.spec, self.policy = fleet, spec, policy
        self.loop = EventLoop()
        ideal = policy.name == "ideal"
        n = 1 if ideal else fleet.engines
        config, model = fleet.engine, fleet.time_model
        if ideal:
            k = fleet.engines
            config = replace(config, num_blocks=config.num_blocks * k,
                             max_loras=None if config.max_loras is None else config.max_loras * k)
            if fleet.ideal_pooled_compute:
                config = replace(config, max_num_seqs=config.max_num_seqs * k,
                                 max_num_batched_tokens=config.max_num_batched_tokens * k)
                model = model.pooled(k)
        self.engines = [SimEngine(f"http://engine-{i:03d}:8000", self.loop, config, model, self._on_events)
                        for i in range(n)]
        self.by_url = {e.name: e for e in self.engines}
        urls = [e.name for e in self.engines]
        clock = lambda: self.loop.now  # noqa: E731
        rings = WalkMemo() if fleet.memo_walks else None
        self.gateways = [SimGateway(f"gw{r}", urls, policy, clock, rings=rings, replicas=fleet.replicas)
                         for r in range(fleet.replicas)]
        self.rng = random.Random(f"{fleet.seed}/replica-split")
        # llm-d refreshes its metrics every 50 ms by default (llmd.py); the others at the fleet's interval
        self.scrape_interval_s = fleet.scrape_interval_s
        if policy.name == LLMD and fleet.scrape_interval_s > 0:
            self.scrape_interval_s = min(fleet.scrape_interval_s, LLMD_SCRAPE_INTERVAL_S)
        self.ttft: list[float] = []
        self.traced: list[tuple[int, int, int, float]] = []   # trace_load: requests, backlog, own, TTFT
        self.queue: list[float] = []
        self.decisions = self.overflows = self.disagreements = self.compared = 0
        self.reasons: dict[str, int] = {}
        self.samples: list[list[int]] = []
        self.requests = 0
        self.session_tokens = self.session_hits = 0
        self.first_arrival = math.inf
        self.last_done = 0.0
        self.open_sessions = 0
        self._sessions = iter(sessions(spec))
        self._done_arriving = False

    # -- the network ------------------------------------------------------------------
    def _on_events(self, engine: SimEngine, events) -> None:
        for gw in self.gateways:
            if self.fleet.feed_delay_s == 0:
                gw.feed(engine.name, engine.engine_id, events)
            else:
                self.loop.after(self.fleet.feed_delay_s, gw.feed, engine.name, engine.engine_id, events)

    def _scrape(self, gw: SimGateway) -> None:
        for e in self.engines:
            gw.scraped(e.name, e.num_running, e.num_waiting, e.kv.usage, e.lora_slots())
        if self.scrape_interval_s > 0 and not self._finished():
            self.loop.after(self.scrape_interval_s, self._scrape, gw)

    def _sample(self) -> None:
        self.samples.append([e.load for e in self.engines])
        if not self._finished():
            self.loop.after(self.fleet.sample_interval_s, self._sample)

    def _evict_trees(self) -> None:
        for gw in self.gateways:
            gw.evict_tree()
        if not self._finished():
            self.loop.after(self.policy.cache_aware.eviction_interval_s, self._evict_trees)

    def _finished(self) -> bool:
        return self._done_arriving and self.open_sessions == 0

    # -- users ------------------------------------------------------------------------
    def _next_session(self) -> None:
        session = next(self._sessions, None)
        if session is None:
            self._done_arriving = True
            return
        self.open_sessions += 1
        self.loop.at(max(self.loop.now, session.arrival_s), self._arrive, session)

    def _arrive(self, session: SimSession) -> None:
        self._send(session, 0)
        self._next_session()

    def _send(self, session: SimSession, turn: int) -> None:
        now = self.loop.now
        self.first_arrival = min(self.first_arrival, now)
        prompt = session.prompt(turn)
        request = routing_input(prompt, session.head, block_size=self.fleet.engine.block_size,
                                seed=self.fleet.engine.hash_seed, ring_key_blocks=self.policy.ring_key_blocks,
                                cache_salt=session.cache_salt, lora_name=session.lora_name)
        if self.fleet.scrape_interval_s == 0:
            for gw in self.gateways:
                self._scrape(gw)
        gw = self.gateways[self.rng.randrange(len(self.gateways))]
        if len(self.gateways) > 1:
            views = [other.would_choose(request) for other in self.gateways if other is not gw]
        decision = gw.route(request)
        if len(self.gateways) > 1 and views[0] is not None:
            self.compared += 1
            self.disagreements += any(v != decision.endpoint for v in views)
        self.decisions += 1
        self.overflows += decision.reason == OVERFLOW
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        self.requests += 1
        url = decision.endpoint
        sent = now

        traced = None

        def first_token(t: float) -> None:
            self.ttft.append(t - sent)
            if traced is not None:
                self.traced.append((*traced, t - sent))

        def done(t: float, cached: int) -> None:
            gw.release(url)
            self.session_tokens += len(prompt) - session.common_len
            self.session_hits += max(0, cached - session.common_len)
            self.last_done = t
            if turn + 1 < session.num_turns:
                self.loop.after(session.think_s[turn + 1], self._send, session, turn + 1)
            else:
                self.open_sessions -= 1

        engine_request = SimRequest(f"{session.session_id}/{turn}", prompt, session.answers[turn],
                                    session.cache_salt, session.lora_name, first_token, done)
        engine = self.by_url[url]
        load = engine.load
        seq = engine.submit(engine_request)
        if self.fleet.trace_load:   # the backlog ahead of the request, and its own tokens (nothing ran yet)
            own = engine.uncached_prompt_tokens(seq)
            traced = (load, engine.prefill_backlog() - own, own)

    def run(self) -> RunResult:
        for gw in self.gateways:
            phase = random.Random(f"{self.fleet.seed}/{gw.name}/phase").uniform(0, self.scrape_interval_s)
            self.loop.at(phase, self._scrape, gw)
        self.loop.at(0.0, self._sample)
        if self.policy.name == "cache-aware":
            self.loop.at(self.policy.cache_aware.eviction_interval_s, self._evict_trees)
        self._next_session()
        self.loop.run()
        return self._result()

    def _result(self) -> RunResult:
        hits = sum(e.kv.prefix_cache_hits for e in self.engines)
        queries = sum(e.kv.prefix_cache_queries for e in self.engines)
        self.queue = [q for e in self.engines for q in e.stats.queue_s]
        busy = [s for s in self.samples if sum(s) >= len(s)]
        per_sample = [max(s) / (sum(s) / len(s)) for s in busy]
        means = [sum(s[i] for s in self.samples) / len(self.samples) for i in range(len(self.engines))] \
            if self.samples else [0.0]
        mean_of_means = sum(means) / len(means)
        span = max(self.last_done - self.first_arrival, 1e-9)
        return RunResult(
            workload=self.spec.kind, policy=self.policy.label, engines=self.fleet.engines,
            replicas=self.fleet.replicas, sessions=self.spec.sessions, requests=self.requests, rate=self.spec.rate,
            profile=self.fleet.time_model.name, seed=self.fleet.seed,
            hit_rate=hits / queries if queries else 0.0,
            session_hit_rate=self.session_hits / self.session_tokens if self.session_tokens else 0.0,
            ttft_p50_s=percentile(self.ttft, 50), ttft_p99_s=percentile(self.ttft, 99),
            queue_p50_s=percentile(self.queue, 50), queue_p99_s=percentile(self.queue, 99),
            throughput_rps=self.requests / span,
            max_mean_run=max(means) / mean_of_means if mean_of_means > 0 else math.nan,
            max_mean_sample=sum(per_sample) / len(per_sample) if per_sample else math.nan,
            max_mean_sample_p99=percentile(per_sample, 99),
            overflow_share=self.overflows / self.decisions if self.decisions else 0.0,
            disagreement=self.disagreements / self.compared if self.compared else 0.0,
            preemptions=sum(e.stats.preemptions for e in self.engines),
            sim_s=self.loop.now, events=self.loop.num_events, reasons=dict(self.reasons), **self._load_units(),
            **self._adapters())

    def _adapters(self) -> dict:
        requests = sum(e.stats.lora_requests for e in self.engines)
        if not requests:
            return {}
        return {"adapter_loads": sum(e.stats.lora_loads for e in self.engines),
                "adapter_hit_rate": sum(e.stats.lora_hits for e in self.engines) / requests}

    def _load_units(self) -> dict:
        if not self.traced:
            return {}
        requests, backlog, own, ttft = zip(*self.traced)
        return {"ttft_rho_requests": spearman(list(requests), list(ttft)),
                "ttft_rho_backlog": spearman(list(backlog), list(ttft)),
                "ttft_rho_backlog_own": spearman([b + o for b, o in zip(backlog, own)], list(ttft))}


def simulate(fleet: FleetConfig, spec: WorkloadSpec, policy: PolicySpec) -> RunResult:
    return _Run(fleet, spec, policy).run()

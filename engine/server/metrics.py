"""Prometheus metrics with vLLM's names and buckets (docs/design.md "Engine server").

Names are a contract (docs/design.md, pitfall "Metric renames break dashboards"): dashboards,
KEDA triggers and the Gateway API Inference Extension read them. Every metric is
labelled `model_name` (the served model name). Each app gets its own
CollectorRegistry, so two servers in one process never share counters.

Gauges and the engine's own cumulative counters (prefix cache, preemptions) are
read from the engine's stats snapshot at scrape time; per-request timings and
token counts are recorded by the engine thread as outputs arrive.
"""
from __future__ import annotations

import time

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Buckets copied from vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
INTER_TOKEN_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")
# With --enable-lora (names the gateway reads: gateway/engine_metrics.py).
RESIDENT_LORA = "pagedkube_engine_lora_resident"
LORA_SLOT_LOADS = "pagedkube_engine_lora_slot_loads_total"

# Every name docs/design.md "Engine server" promises, as they appear in the exposition.
METRIC_NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
)


class _EngineStatsCollector:
    """Gauges and engine-side cumulative counters, read from the stats snapshot."""

    def __init__(self, model_name: str, read_stats: Callable[[], tuple[Any, int]], max_lora: int | None = None):
        self.model_name = model_name
        self.read_stats = read_stats
        self.max_lora = max_lora

    def collect(self):
        stats, pending = self.read_stats()
        labels = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        get = (lambda attr: getattr(stats, attr, 0) or 0) if stats is not None else (lambda attr: 0)
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    get("num_running"))
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    get("num_waiting") + pending)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    get("kv_cache_usage"))
        yield counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.", get("prefix_cache_queries"))
        yield counter("vllm:prefix_cache_hits",
                      "Prefix cache hits, in terms of number of cached tokens.", get("prefix_cache_hits"))
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      get("num_preemptions"))
        # Ours (vLLM has none): whether --decode-capture is doing anything, next to its step count.
        yield counter("pagedkube_engine_captured_decode_steps",
                      "Decode steps run through the captured program or natively (--decode-capture); the others ran eager.",
                      get("num_captured_steps"))
        if self.max_lora is not None:   # vLLM's: the adapters in use, as labels; the value is the time of reading
            info = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                     labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
            info.add_metric([",".join(get("running_lora_adapters") or ()), ",".join(get("waiting_lora_adapters") or ()),
                             str(self.max_lora)], time.time())
            yield info
            # Ours: which adapters sit in the step's slots (a request for one runs without a load; the
            # gateway prefers those engines, docs/gateway.md "LoRA adapters"), and how many loads it took.
            resident = GaugeMetricFamily(RESIDENT_LORA, "LoRA adapters in the engine's --max-loras slots (1 each).",
                                         labels=["model_name", "lora_name"])
            for name in get("resident_lora_adapters") or ():
                resident.add_metric([self.model_name, name], 1)
            yield resident
            yield counter(LORA_SLOT_LOADS.removesuffix("_total"),
                          "LoRA adapters copied into a slot (each one a load, whether from host memory or disk).",
                          get("num_lora_slot_loads"))


class EngineMetrics:
    """The engine server's metrics; the on_* methods are thread-safe (engine thread)."""

    def __init__(self, model_name: str, read_stats: Callable[[], tuple[Any, int]], max_lora: int | None = None):
        """max_lora: --max-loras with --enable-lora (then vllm:lora_requests_info is exported), else None."""
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels, registry=r).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                         labels, registry=r).labels(model_name)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labels + ["finished_reason"], registry=r)
        self.request_success = {reason: success.labels(model_name, reason) for reason in FINISH_REASONS}
        self._success = success
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.inter_token = Histogram("vllm:inter_token_latency_seconds",
                                     "Histogram of inter-token latency in seconds.",
                                     labels, buckets=INTER_TOKEN_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=REQUEST_LATENCY_BUCKETS, registry=r).labels(model_name)
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    labels, buckets=REQUEST_LATENCY_BUCKETS, registry=r).labels(model_name)
        r.register(_EngineStatsCollector(model_name, read_stats, max_lora))

    def on_first_token(self, ttft: float, num_prompt_tokens: int) -> None:
        self.ttft.observe(ttft)
        self.prompt_tokens.inc(num_prompt_tokens)

    def on_inter_token(self, seconds: float) -> None:
        self.inter_token.observe(seconds)

    def on_generated(self, num_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)

    def on_finished(self, reason: str, *, e2e: float, queue_time: float) -> None:
        counter = self.request_success.get(reason) or self._success.labels(self.model_name, reason)
        counter.inc()
        self.e2e.observe(e2e)
        self.queue_time.observe(queue_time)

    def on_request_end(self, reason: str, arrival: float, first_scheduled: float | None) -> None:
        """A request ended now: e2e latency from arrival, queue time until first scheduled."""
        now = time.monotonic()
        self.on_finished(reason, e2e=now - arrival, queue_time=(first_scheduled or now) - arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)

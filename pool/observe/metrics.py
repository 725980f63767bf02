"""Prometheus metrics of one runtime, in its own CollectorRegistry (tests build many runtimes).

Gauges and the load counters are read from the pool snapshot at scrape time; requests, events,
evictions and admission rejections are counted as they happen, through a pool listener and the
enforcer's calls."""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ..events import PoolChange
from ..policy.vocabulary import ActionKind, Change, Level, ModelState

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# (metric name, key of the snapshot's "memory" dict, help)
MEMORY_GAUGES = (
    ("memory_usage_bytes", "usage_bytes", "Process memory counted against the ceiling."),
    ("memory_active_bytes", "active_bytes", "MLX active memory."),
    ("memory_cache_bytes", "cache_bytes", "MLX buffer cache (reclaimable)."),
    ("memory_peak_bytes", "peak_bytes", "MLX peak memory."),
    ("memory_rss_bytes", "rss_bytes", "Process resident memory."),
    ("memory_device_floor_bytes", "device_floor_bytes",
     "What the process holds on its discrete GPU beyond MLX's buffers, counted in usage (absent elsewhere)."),
    ("memory_total_bytes", "total_bytes", "The memory usage is measured against (RAM or the GPU's)."),
    ("memory_available_bytes", "available_bytes", "System available memory."),
    ("memory_ceiling_bytes", "ceiling_bytes", "The enforcer's process memory ceiling (absent when off)."),
    ("memory_soft_bytes", "soft_bytes", "The soft pressure line (absent when the ceiling is off)."),
    ("memory_hard_bytes", "hard_bytes", "The hard pressure line (absent when the ceiling is off)."),
    ("model_budget_bytes", "model_budget_bytes", "The model budget (absent when off)."),
    ("model_bytes", "model_bytes", "Footprint of the loaded and loading models."),
    ("admission_waiting", "admission_waiting", "Requests waiting while admission is paused."),
)


# (metric name, key of a snapshot model row, help): per loaded model
KV_GAUGES = (
    ("model_kv_bytes", "kv_bytes", "Live KV cache of the model's running requests."),
    ("prompt_cache_bytes", "prompt_cache_bytes", "The model's prefix (prompt) cache."),
    ("prompt_cache_entries", "prompt_cache_entries", "Entries in the model's prompt cache."),
    ("prompt_cache_cap_bytes", "prompt_cache_cap_bytes", "The prompt cache's cap, as memory pressure walks it."),
)
# (metric name, key of a snapshot model row, help): per model, its OMLX_MAX_CONCURRENT slots
SLOT_GAUGES = (
    ("running_requests", "running", "Requests holding one of the model's concurrency slots."),
    ("queued_requests", "queued", "Requests waiting for one of the model's concurrency slots."),
)
KV_COUNTERS = (
    ("prompt_cache_hits", "prompt_cache_hits", "Requests that reused a cached prefix, since the model loaded."),
    ("prompt_cache_misses", "prompt_cache_misses", "Requests that found no cached prefix, since the model loaded."),
    ("prompt_tokens_saved", "prompt_tokens_saved", "Prompt tokens taken from the cache, since the model loaded."),
)

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
RATE_BUCKETS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 500, 1000)


def _per_model(models: list[dict], rows, family):
    for name, key, doc in rows:
        metric = family(name, doc, labels=["model"])
        for m in models:
            if m.get(key) is not None:
                metric.add_metric([m["id"]], m[key])
        yield metric


class Metrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("requests", "Requests that reached the pool, by model.", ["model"],
                                registry=self.registry)
        self.key_requests = Counter("key_requests", "Requests to the model APIs, by API key name and status.",
                                    ["key", "status"], registry=self.registry)
        self.events = Counter("pool_events", "Pool events recorded, by reason.", ["reason"], registry=self.registry)
        self.evictions = Counter("evictions", "Models unloaded, by reason.", ["reason"], registry=self.registry)
        self.admission_rejections = Counter("admission_rejections", "Requests refused by admission, by reason.",
                                            ["reason"], registry=self.registry)
        # request traces (pool/traces): labelled by model and key name, both bounded
        labels = ["model", "key"]
        self.ttft = Histogram("request_ttft_seconds", "Time to first token, from the request's arrival.", labels,
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("request_queue_wait_seconds", "Time a request waited at the gate and for a "
                                    "concurrency slot.", labels, buckets=TTFT_BUCKETS, registry=self.registry)
        self.decode_rate = Histogram("request_decode_tokens_per_second", "Tokens per second after the first one.",
                                     labels, buckets=RATE_BUCKETS, registry=self.registry)
        self.draft_tokens = Counter("draft_tokens", "Tokens a model's draft proposed and those its model accepted "
                                    "(speculative decoding), by model.", ["model", "outcome"], registry=self.registry)
        self._snapshot = snapshot

    def watch(self, pool) -> None:
        """Count the pool's changes as they happen, and read its gauges at each scrape."""
        pool.events.subscribe(self.on_pool_change)
        self.registry.register(_SnapshotCollector(pool, self._snapshot))

    # ---- counted as they happen --------------------------------------------------------------

    def admission_rejected(self, reason: str) -> None:
        self.admission_rejections.labels(reason=reason).inc()

    def request_started(self, model: str) -> None:
        self.requests.labels(model=model).inc()

    def key_request(self, key: str, status: int) -> None:
        """A request answered, by its API key's name (names come from the database: bounded)."""
        self.key_requests.labels(key=key, status=str(status)).inc()

    def request_traced(self, *, model: str, key: str, ttft: float | None, queue_wait: float,
                       decode_tps: float | None, draft: tuple[int, int] = (0, 0)) -> None:
        """A finished request's trace (pool/traces/registry.py); `draft`: (proposed, accepted)."""
        if draft[0]:
            self.draft_tokens.labels(model=model, outcome="proposed").inc(draft[0])
            self.draft_tokens.labels(model=model, outcome="accepted").inc(draft[1])
        if ttft is not None:
            self.ttft.labels(model=model, key=key).observe(ttft)
        self.queue_wait.labels(model=model, key=key).observe(queue_wait)
        if decode_tps is not None:
            self.decode_rate.labels(model=model, key=key).observe(decode_tps)

    def record_event(self, reason: str, *, eviction: bool = False) -> None:
        self.events.labels(reason=reason).inc()
        if eviction:
            self.evictions.labels(reason=reason).inc()

    def on_pool_change(self, change: PoolChange) -> None:
        if change.kind == Change.REQUEST_START:
            self.request_started(change.model)
        elif change.kind == Change.EVENT:
            event = change.event
            self.record_event(event["reason"], eviction=event["action"] == ActionKind.UNLOAD)

    # ---- scraping ----------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SnapshotCollector:
    def __init__(self, pool, snapshot: Callable[[], dict[str, Any]]):
        self.pool = pool
        self.snapshot = snapshot

    def collect(self):
        snap = self.snapshot()
        memory = snap["memory"]
        for name, key, doc in MEMORY_GAUGES:
            gauge = GaugeMetricFamily(name, doc)
            if memory.get(key) is not None:
                gauge.add_metric([], memory[key])
            yield gauge

        level = Level(memory.get("level", Level.OK))
        yield GaugeMetricFamily("memory_pressure_level", "Pressure level: 0 ok, 1 soft, 2 hard, 3 emergency.",
                                value=level.rank)
        by_level = GaugeMetricFamily("memory_pressure", "1 for the current pressure level.", labels=["level"])
        for name in Level:
            by_level.add_metric([name], int(name == level))
        yield by_level
        yield GaugeMetricFamily("admission_paused", "1 while admission is paused by memory pressure.",
                                value=int(bool(memory.get("admission_paused"))))

        models = snap["models"]
        yield GaugeMetricFamily("loaded_models", "Models loaded.",
                                value=sum(m["state"] == ModelState.LOADED for m in models))
        states = GaugeMetricFamily("model_state", "1 for each model's current state.", labels=["model", "state"])
        active = GaugeMetricFamily("active_requests", "Requests in flight, by model.", labels=["model"])
        footprint = GaugeMetricFamily("model_measured_bytes", "Memory a model took when it loaded.",
                                      labels=["model"])
        for m in models:
            states.add_metric([m["id"], m["state"]], 1)
            active.add_metric([m["id"]], m["active_requests"])
            if m["measured_bytes"] is not None:
                footprint.add_metric([m["id"]], m["measured_bytes"])
        yield from (states, active, footprint)
        yield from _per_model(models, SLOT_GAUGES, GaugeMetricFamily)
        yield from _per_model(models, KV_GAUGES, GaugeMetricFamily)
        yield from _per_model(models, KV_COUNTERS, CounterMetricFamily)

        yield CounterMetricFamily("model_loads", "Model loads completed.", value=self.pool.loads_total)
        yield CounterMetricFamily("model_load_seconds", "Seconds spent in completed model loads.",
                                  value=self.pool.load_seconds_total)

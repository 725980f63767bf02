"""The soak's judgement, pure: samples and results in, a Summary out, and the rules it breaks.

`sample(...)` reads one second's /api/pool and /metrics; `summarize(...)` folds the run into a
Summary of plain numbers; `failures(summary)` lists every rule of the soak the run broke (an empty
list: exit 0); `table(summary)` is what the soak prints. No I/O here: tests feed it tables."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from _servers import percentile
from prometheus_client.parser import text_string_to_metric_families
from soak_kinds import BAD_ANSWER, CUT, DISCONNECTED, DROPPED, OK, STREAM_ERROR, TIMEOUT, Result

MB = 10**6
# 5xx a client may get by design: admission paused / queue full / aborted by the enforcer (503, with
# Retry-After; 529 on the Anthropic routes), and a model that cannot fit (507)
RETRY_LATER = (503, 529)
CANNOT_FIT = 507
# errors a stream may end with after its 200: the 503 family (an abort by the enforcer or an unload)
STREAM_ABORTS = {"memory_pressure", "request_aborted", "model_unloaded", "overloaded_error"}
ACTIVE_SLACK = 0.05        # MLX active memory may exceed what the loaded models account for by this much
RSS_GROWTH = 0.10          # resident memory beside models and caches may grow this much, first to last rotation
ROTATION_WINDOW = 5        # rotations whose median stands for "the first" and "the last"


@dataclass(frozen=True)
class Sample:
    """One second of the run."""
    t: float
    alive: bool                 # the server process is running
    health: bool                # GET /health answered 200
    usage: int = 0
    hard: int | None = None
    last_tick_at: float | None = None
    rss: int = 0
    active: int = 0
    overhead: int = 0           # resident memory MLX does not hold: rss less MLX active and cache
    accounted: int = 0          # the loaded models' measured bytes + prompt caches + live KV
    loads: int = 0              # model_loads_total
    evictions: int = 0          # evictions_total, all reasons
    loaded: tuple[str, ...] = ()


@dataclass
class EndState:
    """After the clients stopped: the pool settled (models still loaded), then flushed (every model
    unloaded, which drops its caches), the eviction history and the final /metrics."""
    settled: dict
    flushed: dict
    history: list[dict]                     # /api/evictions rows (every action)
    history_truncated: bool = False         # a query hit the route's 1000-row limit
    metrics_text: str = ""
    peak_usage: int = 0                     # the enforcer's own readings (/api/telemetry)
    exit_code: int | None = None


@dataclass
class Summary:
    seconds: float = 0.0
    clients: int = 0
    requests: dict[str, int] = field(default_factory=dict)       # "200 ok", "503 memory_pressure", ... -> count
    kinds: dict[str, int] = field(default_factory=dict)          # kind -> requests sent
    latency: dict[str, float] = field(default_factory=dict)      # p50 / p95 / p99 of whole answers, seconds
    bad_5xx: dict[str, int] = field(default_factory=dict)        # "kind status code" -> count
    unanswered: dict[str, int] = field(default_factory=dict)     # "kind outcome: detail" -> count
    multiturn: tuple[int, int] = (0, 0)                          # later turns answered, of them with cached tokens
    samples: int = 0
    died: bool = False
    health_failures: int = 0
    hard_bytes: int | None = None
    peak_usage: int = 0
    hard_overrun_ticks: int = 0          # most enforcer ticks one stretch above the hard line lasted
    loads: int = 0
    evictions_metric: dict[str, int] = field(default_factory=dict)    # by reason, /metrics
    evictions_history: dict[str, int] = field(default_factory=dict)   # by reason, /api/evictions
    evictions_unfreed: int = 0           # history unloads with no bytes freed
    eviction_warnings: int = 0           # history unloads that freed < 90% of the measured size
    history_truncated: bool = False
    rss_start: int = 0
    rss_end: int = 0
    active_start: int = 0
    active_end: int = 0
    rotations: int = 0
    rotations_from: float = 0.0                  # seconds into the run: clients on and every model loaded once
    rss_first_rotation: int | None = None        # RSS (median of the first rotations)
    rss_last_rotation: int | None = None
    overhead_first_rotation: int | None = None   # ... less MLX's active memory and cache
    overhead_last_rotation: int | None = None
    unaccounted_peak: int = 0            # most MLX active memory beyond the models and caches at a sample
    end_leases: int = 0
    end_requests: int = 0                # running + queued, and admission waiters
    end_active: int = 0                  # MLX active, settled
    end_accounted: int = 0               # the loaded models' measured bytes + their prompt caches + live KV
    flushed_active: int = 0              # MLX active once every model was unloaded
    exit_code: int | None = None


# ---- reading the server ---------------------------------------------------------------------------

def metric_values(text: str, name: str) -> dict[tuple, float]:
    """A metric's samples from Prometheus text: {label values: value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def evictions_by_reason(metrics_text: str) -> dict[str, int]:
    return {dict(labels)["reason"]: int(v) for labels, v in metric_values(metrics_text, "evictions_total").items()}


def overhead(memory: dict) -> int:
    """Resident memory that is not MLX's (on the CPU backend MLX's arrays and buffer cache are
    resident): the Python heap, malloc's arenas, tokenizers. MLX's own memory is judged at the end,
    against what the loaded models account for; this is what a leak beside it would grow."""
    return (memory.get("rss_bytes") or 0) - (memory.get("active_bytes") or 0) - (memory.get("cache_bytes") or 0)


def accounted(models: list[dict]) -> int:
    """The MLX memory the snapshot explains: loaded models' measured weights, prompt caches, live KV."""
    return sum((m.get("measured_bytes") or 0) + (m.get("prompt_cache_bytes") or 0) + (m.get("kv_bytes") or 0)
               for m in models if m.get("state") == "loaded")


def sample(t: float, *, alive: bool, health: bool, pool: dict | None, metrics_text: str) -> Sample:
    if pool is None:
        return Sample(t, alive, health)
    memory = pool["memory"]
    loads = metric_values(metrics_text, "model_loads_total")
    return Sample(t, alive, health, usage=memory.get("usage_bytes") or 0, hard=memory.get("hard_bytes"),
                  last_tick_at=memory.get("last_tick_at"), rss=memory.get("rss_bytes") or 0,
                  active=memory.get("active_bytes") or 0, overhead=overhead(memory),
                  accounted=accounted(pool["models"]),
                  loads=int(sum(loads.values())), evictions=sum(evictions_by_reason(metrics_text).values()),
                  loaded=tuple(m["id"] for m in pool["models"] if m["state"] == "loaded"))


# ---- folding the run ----------------------------------------------------------------------------

def label(r: Result) -> str:
    if r.status is None:
        return r.outcome
    if r.outcome == STREAM_ERROR:
        return f"200 stream error {r.code}"
    if r.outcome in (OK, DISCONNECTED, CUT, BAD_ANSWER):
        return f"{r.status} {r.outcome}"
    return f"{r.status} {r.code}"


def bad_5xx(r: Result) -> bool:
    if r.outcome == STREAM_ERROR:
        return r.code not in STREAM_ABORTS
    if r.status is None or r.status < 500:
        return False
    return not (r.status == CANNOT_FIT or (r.status in RETRY_LATER and r.retry_after))


def hard_overrun_ticks(samples: list[Sample]) -> int:
    """The most enforcer ticks that passed while usage stayed above the hard line in one stretch
    of consecutive samples (a tick is a new `last_tick_at`)."""
    worst, ticks_seen = 0, None
    for s in samples:
        if s.hard is None or s.usage <= s.hard:
            ticks_seen = None
            continue
        if ticks_seen is None:
            ticks_seen = {s.last_tick_at}
        else:
            ticks_seen.add(s.last_tick_at)
        worst = max(worst, len(ticks_seen) - 1)
    return worst


def rotation_samples(samples: list[Sample], since: float = 0.0) -> list[Sample]:
    """The samples right after a model load (from `since` on): each is one rotation of the pool."""
    return [b for a, b in zip(samples, samples[1:]) if b.loads > a.loads and b.alive and b.rss and b.t >= since]


def all_loaded_once(samples: list[Sample]) -> float:
    """When every model the run loaded had been loaded at least once (0.0 if none was). The server
    keeps what a model's first load builds besides its weights (its tokenizer and constraint tables,
    for the most recently loaded folders), so rotations before this grow memory by design."""
    everyone = {m for x in samples for m in x.loaded}
    seen: set[str] = set()
    for x in samples:
        seen.update(x.loaded)
        if seen == everyone:
            return x.t
    return 0.0


def _median(values) -> int:
    return int(statistics.median(values))


def summarize(results: list[Result], samples: list[Sample], end: EndState, *, seconds: float,
              clients: int, rotations_since: float = 0.0) -> Summary:
    """`rotations_since`: when the clients started (rotations before, one request at a time while
    the kinds were probed, would compare a quiet pool with a busy one)."""
    s = Summary(seconds=seconds, clients=clients, samples=len(samples), exit_code=end.exit_code)
    s.requests = dict(Counter(label(r) for r in results).most_common())
    s.kinds = dict(Counter(r.kind for r in results).most_common())
    answered = [r.seconds for r in results if r.outcome == OK]
    s.latency = {f"p{q}": percentile(answered, q) for q in (50, 95, 99)}
    s.bad_5xx = dict(Counter(f"{r.kind} {label(r)}" for r in results if bad_5xx(r)))
    s.unanswered = dict(Counter(f"{r.kind} {r.outcome}: {r.detail[:120]}" for r in results
                                if r.outcome in (DROPPED, TIMEOUT, BAD_ANSWER)))
    later = [r for r in results if r.turn > 0 and r.outcome == OK and r.cached_tokens is not None]
    s.multiturn = (len(later), sum(1 for r in later if r.cached_tokens))

    live = [x for x in samples if x.alive and x.health and x.rss]
    s.died = any(not x.alive for x in samples)
    s.health_failures = sum(1 for x in samples if not x.health)
    s.hard_bytes = next((x.hard for x in reversed(live) if x.hard is not None), None)
    s.peak_usage = max([end.peak_usage, *(x.usage for x in live)], default=0)
    s.hard_overrun_ticks = hard_overrun_ticks(samples)
    s.unaccounted_peak = max((x.active - x.accounted for x in live), default=0)
    if live:
        s.rss_start, s.active_start = live[0].rss, live[0].active
        s.rss_end, s.active_end = live[-1].rss, live[-1].active
    s.rotations_from = max(rotations_since, all_loaded_once(samples)) - (samples[0].t if samples else 0.0)
    rotations = rotation_samples(samples, max(rotations_since, all_loaded_once(samples)))
    s.rotations = len(rotations)
    if len(rotations) >= 2 * ROTATION_WINDOW:
        first, last = rotations[:ROTATION_WINDOW], rotations[-ROTATION_WINDOW:]
        s.rss_first_rotation = _median(x.rss for x in first)
        s.rss_last_rotation = _median(x.rss for x in last)
        s.overhead_first_rotation = _median(x.overhead for x in first)
        s.overhead_last_rotation = _median(x.overhead for x in last)

    metrics_text = end.metrics_text
    s.loads = int(sum(metric_values(metrics_text, "model_loads_total").values()))
    s.evictions_metric = evictions_by_reason(metrics_text)
    unloads = [e for e in end.history if e.get("action") == "unload"]
    s.evictions_history = dict(Counter(e["reason"] for e in unloads))
    s.evictions_unfreed = sum(1 for e in unloads if not (e.get("freed_bytes") or 0) > 0)
    s.eviction_warnings = sum(1 for e in unloads if e.get("warning"))
    s.history_truncated = end.history_truncated

    settled = end.settled
    models = settled.get("models", [])
    s.end_leases = sum(m.get("active_requests") or 0 for m in models)
    s.end_requests = sum((m.get("running") or 0) + (m.get("queued") or 0) for m in models) \
        + (settled.get("memory", {}).get("admission_waiting") or 0)
    s.end_active = settled.get("memory", {}).get("active_bytes") or 0
    s.end_accounted = accounted(models)
    s.flushed_active = end.flushed.get("memory", {}).get("active_bytes") or 0
    return s


# ---- the rules ----------------------------------------------------------------------------------

def failures(s: Summary) -> list[str]:
    """Every rule the run broke, one line each."""
    out = []
    if s.died:
        out.append("the server process died")
    if s.health_failures:
        out.append(f"/health failed at {s.health_failures} of {s.samples} samples")
    for what, n in s.bad_5xx.items():
        out.append(f"{n} x {what}: a 5xx other than 503/529 with Retry-After and 507")
    for what, n in s.unanswered.items():
        out.append(f"{n} x {what} (every request must get an answer)")
    if s.hard_overrun_ticks > 1:
        out.append(f"usage stayed above the hard line for {s.hard_overrun_ticks} enforcer ticks (at most 1)")
    for reason, n in s.evictions_metric.items():
        kept = s.evictions_history.get(reason, 0)
        if n > kept and not s.history_truncated:
            out.append(f"{n - kept} '{reason}' eviction(s) counted by /metrics are missing from the history")
    if s.evictions_unfreed:
        out.append(f"{s.evictions_unfreed} eviction(s) in the history with no bytes freed")
    if s.end_leases:
        out.append(f"{s.end_leases} lease(s) still held with every client stopped")
    if s.end_requests:
        out.append(f"{s.end_requests} request(s) still running or queued with every client stopped")
    base = s.active_start
    if s.end_active - base > (1 + ACTIVE_SLACK) * s.end_accounted:
        out.append(f"MLX active memory {s.end_active / MB:.1f} MB with the clients stopped is more than "
                   f"{1 + ACTIVE_SLACK:.2f} x the loaded models' measured sizes and caches "
                   f"({s.end_accounted / MB:.1f} MB)")
    if s.flushed_active - base > ACTIVE_SLACK * max(s.end_accounted, MB):
        out.append(f"MLX active memory {s.flushed_active / MB:.1f} MB after every model was unloaded "
                   f"(at start {base / MB:.1f} MB): memory left behind")
    if s.overhead_first_rotation is not None and s.rss_first_rotation:
        growth = s.overhead_last_rotation - s.overhead_first_rotation
        if growth > RSS_GROWTH * s.rss_first_rotation:
            out.append(f"RSS grew by {growth / MB:.0f} MB beside MLX's memory between the first and the last "
                       f"rotation ({growth / s.rss_first_rotation:.0%} of {s.rss_first_rotation / MB:.0f} MB; at most "
                       f"{RSS_GROWTH:.0%})")
    return out


# ---- the printed summary ------------------------------------------------------------------------

def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / MB:,.1f} MB"


def table(s: Summary) -> str:
    rows = [f"soak: {s.clients} clients for {s.seconds / 60:.1f} min, {sum(s.requests.values())} requests, "
            f"{s.samples} samples",
            "", "requests by status and code:"]
    rows += [f"  {n:7d}  {what}" for what, n in s.requests.items()]
    rows += ["", "requests by kind: " + ", ".join(f"{k} {n}" for k, n in s.kinds.items()),
             "latency of whole answers: " + "  ".join(f"{q} {v:.2f} s" for q, v in s.latency.items()),
             f"multi-turn: {s.multiturn[1]} of {s.multiturn[0]} answered turns had cached prompt tokens",
             "", f"loads {s.loads}; evictions by reason (/metrics | history): "
             + (", ".join(f"{r} {n} | {s.evictions_history.get(r, 0)}" for r, n in sorted(s.evictions_metric.items()))
                or "none"),
             f"  history rows without bytes freed {s.evictions_unfreed}; freeing < 90% {s.eviction_warnings}"
             + ("; history truncated at 1000 rows" if s.history_truncated else ""),
             f"peak usage {_mb(s.peak_usage)} vs hard line {_mb(s.hard_bytes)}; "
             f"longest stretch above it: {s.hard_overrun_ticks} tick(s)",
             f"RSS start {_mb(s.rss_start)} end {_mb(s.rss_end)}; MLX active start {_mb(s.active_start)} "
             f"end {_mb(s.active_end)}; at most {_mb(s.unaccounted_peak)} beyond the models and caches",
             f"rotations {s.rotations} (from {s.rotations_from:.0f} s on: clients running, every model loaded once): "
             f"RSS {_mb(s.rss_first_rotation)} at the first, "
             f"{_mb(s.rss_last_rotation)} at the last; beside MLX's memory {_mb(s.overhead_first_rotation)} -> "
             f"{_mb(s.overhead_last_rotation)}",
             f"at the end: leases {s.end_leases}, requests {s.end_requests}, MLX active {_mb(s.end_active)} "
             f"for {_mb(s.end_accounted)} of models and caches; {_mb(s.flushed_active)} once all were unloaded",
             f"/health failures {s.health_failures}; server exit code {s.exit_code}"]
    return "\n".join(rows)

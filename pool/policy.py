"""Pure memory policy: who to evict for a load, what to unload when idle, what the enforcer does.

Nothing here touches MLX, Django, the clock or the event loop. The pool builds `ModelView`s and
`Readings`, passes times in, and applies the returned plans and actions.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30

LEVELS = ("ok", "soft", "hard", "emergency")
EMERGENCY_MARGIN_BYTES = 2 * GIB
EMERGENCY_POLLS = 2
GUARD_RESERVES = {"safe": 8 * GIB, "balanced": 6 * GIB, "aggressive": 4 * GIB}
SMALL_SYSTEM_BYTES = 24 * GIB
SMALL_SYSTEM_RESERVE = 4 * GIB
ACTIVE_POLL_SECONDS = 1.0
IDLE_POLL_SECONDS = 10.0
EMPTY_POLL_SECONDS = 30.0
WAKE_WINDOW_SECONDS = 2.0


@dataclass(frozen=True)
class ModelView:
    id: str
    state: str  # "unloaded" | "loading" | "loaded" | "failed"
    size_bytes: int  # estimated: sum of weight files
    measured_bytes: int | None = None  # MLX active memory gained by the load, once loaded
    pinned: bool = False
    leases: int = 0  # requests admitted or running on it
    last_access: float = 0.0  # set when a request starts
    idle_since: float = 0.0  # when its last lease ended, or when it finished loading
    ttl_seconds: float | None = None  # effective idle TTL; None = never
    keep_alive: float | None = None  # seconds; 0 = unload now; -1 = until evicted; None = use ttl
    marked_for_unload: str | None = None  # reason, set by the enforcer's emergency rung

    @property
    def footprint(self) -> int:
        return self.measured_bytes if self.measured_bytes is not None else self.size_bytes

    @property
    def busy(self) -> bool:
        return self.leases > 0

    @property
    def resident(self) -> bool:
        """A loading model already counts against the budget."""
        return self.state in ("loaded", "loading")


# --- LRU victims ---------------------------------------------------------------------------


def is_evictable(model: ModelView) -> bool:
    return model.state == "loaded" and not model.pinned and not model.busy


def lru_victims(models: list[ModelView]) -> list[ModelView]:
    """Idle, unpinned, loaded models, least recently used first (ties by id)."""
    return sorted(filter(is_evictable, models), key=lambda m: (m.last_access, m.id))


def lru_ranks(models: list[ModelView]) -> dict[str, int]:
    """id -> position in `lru_victims` (0 = next victim); never-victims are absent."""
    return {m.id: rank for rank, m in enumerate(lru_victims(models))}


# --- admission -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionPlan:
    fits: bool
    victims: tuple[str, ...]  # ids to unload, in order, before loading
    with_headroom: bool  # False when it fits only without the KV headroom
    code: str | None  # None | "model_too_large" | "insufficient_memory" | "too_many_models"
    message: str
    blockers: tuple[str, ...]  # pinned, busy or loading resident models (when not fits)
    needed_bytes: int  # S * (1 + headroom), or S without headroom; 0 when already resident
    resident_bytes: int  # footprints of resident models other than the target
    budget_bytes: int | None


def plan_admission(
    models: list[ModelView],
    target_id: str,
    *,
    budget: int | None,
    max_loaded: int = 0,
    headroom: float = 0.25,
) -> AdmissionPlan:
    """Decide, all or nothing, which idle models to unload so that `target_id` can load.

    Victims come from `lru_victims` in order; a plan that cannot fit unloads nothing.
    """
    target = _find(models, target_id)
    others = [m for m in models if m.resident and m.id != target_id]
    resident_bytes = sum(m.footprint for m in others)
    if target.resident:
        return AdmissionPlan(
            fits=True, victims=(), with_headroom=True, code=None,
            message=f"'{target_id}' is already {target.state}", blockers=(),
            needed_bytes=0, resident_bytes=resident_bytes, budget_bytes=budget,
        )

    size = target.size_bytes
    with_headroom_bytes = int(size * (1 + headroom))
    candidates = lru_victims(others)
    blockers = [m for m in others if not is_evictable(m)]
    request = _describe_request(target_id, size, headroom, with_headroom=True)

    def refuse(code: str, message: str) -> AdmissionPlan:
        return AdmissionPlan(
            fits=False, victims=(), with_headroom=True, code=code, message=message,
            blockers=tuple(m.id for m in blockers), needed_bytes=with_headroom_bytes,
            resident_bytes=resident_bytes, budget_bytes=budget,
        )

    if budget is not None and size > budget:
        return refuse(
            "model_too_large",
            f"cannot load '{target_id}': it needs {format_bytes(size)} but the model budget is "
            f"{format_bytes(budget)}",
        )

    with_headroom = True
    needed = with_headroom_bytes
    memory_count = 0
    if budget is not None:
        memory_count = _victims_to_fit(candidates, resident_bytes, with_headroom_bytes, budget)
        if memory_count is None:
            with_headroom = False
            needed = size
            memory_count = _victims_to_fit(candidates, resident_bytes, size, budget)
        if memory_count is None:
            return refuse(
                "insufficient_memory",
                f"cannot load {request}: {_describe_blockers(blockers)}; "
                f"budget {format_bytes(budget)}",
            )

    count_needed = _victims_for_count_cap(len(others), max_loaded)
    if count_needed > len(candidates):
        return refuse(
            "too_many_models",
            f"cannot load '{target_id}': at most {max_loaded} model{'s' if max_loaded > 1 else ''} "
            f"may be loaded and {_describe_blockers(blockers)}",
        )

    victims = tuple(m.id for m in candidates[: max(memory_count, count_needed)])
    return AdmissionPlan(
        fits=True, victims=victims, with_headroom=with_headroom, code=None,
        message=_describe_fit(target_id, size, headroom, with_headroom, victims, budget),
        blockers=(), needed_bytes=needed, resident_bytes=resident_bytes, budget_bytes=budget,
    )


def _find(models: list[ModelView], model_id: str) -> ModelView:
    for model in models:
        if model.id == model_id:
            return model
    raise KeyError(f"unknown model {model_id!r}")


def _victims_to_fit(
    candidates: list[ModelView], resident_bytes: int, needed: int, budget: int
) -> int | None:
    """Length of the shortest LRU prefix whose unloading makes `needed` fit; None if none does."""
    remaining = resident_bytes
    for count in range(len(candidates) + 1):
        if remaining + needed <= budget:
            return count
        if count < len(candidates):
            remaining -= candidates[count].footprint
    return None


def _victims_for_count_cap(resident_count: int, max_loaded: int) -> int:
    if max_loaded <= 0:
        return 0
    return max(0, resident_count + 1 - max_loaded)


def format_bytes(n: int) -> str:
    """Decimal units, like conf.parse_size's: 1.2 GB, 115.2 MB, 999 B."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _describe_request(model_id: str, size: int, headroom: float, *, with_headroom: bool) -> str:
    if headroom <= 0:
        return f"'{model_id}' ({format_bytes(size)})"
    if with_headroom:
        return f"'{model_id}' ({format_bytes(size)} + {headroom:.0%} KV headroom)"
    return f"'{model_id}' ({format_bytes(size)}, without its {headroom:.0%} KV headroom)"


def _describe_fit(
    model_id: str, size: int, headroom: float, with_headroom: bool,
    victims: tuple[str, ...], budget: int | None,
) -> str:
    text = f"loading {_describe_request(model_id, size, headroom, with_headroom=with_headroom)}"
    if victims:
        text += " after unloading " + _join(f"'{v}'" for v in victims)
    if budget is None:
        return text + "; memory budget off"
    return text + f"; budget {format_bytes(budget)}"


def _describe_blockers(blockers: list[ModelView]) -> str:
    if not blockers:
        return "no other model can be unloaded"
    return _join(f"'{m.id}' is {_why_kept(m)}" for m in blockers)


def _why_kept(model: ModelView) -> str:
    if model.state == "loading":
        return "loading"
    if model.pinned:
        return "pinned"
    if model.leases == 1:
        return "serving a request"
    return f"serving {model.leases} requests"


def _join(parts) -> str:
    items = list(parts)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# --- idle expiry ---------------------------------------------------------------------------


def expired(models: list[ModelView], now: float) -> list[tuple[str, str]]:
    """(id, reason) of loaded, idle, unpinned models whose keep_alive or TTL has run out."""
    due = []
    for model in models:
        limit = _idle_limit(model)
        if limit is not None and _idle_seconds(model, now) >= limit[0]:
            due.append((model.id, limit[1]))
    return due


def ttl_remaining(model: ModelView, now: float) -> float | None:
    """Seconds until `expired` fires for this model (0 if due); None if time never unloads it."""
    limit = _idle_limit(model)
    if limit is None:
        return None
    return max(0.0, limit[0] - _idle_seconds(model, now))


def _idle_limit(model: ModelView) -> tuple[float, str] | None:
    """(idle seconds allowed, reason), or None when time alone never unloads the model."""
    if model.state != "loaded" or model.pinned or model.busy:
        return None
    if model.keep_alive is not None:
        # Any negative keep_alive means "until evicted for space", as in Ollama.
        return None if model.keep_alive < 0 else (model.keep_alive, "keep_alive")
    if model.ttl_seconds is None:
        return None
    return (model.ttl_seconds, "ttl")


def _idle_seconds(model: ModelView, now: float) -> float:
    return max(0.0, now - model.idle_since)


def merge_keep_alive(current: float | None, new: float | None) -> float | None:
    """Concurrent requests keep the longest: -1 > any positive > 0; None has no opinion."""
    if current is None:
        return new
    if new is None:
        return current
    return max(current, new, key=_keep_alive_length)


def _keep_alive_length(keep_alive: float) -> float:
    return float("inf") if keep_alive < 0 else keep_alive


# --- budget and ceiling maths --------------------------------------------------------------


def auto_model_budget(total_bytes: int) -> int:
    reserve = min(max(0.2 * total_bytes, 2 * GIB), 8 * GIB)
    return int(0.9 * (total_bytes - reserve))


def guard_reserve(guard: str, total_bytes: int) -> int:
    if guard not in GUARD_RESERVES:
        raise ValueError(f"unknown memory guard {guard!r} (use {', '.join(GUARD_RESERVES)})")
    if total_bytes < SMALL_SYSTEM_BYTES:
        return SMALL_SYSTEM_RESERVE
    return GUARD_RESERVES[guard]


def auto_ceiling(total_bytes: int, guard: str, device_limit: int | None) -> int:
    """total - reserve, capped by the device's working-set limit when it reports one (> 0)."""
    ceiling = total_bytes - guard_reserve(guard, total_bytes)
    if device_limit:
        ceiling = min(ceiling, device_limit)
    return ceiling


@dataclass(frozen=True)
class Lines:
    ceiling: int
    soft: int
    hard: int


def pressure_lines(ceiling: int, soft_fraction: float = 0.90, hard_fraction: float = 0.95) -> Lines:
    soft, hard = int(ceiling * soft_fraction), int(ceiling * hard_fraction)
    return Lines(ceiling=ceiling, soft=soft, hard=hard)


def kv_bytes(
    *, layers: int, kv_heads: int, head_dim: int, bytes_per_element: int, tokens: int
) -> int:
    """KV cache size: keys and values (the 2) for every layer, head and token."""
    return layers * kv_heads * head_dim * 2 * bytes_per_element * tokens


def prefill_check(*, kv_estimate: int, usage: int, evictable_bytes: int, hard_line: int) -> bool:
    """True when the prompt fits under the hard line once idle models are evicted."""
    return usage - evictable_bytes + kv_estimate <= hard_line


# --- the enforcer tick ---------------------------------------------------------------------


@dataclass(frozen=True)
class Readings:
    usage: int  # bytes counted against the ceiling
    reclaimable: int  # MLX cache + prompt caches: costs nothing to free
    lines: Lines


@dataclass(frozen=True)
class Action:
    kind: str  # "reclaim" | "unload" | "abort_load" | "abort_requests" | "mark_unload"
    model: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class TickDecision:
    level: str
    admission_paused: bool
    actions: tuple[Action, ...]
    over_ceiling_polls: int  # carried to the next tick


def level_at_least(level: str, floor: str) -> bool:
    return LEVELS.index(level) >= LEVELS.index(floor)


def classify(usage: int, lines: Lines, over_ceiling_polls: int) -> tuple[str, int]:
    """(level, consecutive polls at or above the ceiling)."""
    polls = over_ceiling_polls + 1 if usage >= lines.ceiling else 0
    if usage >= lines.ceiling + EMERGENCY_MARGIN_BYTES or polls >= EMERGENCY_POLLS:
        return "emergency", polls
    if usage >= lines.hard:
        return "hard", polls
    if usage >= lines.soft:
        return "soft", polls
    return "ok", polls


def decide(
    readings: Readings, models: list[ModelView], *, over_ceiling_polls: int, reclaimed: bool
) -> TickDecision:
    """One enforcer tick: what to unload, abort or mark, aiming below the soft line.

    Within one tick, the re-measure call (reclaimed=True) takes the same `over_ceiling_polls`
    as the first call, so that one tick counts as one poll.
    """
    level, polls = classify(readings.usage, readings.lines, over_ceiling_polls)
    drained = _unload_drained_marks(models)
    if level == "ok":
        return TickDecision(level, False, tuple(drained), polls)
    if not reclaimed and readings.reclaimable > 0:
        # Freeing the cache costs nothing; evicting a model costs a reload (oMLX #3338).
        reclaim = Action("reclaim", reason="cache_reclaim")
        return TickDecision(level, True, (*drained, reclaim), polls)

    gone = {a.model for a in drained}
    remaining = [m for m in models if m.id not in gone]
    predicted = readings.usage - sum(m.footprint for m in models if m.id in gone)
    actions = drained + _relieve(level, remaining, predicted, readings.lines.soft)
    return TickDecision(level, True, tuple(actions), polls)


def _unload_drained_marks(models: list[ModelView]) -> list[Action]:
    """Marked models unload as soon as they are idle, whatever the level (no latch: oMLX #3363)."""
    return [
        Action("unload", m.id, m.marked_for_unload)
        for m in models
        if m.marked_for_unload and m.state == "loaded" and not m.busy and not m.pinned
    ]


_EVICTION_REASONS = {"soft": "pressure_soft", "hard": "pressure_hard", "emergency": "emergency"}


def _relieve(level: str, models: list[ModelView], predicted: int, soft: int) -> list[Action]:
    actions, predicted = _evict_idle(
        models, predicted, soft, _EVICTION_REASONS[level], keep_last_unpinned=(level == "soft")
    )
    if level == "soft" or predicted < soft:
        return actions
    aborts, predicted = _abort_loads(models, predicted)
    actions += aborts
    if predicted < soft:
        return actions
    if level == "hard":
        return actions + _abort_lru_busy(models)
    return actions + _emergency_aborts(models)


def _evict_idle(
    models: list[ModelView], predicted: int, soft: int, reason: str, *, keep_last_unpinned: bool
) -> tuple[list[Action], int]:
    unpinned_loaded = sum(1 for m in models if m.state == "loaded" and not m.pinned)
    actions = []
    for victim in lru_victims(models):
        if predicted < soft:
            break
        # At soft, a model that will be asked for again is worth more than headroom.
        if keep_last_unpinned and unpinned_loaded <= 1:
            break
        actions.append(Action("unload", victim.id, reason))
        predicted -= victim.footprint
        unpinned_loaded -= 1
    return actions, predicted


def _abort_loads(models: list[ModelView], predicted: int) -> tuple[list[Action], int]:
    loading = [m for m in models if m.state == "loading"]
    actions = [Action("abort_load", m.id, "load_aborted") for m in loading]
    return actions, predicted - sum(m.size_bytes for m in loading)


def _busy_loaded_lru(models: list[ModelView], *, include_pinned: bool) -> list[ModelView]:
    busy = [
        m for m in models
        if m.state == "loaded" and m.busy and (include_pinned or not m.pinned)
    ]
    return sorted(busy, key=lambda m: (m.last_access, m.id))


def _abort_lru_busy(models: list[ModelView]) -> list[Action]:
    """Abort the requests of the least recently used busy unpinned model; it stays loaded."""
    busy = _busy_loaded_lru(models, include_pinned=False)
    return [Action("abort_requests", busy[0].id, "requests_aborted")] if busy else []


def _emergency_aborts(models: list[ModelView]) -> list[Action]:
    """Abort every request (pinned models stay loaded) and mark the LRU busy unpinned model."""
    actions = [
        Action("abort_requests", m.id, "emergency")
        for m in _busy_loaded_lru(models, include_pinned=True)
    ]
    busy_unpinned = _busy_loaded_lru(models, include_pinned=False)
    if busy_unpinned and not busy_unpinned[0].marked_for_unload:
        actions.append(Action("mark_unload", busy_unpinned[0].id, "emergency"))
    return actions


# --- polling -------------------------------------------------------------------------------


def poll_interval(
    *,
    level: str,
    requests_running: bool,
    loading: bool,
    seconds_since_wake: float | None,
    loaded_count: int,
) -> float:
    recently_woken = seconds_since_wake is not None and seconds_since_wake < WAKE_WINDOW_SECONDS
    if level != "ok" or requests_running or loading or recently_woken:
        return ACTIVE_POLL_SECONDS
    return IDLE_POLL_SECONDS if loaded_count > 0 else EMPTY_POLL_SECONDS

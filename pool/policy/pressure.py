"""The enforcer's decisions: the ceiling and its lines, the level a reading is at, and the actions
one tick takes, in a fixed order (reclaim, pause admission, drop draft models, evict, abort loads, abort
requests)."""

from __future__ import annotations

from dataclasses import dataclass

from .load_plan import ModelView, lru_victims
from .units import GIB
from .vocabulary import ActionKind, Level, ModelState, PrefillVerdict, Reason

EMERGENCY_MARGIN_BYTES = 2 * GIB
EMERGENCY_POLLS = 2
GUARD_RESERVES = {"safe": 8 * GIB, "balanced": 6 * GIB, "aggressive": 4 * GIB}
SMALL_SYSTEM_BYTES = 24 * GIB
SMALL_SYSTEM_RESERVE = 4 * GIB
ACTIVE_POLL_SECONDS = 1.0
IDLE_POLL_SECONDS = 10.0
EMPTY_POLL_SECONDS = 30.0
WAKE_WINDOW_SECONDS = 2.0


# --- the ceiling and its lines ---------------------------------------------------------------


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
    return Lines(ceiling=ceiling, soft=int(ceiling * soft_fraction), hard=int(ceiling * hard_fraction))


def classify(usage: int, lines: Lines, over_ceiling_polls: int) -> tuple[Level, int]:
    """(level, consecutive polls at or above the ceiling)."""
    polls = over_ceiling_polls + 1 if usage >= lines.ceiling else 0
    if usage >= lines.ceiling + EMERGENCY_MARGIN_BYTES or polls >= EMERGENCY_POLLS:
        return Level.EMERGENCY, polls
    if usage >= lines.hard:
        return Level.HARD, polls
    if usage >= lines.soft:
        return Level.SOFT, polls
    return Level.OK, polls


# --- the prefill guard -----------------------------------------------------------------------


def prefill_verdict(*, kv_estimate: int, usage: int, evictable_bytes: int, reclaimable_bytes: int,
                    live_kv_bytes: int, hard_line: int) -> PrefillVerdict:
    """Whether a prompt's KV cache fits under the hard line: now, once the caches are reclaimed and the
    idle models evicted (FITS); only once the running requests' KV is freed too (BUSY: try again
    shortly); or not even then (TOO_LARGE: the request itself is the problem). Other requests' KV
    must not make a small prompt look too large."""
    floor = usage - evictable_bytes - reclaimable_bytes
    if floor + kv_estimate <= hard_line:
        return PrefillVerdict.FITS
    if floor - live_kv_bytes + kv_estimate <= hard_line:
        return PrefillVerdict.BUSY
    return PrefillVerdict.TOO_LARGE


# --- one tick ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Readings:
    usage: int  # bytes counted against the ceiling
    reclaimable: int  # MLX cache + prompt caches: costs nothing to free
    lines: Lines
    mlx_cache: int = 0  # MLX's buffer cache alone
    mlx_cache_max: int | None = None  # beyond this it is cleared at any level (OMLX_MLX_CACHE_MAX); None = no bound


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    model: str | None = None
    reason: Reason | None = None


@dataclass(frozen=True)
class TickDecision:
    level: Level
    admission_paused: bool
    actions: tuple[Action, ...]
    over_ceiling_polls: int  # carried to the next tick


EVICTION_REASONS = {Level.SOFT: Reason.PRESSURE_SOFT, Level.HARD: Reason.PRESSURE_HARD,
                    Level.EMERGENCY: Reason.EMERGENCY}


def decide(readings: Readings, models: list[ModelView], *, over_ceiling_polls: int, reclaimed: bool) -> TickDecision:
    """One enforcer tick: what to unload, abort or mark, aiming below the soft line.

    Within one tick, the re-measure call (reclaimed=True) takes the same `over_ceiling_polls`
    as the first call, so that one tick counts as one poll.
    """
    level, polls = classify(readings.usage, readings.lines, over_ceiling_polls)
    drained = _unload_drained_marks(models)
    if level == Level.OK:
        # at ok only MLX's buffer cache, and only beyond its bound: what an unload or a burst left there
        over = cache_over_bound(readings.mlx_cache, readings.mlx_cache_max)
        trim = (Action(ActionKind.RECLAIM, reason=Reason.CACHE_RECLAIM),) if over and not reclaimed else ()
        return TickDecision(level, False, (*drained, *trim), polls)
    if not reclaimed and readings.reclaimable > 0:
        # Freeing the cache costs nothing; evicting a model costs a reload (oMLX #3338).
        reclaim = Action(ActionKind.RECLAIM, reason=Reason.CACHE_RECLAIM)
        return TickDecision(level, True, (*drained, reclaim), polls)

    gone = {a.model for a in drained}
    remaining = [m for m in models if m.id not in gone]
    predicted = readings.usage - sum(m.footprint for m in models if m.id in gone)
    actions = drained + _relieve(level, remaining, predicted, readings.lines.soft)
    return TickDecision(level, True, tuple(actions), polls)


def cache_over_bound(mlx_cache: int, bound: int | None) -> bool:
    """MLX's buffer cache is past OMLX_MLX_CACHE_MAX (None: no bound): cleared at any level."""
    return bound is not None and mlx_cache > bound


def _unload_drained_marks(models: list[ModelView]) -> list[Action]:
    """Marked models unload as soon as they are idle, whatever the level (no latch: oMLX #3363)."""
    return [Action(ActionKind.UNLOAD, m.id, m.marked_for_unload) for m in models
            if m.marked_for_unload and m.state == ModelState.LOADED and not m.busy and not m.pinned]


def _relieve(level: Level, models: list[ModelView], predicted: int, soft: int) -> list[Action]:
    actions, predicted = _drop_drafts(models, predicted, soft, EVICTION_REASONS[level])
    if predicted < soft:
        return actions
    evictions, predicted = _evict_idle(models, predicted, soft, EVICTION_REASONS[level],
                                       keep_last_unpinned=(level == Level.SOFT))
    actions += evictions
    if level == Level.SOFT or predicted < soft:
        return actions
    aborts, predicted = _abort_loads(models, predicted)
    actions += aborts
    if predicted < soft:
        return actions
    if level == Level.HARD:
        return actions + _abort_lru_busy(models)
    return actions + _emergency_aborts(models)


def _drop_drafts(models: list[ModelView], predicted: int, soft: int, reason: Reason) -> tuple[list[Action], int]:
    """Draft models go before any model (least recently used first, pinned or busy alike): a draft
    only speeds its model up, and its model goes on decoding without it."""
    actions = []
    for m in sorted((m for m in models if m.loaded_draft_bytes), key=lambda m: (m.last_access, m.id)):
        if predicted < soft:
            break
        actions.append(Action(ActionKind.DROP_DRAFT, m.id, reason))
        predicted -= m.loaded_draft_bytes
    return actions, predicted


def _evict_idle(models: list[ModelView], predicted: int, soft: int, reason: Reason, *,
                keep_last_unpinned: bool) -> tuple[list[Action], int]:
    unpinned_loaded = sum(1 for m in models if m.state == ModelState.LOADED and not m.pinned)
    actions = []
    for victim in lru_victims(models):
        if predicted < soft:
            break
        # At soft, a model that will be asked for again is worth more than headroom.
        if keep_last_unpinned and unpinned_loaded <= 1:
            break
        actions.append(Action(ActionKind.UNLOAD, victim.id, reason))
        predicted -= victim.footprint
        unpinned_loaded -= 1
    return actions, predicted


def _abort_loads(models: list[ModelView], predicted: int) -> tuple[list[Action], int]:
    loading = [m for m in models if m.state == ModelState.LOADING]
    actions = [Action(ActionKind.ABORT_LOAD, m.id, Reason.LOAD_ABORTED) for m in loading]
    return actions, predicted - sum(m.size_bytes for m in loading)


def _busy_loaded_lru(models: list[ModelView], *, include_pinned: bool) -> list[ModelView]:
    busy = [m for m in models if m.state == ModelState.LOADED and m.busy and (include_pinned or not m.pinned)]
    return sorted(busy, key=lambda m: (m.last_access, m.id))


def _abort_lru_busy(models: list[ModelView]) -> list[Action]:
    """Abort the requests of the least recently used busy unpinned model; it stays loaded."""
    busy = _busy_loaded_lru(models, include_pinned=False)
    return [Action(ActionKind.ABORT_REQUESTS, busy[0].id, Reason.REQUESTS_ABORTED)] if busy else []


def _emergency_aborts(models: list[ModelView]) -> list[Action]:
    """Abort every request (pinned models stay loaded) and mark the LRU busy unpinned model."""
    actions = [Action(ActionKind.ABORT_REQUESTS, m.id, Reason.EMERGENCY)
               for m in _busy_loaded_lru(models, include_pinned=True)]
    busy_unpinned = _busy_loaded_lru(models, include_pinned=False)
    if busy_unpinned and not busy_unpinned[0].marked_for_unload:
        actions.append(Action(ActionKind.MARK_UNLOAD, busy_unpinned[0].id, Reason.EMERGENCY))
    return actions


# --- the prompt cache cap ----------------------------------------------------------------------

MIN_CACHE_FRACTION = 1 / 64


def next_cache_fraction(fraction: float, level: Level) -> float:
    """oMLX's store-cache cap walk, one step per tick: the prompt caches' cap (a fraction of the
    configured one) halves under pressure and doubles back towards it when memory is ok."""
    if level == Level.OK:
        return min(1.0, fraction * 2)
    return max(MIN_CACHE_FRACTION, fraction / 2)


PREFILL_CAPS = {Level.OK: None, Level.SOFT: 256, Level.HARD: 128, Level.EMERGENCY: 128}


def prefill_step(level: Level, base: int) -> int:
    """Prompt tokens read per step (oMLX's adaptive prefill chunk): the configured step when memory
    is ok, smaller under pressure, so one long prompt's transient peak stays small. Running streams
    decode a token between two chunks, so the step also bounds how long a long prompt holds them."""
    cap = PREFILL_CAPS[level]
    return base if cap is None else min(base, cap)


# --- polling -----------------------------------------------------------------------------------


def poll_interval(*, level: Level, requests_running: bool, loading: bool, seconds_since_wake: float | None,
                  loaded_count: int) -> float:
    recently_woken = seconds_since_wake is not None and seconds_since_wake < WAKE_WINDOW_SECONDS
    if level != Level.OK or requests_running or loading or recently_woken:
        return ACTIVE_POLL_SECONDS
    return IDLE_POLL_SECONDS if loaded_count > 0 else EMPTY_POLL_SECONDS

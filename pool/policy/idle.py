"""When time alone unloads a model: its TTL, or the keep-alive its last busy period chose."""

from __future__ import annotations

from .load_plan import ModelView, with_adapters
from .vocabulary import ModelState, Reason


def expired(models: list[ModelView], now: float) -> list[tuple[str, Reason]]:
    """(id, reason) of loaded, idle, unpinned models whose keep_alive or TTL has run out."""
    due = []
    for model in with_adapters(models):      # a base stays while an adapter of it is pinned
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


def next_expiry_in(models: list[ModelView], now: float) -> float | None:
    remaining = [r for r in (ttl_remaining(m, now) for m in models) if r is not None]
    return min(remaining) if remaining else None


def _idle_limit(model: ModelView) -> tuple[float, Reason] | None:
    """(idle seconds allowed, reason), or None when time alone never unloads the model."""
    if model.state != ModelState.LOADED or model.pinned or model.busy:
        return None
    if model.keep_alive is not None:
        # Any negative keep_alive means "until evicted for space", as in Ollama.
        return None if model.keep_alive < 0 else (model.keep_alive, Reason.KEEP_ALIVE)
    if model.ttl_seconds is None:
        return None
    return (model.ttl_seconds, Reason.TTL)


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

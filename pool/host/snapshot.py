"""The one shape of the pool's state, used by /api/pool, the websocket and the dashboard."""

from __future__ import annotations

from typing import Any

from ..catalog.kinds import model_card
from ..engines.protocol import CacheStats
from ..policy.idle import ttl_remaining
from ..policy.kv import kv_estimate
from ..policy.load_plan import ModelView, lru_ranks
from ..policy.vocabulary import ModelState
from .engine_options import disk_tier

CACHE_FIELDS = ("kv_bytes", "prompt_cache_bytes", "prompt_cache_entries", "prompt_cache_cap_bytes")
COUNTER_FIELDS = {"prompt_cache_hits": "hits", "prompt_cache_misses": "misses", "prompt_tokens_saved": "tokens_saved",
                  "prompt_cache_disk_bytes": "disk_bytes", "prompt_cache_disk_entries": "disk_entries",
                  "prompt_cache_disk_hits": "disk_hits"}


def kv_layout(entry, context_length: int | None) -> dict[str, Any] | None:
    """What a loaded language model's KV weighs (policy.kv.KVLayout, read off its caches): per token
    of the layers that keep every token, fixed per sequence, the sliding windows, each kind of layer,
    and one request's KV at the model's whole context."""
    layout = (getattr(entry.engine, "model_info", None) or {}).get("kv_layout") if entry.engine else None
    if layout is None:
        return None
    return {**layout.summary(),
            "kv_bytes_at_context": kv_estimate(layout, tokens=context_length) if context_length else None}


def model_row(entry, view: ModelView, rank: int | None, now: float, cache: CacheStats | None,
              slots: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    loaded = entry.state == ModelState.LOADED
    card = model_card(entry.card_folder, entry.kind)
    return {
        "id": entry.id,
        "alias": entry.alias,
        "kind": entry.kind.name,  # pool/catalog/kinds.py: "chat" | "embeddings" | "vision" | "adapter"
        "base": entry.base,       # an adapter's base model
        **card,   # capabilities, context_length (read from the folder, cached)
        "display_name": entry.model_settings.get("display_name") or "",
        "hidden": entry.hidden,
        "state": entry.state,
        "pinned": entry.pinned,
        "size_bytes": entry.size_bytes,
        "measured_bytes": entry.measured_bytes,
        "active_requests": entry.leases,
        "running": slots[0],      # of the model's OMLX_MAX_CONCURRENT slots, held
        "queued": slots[1],       # waiting for a slot (counted in active_requests: they hold leases)
        "last_access": entry.last_access or None,
        "idle_seconds": round(now - entry.idle_since, 1) if loaded and not entry.leases else None,
        "ttl_seconds": view.ttl_seconds,
        "ttl_remaining_seconds": _rounded(ttl_remaining(view, now)),
        "keep_alive": entry.keep_alive,
        "lru_rank": rank,
        "loading_seconds": round(now - entry.load_started_at, 1) if entry.load_started_at else None,
        "load_progress": entry.load_progress,   # {bytes_done, bytes_total, eta_seconds} while loading
        "load_seconds": _rounded(entry.load_seconds),
        "load_note": entry.load_note,
        "warming": bool(loaded and getattr(entry.engine, "warming", False)),   # the warm-up's shapes run
        "failure": entry.failure,
        "marked_for_unload": entry.marked_for_unload,
        # KV memory beside the weights: live requests' KV and the prefix cache (loaded models only)
        **{name: getattr(cache, name) if cache else None for name in CACHE_FIELDS},
        "kv_layout": kv_layout(entry, card.get("context_length")) if loaded else None,
        "draft": (getattr(entry.engine, "model_info", None) or {}).get("draft") if loaded else None,
        **{name: getattr(cache, field) if cache else None for name, field in COUNTER_FIELDS.items()},
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def build(pool, slots, reading, enforcer_state: dict[str, Any] | None = None) -> dict[str, Any]:
    now = pool.clock()
    views = {v.id: v for v in pool.views()}
    ranks = lru_ranks(list(views.values()))
    order = sorted(pool.entries.values(),
                   key=lambda e: (ranks.get(e.id, len(ranks)), e.state != ModelState.LOADED, -e.last_access, e.id))
    models = [model_row(e, views[e.id], ranks.get(e.id), now, pool.cache_stats(e.id), slots.counts(e.id))
              for e in order]
    resident = [v for v in views.values() if v.resident]
    tier = disk_tier(pool.conf)
    memory = {
        "model_budget_bytes": pool.budget(reading),
        "model_bytes": sum(v.footprint for v in resident),
        "active_bytes": reading.active,
        "cache_bytes": reading.cache,
        "peak_bytes": reading.peak,
        "rss_bytes": reading.rss,
        "total_bytes": reading.capacity,
        "available_bytes": reading.available,
        "usage_bytes": reading.usage,
        "reclaimable_bytes": reading.reclaimable,
        # a discrete GPU: what the process holds there beyond MLX's buffers (counted in usage_bytes)
        "device_floor_bytes": reading.device_floor,
        "kv_bytes": sum(m["kv_bytes"] or 0 for m in models),
        "prompt_cache_bytes": sum(m["prompt_cache_bytes"] or 0 for m in models),
        "prompt_cache_cap_fraction": pool.cache_fraction,
        # the prompt caches' disk tier, every model's folder (loaded or not), and its total cap
        "prompt_cache_disk_bytes": tier.nbytes if tier is not None else 0,
        "prompt_cache_disk_cap_bytes": tier.total_bytes if tier is not None else 0,
        "prefill_step": pool.prefill_step,
        "prefill_step_alone": pool.prefill_step_alone,
    }
    memory.update(enforcer_state or {})
    return {"type": "snapshot", "time": now, "models": models, "memory": memory,
            "max_loaded_models": pool.conf.max_loaded_models or None,
            "max_concurrent": slots.limit or None, "queue_per_model": slots.queue_limit,
            "events": list(reversed(pool.events.recent))}

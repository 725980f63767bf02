"""The pool's words, defined once: model states, pressure levels, event reasons, enforcer actions,
admission refusals and pool changes. StrEnums, so they compare equal to their JSON strings and the
ORM's choices are built from them."""

from __future__ import annotations

from enum import StrEnum


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


class Level(StrEnum):
    OK = "ok"
    SOFT = "soft"
    HARD = "hard"
    EMERGENCY = "emergency"

    @property
    def rank(self) -> int:
        return list(Level).index(self)


class Reason(StrEnum):
    """Why an event happened: the eviction history's `reason` column."""
    LRU = "lru"
    COUNT_CAP = "count_cap"
    TTL = "ttl"
    KEEP_ALIVE = "keep_alive"
    MANUAL = "manual"
    PRESSURE_SOFT = "pressure_soft"
    PRESSURE_HARD = "pressure_hard"
    EMERGENCY = "emergency"
    CACHE_RECLAIM = "cache_reclaim"
    LOAD_ABORTED = "load_aborted"
    REQUESTS_ABORTED = "requests_aborted"
    STORAGE_FAULT = "storage_fault"          # writes under the data folder started failing (pool/storage.py)
    STORAGE_RECOVERED = "storage_recovered"  # ... and work again
    ENGINE_FAILED = "engine_failed"          # its engine ended on an error of its own (a device error, say)


class ActionKind(StrEnum):
    """What an event did: the enforcer's actions, and the pool's own unloads."""
    RECLAIM = "reclaim"
    UNLOAD = "unload"
    ABORT_LOAD = "abort_load"
    ABORT_REQUESTS = "abort_requests"
    MARK_UNLOAD = "mark_unload"
    DROP_DRAFT = "drop_draft"        # a model's draft model let go; the model stays (engines/drafting.py)
    STORAGE = "storage"              # not the enforcer's: the data folder's state changed


class Refusal(StrEnum):
    """Why a model cannot be loaded now (a 507's `code`)."""
    MODEL_TOO_LARGE = "model_too_large"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    TOO_MANY_MODELS = "too_many_models"


class Rejection(StrEnum):
    """Why a request was turned away before it ran: the admission_rejections metric's `reason`."""
    QUEUE_FULL = "queue_full"               # admission paused by memory pressure and its queue full
    TIMEOUT = "timeout"                     # admission stayed paused too long
    PREFILL = "prefill"                     # the prompt's KV cache cannot fit (a 400)
    PREFILL_BUSY = "prefill_busy"           # ... while other requests' KV holds memory (a 503)
    MODEL_QUEUE_FULL = "model_queue_full"   # the model runs its OMLX_MAX_CONCURRENT and its queue is full


class PrefillVerdict(StrEnum):
    """Whether a prompt's KV cache fits under the hard line (policy.pressure.prefill_verdict)."""
    FITS = "fits"
    BUSY = "busy"               # not while the running requests hold their KV
    TOO_LARGE = "too_large"     # not even with nothing else running


class SlotDecision(StrEnum):
    """What a request arriving at a model does with its concurrency slots (policy.concurrency)."""
    RUN = "run"
    QUEUE = "queue"
    REFUSE = "refuse"
    OVER_SHARE = "over_share"   # refused: the request's key holds its share of the queue (OMLX_KEY_SHARE)


class Change(StrEnum):
    """What changed in the pool; listeners (metrics, the enforcer, the broadcaster) get one."""
    DISCOVERY = "discovery"
    SETTINGS = "settings"
    REQUEST_START = "request_start"
    REQUEST_END = "request_end"
    QUEUE = "queue"                # a request queued for, took or gave back a model's slot
    LOAD_START = "load_start"
    LOAD_END = "load_end"
    UNLOAD_START = "unload_start"
    UNLOAD = "unload"
    KV_GROWTH = "kv_growth"        # a model's running requests' KV grew by a step (engines.generator)
    EVENT = "event"
    TICK = "tick"


class Phase(StrEnum):
    """Where a request is on its way (its trace's `phase`, pool/traces)."""
    QUEUED = "queued"              # at the gate (memory pressure) or waiting for a concurrency slot
    LOADING = "loading"            # waiting for its model's load
    PREFILLING = "prefilling"      # its prompt is being read
    DECODING = "decoding"          # tokens are coming
    DONE = "done"


RESIDENT_STATES = (ModelState.LOADED, ModelState.LOADING)

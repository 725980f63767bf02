"""Pure: what a request arriving at a model does with the model's concurrency slots, and which
waiter a freed slot goes to. `share` is the fraction of a model's slots and queue places one API key
may hold while others want them (OMLX_KEY_SHARE; 1 = no share)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .vocabulary import SlotDecision


def share_cap(places: int, share: float) -> int:
    """How many of `places` one key may hold while others want them (always at least one)."""
    return max(1, math.floor(places * share))


def slot_decision(*, running: int, queued: int, limit: int, queue_limit: int, key_queued: int = 0,
                  share: float = 1.0, keyed: bool = False) -> SlotDecision:
    """Run while a slot is free and nobody waits (a newcomer never overtakes the queue), else wait
    in the queue while it has room and the request's key has not filled its share of it (a key
    that fills the queue would turn every other key away), else be refused. `limit` 0 means no
    limit. Requests without a key (an open server) are one party: the queue is theirs."""
    if not limit or (running < limit and not queued):
        return SlotDecision.RUN
    if queued >= queue_limit:
        return SlotDecision.REFUSE
    if keyed and share < 1 and key_queued >= share_cap(queue_limit, share):
        return SlotDecision.OVER_SHARE
    return SlotDecision.QUEUE


def next_waiter(waiting: Sequence[str | None], running: Mapping[str | None, int], *, limit: int,
                share: float) -> int:
    """The index in `waiting` (the queue's keys, first come first) of the request a freed slot goes
    to: the first whose key runs fewer than its share of the slots, so a key that took every slot
    while the model was idle gives them up as others arrive; the first in line when every waiting
    key runs its share (no slot is left idle)."""
    if share >= 1 or not limit:
        return 0
    cap = share_cap(limit, share)
    return next((i for i, key in enumerate(waiting) if running.get(key, 0) < cap), 0)

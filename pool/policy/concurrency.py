"""Pure: what a request arriving at a model does with the model's concurrency slots."""

from __future__ import annotations

from .vocabulary import SlotDecision


def slot_decision(*, running: int, queued: int, limit: int, queue_limit: int) -> SlotDecision:
    """Run while a slot is free and nobody waits (a newcomer never overtakes the queue), else wait
    in the queue while it has room, else be refused. `limit` 0 means no limit."""
    if not limit or (running < limit and not queued):
        return SlotDecision.RUN
    if queued < queue_limit:
        return SlotDecision.QUEUE
    return SlotDecision.REFUSE

"""The slot decision as a table: run, queue or refuse."""

import pytest

from pool.policy.concurrency import slot_decision
from pool.policy.vocabulary import SlotDecision

RUN, QUEUE, REFUSE = SlotDecision.RUN, SlotDecision.QUEUE, SlotDecision.REFUSE


@pytest.mark.parametrize("running, queued, limit, queue_limit, expected", [
    (0, 0, 2, 4, RUN),          # a free slot
    (1, 0, 2, 4, RUN),
    (2, 0, 2, 4, QUEUE),        # at the limit: wait
    (2, 3, 2, 4, QUEUE),        # the queue has one more place
    (2, 4, 2, 4, REFUSE),       # the queue is full
    (1, 1, 2, 4, QUEUE),        # a slot is free but someone waits: no overtaking
    (2, 0, 2, 0, REFUSE),       # no queue: refused at once
    (50, 9, 0, 0, RUN),         # limit 0 = no limit
])
def test_slot_decision(running, queued, limit, queue_limit, expected):
    assert slot_decision(running=running, queued=queued, limit=limit, queue_limit=queue_limit) == expected

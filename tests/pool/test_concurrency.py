"""Per-model concurrency through the serving door, over fake engines: the limit, the FIFO queue,
the 503 when it is full, slots that always come back (cancel, error, close), and each API key's
share of a model's slots and queue."""

from __future__ import annotations

import asyncio

import pytest

from pool.errors import Busy, InvalidRequest, ModelQueueFull
from pool.observe.metrics import Metrics
from pool.policy.concurrency import next_waiter, slot_decision
from pool.policy.vocabulary import SlotDecision
from pool.serving.completion import CompletionSpec
from pool.serving.slots import ModelSlots
from tests.fakes import Core, Spec, model_folders

MB = 10**6
LONG = Spec(tokens=10_000, token_seconds=0.01)    # a request that runs until it is closed


@pytest.fixture
def models(tmp_path):
    return model_folders(tmp_path / "models", a=100 * MB, b=100 * MB)


def core_with(models, *, limit: int, queue: int) -> Core:
    return Core(models, specs={"a": LONG, "b": LONG}, max_concurrent=limit, queue_per_model=queue)


def open_(core: Core, model: str = "a", **spec):
    return core.router.generate(CompletionSpec(model=model, prompt="a b c", **spec))


async def close_when_open(task) -> None:
    """Close a queued request once it has its slot (within a bound: a broken queue fails, not hangs)."""
    await (await asyncio.wait_for(task, 2)).aclose()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_limit_holds_and_the_next_request_waits_for_a_slot(models):
    core = core_with(models, limit=2, queue=4)
    first, second = await open_(core), await open_(core)
    third = asyncio.ensure_future(open_(core))
    await asyncio.sleep(0.05)
    assert not third.done()
    assert core.host.door.slots.counts("a") == (2, 1)
    assert core.host.door.slots.counts("b") == (0, 0)       # per model: b is not limited by a
    async with await open_(core, "b"):
        pass
    await first.aclose()
    opened = await asyncio.wait_for(third, 1)
    assert core.host.door.slots.counts("a") == (2, 0)
    chunks = [c async for c in _take(opened, 2)]
    assert len(chunks) == 2
    for completion in (second, opened):
        await completion.aclose()
    assert core.host.door.slots.counts("a") == (0, 0) and core.pool.entries["a"].leases == 0


async def _take(completion, n):
    async for chunk in completion.chunks():
        yield chunk
        n -= 1
        if not n:
            return


async def test_waiters_get_their_slots_first_come_first_served(models):
    core = core_with(models, limit=1, queue=8)
    running = await open_(core)
    order: list[int] = []

    async def request(i):
        completion = await open_(core)
        order.append(i)
        return completion

    waiters = []
    for i in range(4):
        waiters.append(asyncio.ensure_future(request(i)))
        await settle()
    assert core.host.door.slots.counts("a") == (1, 4)
    await asyncio.sleep(0.05)
    assert order == []
    await running.aclose()
    for i in range(4):
        completion = await asyncio.wait_for(waiters[i], 1)
        await settle()
        assert order == list(range(i + 1))              # the next one waits for this one's slot
        await completion.aclose()
    assert core.host.door.slots.counts("a") == (0, 0)


async def test_a_full_queue_is_a_503_with_retry_after_at_once(models):
    core = core_with(models, limit=1, queue=1)
    rejected, starts = [], []
    core.gate.on_reject = rejected.append
    running = await open_(core)
    queued = asyncio.ensure_future(open_(core))
    await settle()
    core.pool.events.subscribe(lambda change: starts.append(change) if change.kind == "request_start" else None)
    with pytest.raises(ModelQueueFull) as refused:
        await asyncio.wait_for(open_(core), 0.5)       # at once, not after a wait
    error = refused.value
    assert isinstance(error, Busy)
    assert error.code == "model_queue_full" and error.retry_after == 2
    assert error.facts == {"running": 1, "queued": 1} and "'a'" in error.message
    assert rejected == ["model_queue_full"]
    assert starts == [] and core.pool.entries["a"].leases == 2     # the refused request took no lease
    await running.aclose()
    await close_when_open(queued)


async def test_no_queue_refuses_as_soon_as_the_slots_are_taken(models):
    core = core_with(models, limit=1, queue=0)
    async with await open_(core):
        with pytest.raises(ModelQueueFull):
            await open_(core)
    async with await open_(core):                      # the slot came back
        pass


async def test_a_request_cancelled_while_queued_leaves_the_queue(models):
    core = core_with(models, limit=1, queue=1)
    running = await open_(core)
    queued = asyncio.ensure_future(open_(core))
    await settle()
    assert core.host.door.slots.counts("a") == (1, 1)
    queued.cancel()                                     # what a client disconnect does to its view
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert core.host.door.slots.counts("a") == (1, 0) and core.pool.entries["a"].leases == 1
    another = asyncio.ensure_future(open_(core))        # its place is free again: no 503
    await settle()
    await running.aclose()
    await close_when_open(another)
    assert core.host.door.slots.counts("a") == (0, 0) and core.pool.entries["a"].leases == 0


async def test_a_slot_handed_to_a_cancelled_waiter_passes_on():
    slots = ModelSlots(limit=1, queue_limit=2)
    await slots.acquire("a")
    first = asyncio.ensure_future(slots.acquire("a"))
    await settle()
    second = asyncio.ensure_future(slots.acquire("a"))
    await settle()
    assert slots.counts("a") == (1, 2)
    slots.release("a")          # the slot reaches `first`, and before `first` runs again...
    first.cancel()              # ...its client goes away
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)                   # the slot went on to the next waiter
    assert slots.counts("a") == (1, 0)
    slots.release("a")
    assert slots.counts("a") == (0, 0)


async def test_slots_come_back_after_an_error_an_abort_and_a_refusal_after_the_slot(models):
    core = core_with(models, limit=1, queue=1)
    # refused after taking its slot (a bad KV field): the door gives the slot back
    with pytest.raises(InvalidRequest):
        await open_(core, kv={"kv_bits": 3})
    assert core.host.door.slots.counts("a") == (0, 0)
    # the engine aborts a running request: closing the completion gives the slot to the waiter
    running = await open_(core)
    queued = asyncio.ensure_future(open_(core))
    await settle()
    with pytest.raises(Busy):
        async with running:
            async for _ in running.chunks():
                core.engines.engines["a"].abort_all("memory pressure", "memory_pressure")
    successor = await asyncio.wait_for(queued, 1)
    assert core.host.door.slots.counts("a") == (1, 0)
    await successor.aclose()
    assert core.host.door.slots.counts("a") == (0, 0) and core.pool.entries["a"].leases == 0


async def test_a_queued_request_of_a_model_force_unloaded_meanwhile_is_a_503(models):
    core = core_with(models, limit=1, queue=1)
    running = await open_(core)
    queued = asyncio.ensure_future(open_(core))
    await settle()
    await core.pool.unload("a", force=True)
    await running.aclose()
    with pytest.raises(Busy) as aborted:
        await asyncio.wait_for(queued, 1)
    assert aborted.value.code == "model_unloaded"
    assert core.host.door.slots.counts("a") == (0, 0) and core.pool.entries["a"].leases == 0


async def test_the_snapshot_and_metrics_show_running_and_queued(models):
    core = core_with(models, limit=1, queue=2)
    running = await open_(core)
    queued = [asyncio.ensure_future(open_(core)) for _ in range(2)]
    await settle()
    snapshot = core.host.state()
    rows = {m["id"]: m for m in snapshot["models"]}
    assert (rows["a"]["running"], rows["a"]["queued"], rows["a"]["active_requests"]) == (1, 2, 3)
    assert (rows["b"]["running"], rows["b"]["queued"]) == (0, 0)
    assert snapshot["max_concurrent"] == 1 and snapshot["queue_per_model"] == 2
    metrics = Metrics(snapshot=core.host.state)
    metrics.watch(core.pool)
    text = metrics.render().decode()
    assert 'running_requests{model="a"} 1.0' in text and 'queued_requests{model="a"} 2.0' in text
    assert 'queued_requests{model="b"} 0.0' in text
    await running.aclose()
    for task in asyncio.as_completed(queued, timeout=2):
        await (await task).aclose()
    rows = {m["id"]: m for m in core.host.state()["models"]}
    assert (rows["a"]["running"], rows["a"]["queued"]) == (0, 0)


async def test_queue_changes_reach_the_listeners(models):
    core = core_with(models, limit=1, queue=1)
    seen = []
    core.pool.events.subscribe(lambda change: seen.append((str(change.kind), change.model)))
    running = await open_(core)
    queued = asyncio.ensure_future(open_(core))
    await settle()
    await running.aclose()
    await close_when_open(queued)
    assert seen.count(("queue", "a")) == 4     # took, queued, handed over, gave back


# ---- a key's share (OMLX_KEY_SHARE) ------------------------------------------------------------------

@pytest.mark.parametrize("running, queued, key_queued, keyed, share, expected", [
    (3, 0, 0, True, 0.5, SlotDecision.RUN),          # a free slot and nobody waiting: any key runs
    (4, 0, 0, True, 0.5, SlotDecision.QUEUE),
    (4, 3, 3, True, 0.5, SlotDecision.QUEUE),        # 3 of 8 places: under half
    (4, 4, 4, True, 0.5, SlotDecision.OVER_SHARE),   # half the queue is this key's
    (4, 4, 0, True, 0.5, SlotDecision.QUEUE),        # ... another key still gets in
    (4, 4, 4, False, 0.5, SlotDecision.QUEUE),       # no keys: one party, the whole queue
    (4, 7, 7, True, 1.0, SlotDecision.QUEUE),        # share 1: no share
    (4, 8, 0, True, 0.5, SlotDecision.REFUSE),       # the queue is full for everyone
    (4, 1, 1, True, 0.01, SlotDecision.OVER_SHARE),  # a tiny share is still one place
])
def test_slot_decision_with_a_share(running, queued, key_queued, keyed, share, expected):
    assert slot_decision(running=running, queued=queued, limit=4, queue_limit=8, key_queued=key_queued,
                         share=share, keyed=keyed) == expected


@pytest.mark.parametrize("waiting, running, share, expected", [
    (["a", "b"], {"a": 4}, 0.5, 1),              # a runs every slot: b's request goes first
    (["a", "b"], {"a": 2, "b": 2}, 0.5, 0),      # both at their share: first come first served
    (["a", "b"], {"a": 1, "b": 3}, 0.5, 0),
    (["b", "a"], {"a": 1, "b": 3}, 0.5, 1),      # b over its share, a under it
    (["a", "a"], {"a": 4}, 0.5, 0),              # only a waits: it keeps every slot
    ([None, None], {None: 4}, 0.5, 0),
    (["a", "b"], {"a": 4}, 1.0, 0),              # share 1: first come first served
])
def test_a_freed_slot_goes_to_the_first_key_under_its_share(waiting, running, share, expected):
    assert next_waiter(waiting, running, limit=4, share=share) == expected


async def test_a_key_that_took_every_slot_gives_them_up_as_another_key_waits():
    slots = ModelSlots(limit=2, queue_limit=4, share=0.5)
    for _ in range(2):
        await slots.acquire("m", "flood")
    flood_waiters = [asyncio.ensure_future(slots.acquire("m", "flood")) for _ in range(2)]
    await settle()
    with pytest.raises(ModelQueueFull) as refused:            # two of four places: its share
        await slots.acquire("m", "flood")
    assert "its share of the queue (OMLX_KEY_SHARE)" in str(refused.value)
    other = asyncio.ensure_future(slots.acquire("m", "other"))   # queued last, yet served first
    await settle()
    assert slots.counts("m") == (2, 3)
    slots.release("m", "flood")
    await asyncio.wait_for(other, 1)
    assert not any(w.done() for w in flood_waiters)
    slots.release("m", "other")                                # nobody else waits: flood's turn
    await asyncio.wait_for(flood_waiters[0], 1)
    slots.release("m", "flood")
    await asyncio.wait_for(flood_waiters[1], 1)
    for _ in range(2):
        slots.release("m", "flood")
    assert slots.counts("m") == (0, 0)


async def test_without_keys_the_queue_is_first_come_first_served():
    slots = ModelSlots(limit=1, queue_limit=4, share=0.5)
    await slots.acquire("m")
    waiters = [asyncio.ensure_future(slots.acquire("m")) for _ in range(4)]   # all four places
    await settle()
    assert slots.counts("m") == (1, 4)
    for waiter in waiters:
        slots.release("m")
        await asyncio.wait_for(waiter, 1)
        assert all(not w.done() for w in waiters[waiters.index(waiter) + 1:])
    slots.release("m")
    assert slots.counts("m") == (0, 0)

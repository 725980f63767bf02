"""Requests that arrive together enter the batch together (pool/engines/admission.py): the engine
waits for requests whose prompts were encoded and not yet posted, and a request alone waits for
nothing. Counted by the engine, never timed."""

from __future__ import annotations

import asyncio

from pool.engines import admission
from pool.engines.admission import Arrivals
from pool.engines.generator import TextEngine
from pool.engines.protocol import SamplingParams
from tests.conftest import as_the_pool_loads


def test_a_step_waits_only_while_announced_requests_are_on_their_way(monkeypatch):
    monkeypatch.setattr(admission, "ADMIT_WAIT", 60.0)
    arrivals = Arrivals()
    assert arrivals.wait() == 0                    # nothing new: nothing to wait for
    for _ in range(3):
        arrivals.expect()
    arrivals.arrived()
    arrivals.inserted()
    assert arrivals.wait() > 0                     # two more are on their way
    arrivals.arrived()
    arrivals.inserted()
    arrivals.arrived()
    arrivals.inserted()
    assert arrivals.wait() == 0
    arrivals.stepped()
    assert arrivals.admissions == 1 and arrivals.waits == 1

    arrivals.expect()                              # a request alone
    arrivals.arrived()
    arrivals.inserted()
    assert arrivals.wait() == 0
    arrivals.stepped()
    assert arrivals.admissions == 2 and arrivals.waits == 1


def test_an_announcement_never_posted_is_not_waited_for(monkeypatch):
    monkeypatch.setattr(admission, "ADMIT_WAIT", 60.0)
    monkeypatch.setattr(admission, "ANNOUNCED_FOR", 0.0)
    arrivals = Arrivals()
    arrivals.expect()                              # a prompt only counted, or refused after encoding
    arrivals.inserted()
    assert arrivals.wait() == 0


async def test_requests_encoded_together_start_in_one_step(demo_model_dir, monkeypatch):
    monkeypatch.setattr(admission, "ADMIT_WAIT", 60.0)   # no clock decides it: each arrival ends the wait
    engine = TextEngine("demo", demo_model_dir, load=as_the_pool_loads(demo_model_dir))
    await engine.load()
    try:
        await _together_then_alone(engine)
    finally:
        await engine.stop()


async def _together_then_alone(engine: TextEngine) -> None:
    prompts = [engine.encode_chat([{"role": "user", "content": f"Request {i}. Name a colour."}]) for i in range(4)]
    params = SamplingParams(max_tokens=4)

    async def run(tokens):
        return "".join([c.text async for c in engine.generate(tokens, params)])

    before = engine.arrivals.admissions
    tasks = []
    for tokens in prompts:            # posted one by one, the engine thread free to step in between
        tasks.append(asyncio.ensure_future(run(tokens)))
        await asyncio.sleep(0.01)
    texts = await asyncio.gather(*tasks)
    assert all(texts) and engine.arrivals.admissions == before + 1

    waits = engine.arrivals.waits
    await run(engine.encode_chat([{"role": "user", "content": "Alone."}]))
    assert engine.arrivals.admissions == before + 2 and engine.arrivals.waits == waits

"""A loading model's progress in the snapshot, and this host's measured load rate, over fake engines
(the engine thread's side, fill_weights counting bytes, is tested with a real model below)."""

from __future__ import annotations

import asyncio

import pytest

from pool.engines.loading import LoadProgress
from pool.errors import LoadAborted
from pool.policy.load_progress import DEFAULT_BYTES_PER_SECOND
from tests.fakes import Core, Spec, model_folders

MB = 10**6


@pytest.fixture
def models(tmp_path):
    return model_folders(tmp_path / "models", a=100 * MB, b=200 * MB)


def _row(core, model_id: str) -> dict:
    return next(m for m in core.host.state()["models"] if m["id"] == model_id)


async def test_a_loading_model_reports_bytes_read_of_total_and_the_time_left(models):
    core = Core(models, specs={"a": Spec(load_seconds=30)})
    loading = asyncio.ensure_future(core.pool.load("a"))
    while core.states()["a"] != "loading":
        await asyncio.sleep(0)
    # before its weights begin to fill: the folder's size, nothing read, at the default rate
    assert _row(core, "a")["load_progress"] == {"bytes_done": 0, "bytes_total": 100 * MB,
                                                "eta_seconds": round(100 * MB / DEFAULT_BYTES_PER_SECOND, 1)}
    engine = core.engines.engines["a"]
    engine.load_progress = LoadProgress()
    engine.load_progress.begin(120 * MB)       # the weights' own bytes, once they are opened
    engine.load_progress.advance(30 * MB)
    progress = _row(core, "a")["load_progress"]
    assert progress["bytes_done"] == 30 * MB and progress["bytes_total"] == 120 * MB
    assert progress["eta_seconds"] == round(90 * MB / DEFAULT_BYTES_PER_SECOND, 1)
    assert _row(core, "b")["load_progress"] is None
    engine.abort_load = True
    with pytest.raises(LoadAborted):
        await loading
    assert _row(core, "a")["load_progress"] is None


async def test_the_rate_comes_from_this_hosts_past_loads(models):
    core = Core(models, specs={"a": Spec(load_seconds=0.01), "b": Spec(load_seconds=30)})
    await core.pool.load("a")                  # a fake's whole load: 100 MB in 0.01 s
    rate = core.pool.load_rate.bytes_per_second()
    assert rate == pytest.approx(100 * MB / 0.01)
    loading = asyncio.ensure_future(core.pool.load("b"))
    while core.states()["b"] != "loading":
        await asyncio.sleep(0)
    assert _row(core, "b")["load_progress"]["eta_seconds"] == round(200 * MB / rate, 1)
    core.engines.engines["b"].abort_load = True
    await asyncio.gather(loading, return_exceptions=True)


def test_fill_weights_counts_the_bytes_it_makes_resident(demo_model_dir):
    from pool.engines.loading import fill_weights, open_model

    model, _, _ = open_model(demo_model_dir)
    seen: list[int] = []

    class Watching(LoadProgress):
        def advance(self, nbytes: int) -> None:
            super().advance(nbytes)
            seen.append(self.bytes_done)

    progress = Watching()
    total = fill_weights(model, 8 * MB, progress)
    assert progress.bytes_total == total == progress.bytes_done
    assert len(seen) > 2 and seen == sorted(seen), seen        # group by group, never backwards
    assert progress.seconds is not None and progress.seconds > 0


async def test_a_refusal_that_ends_a_wait_on_a_loading_model_says_how_far_it_got(models, monkeypatch):
    from types import SimpleNamespace

    from pool.api import load_wait
    from pool.errors import Busy

    core = Core(models, specs={"a": Spec(load_seconds=30)})
    monkeypatch.setattr(load_wait, "get_runtime", lambda: SimpleNamespace(router=core.router))
    loading = asyncio.ensure_future(core.pool.load("a"))
    while core.states()["a"] != "loading":
        await asyncio.sleep(0)
    engine = core.engines.engines["a"]
    engine.load_progress = LoadProgress()
    engine.load_progress.begin(100 * MB)
    engine.load_progress.advance(45 * MB)

    async def refused():
        raise Busy("The server is shutting down; retry in a moment.", code="server_shutting_down")

    with pytest.raises(Busy) as e:
        await load_wait.opening(refused(), "a")
    assert e.value.message == ("The server is shutting down; retry in a moment. (loading a 45% (45.0 MB of 100.0 MB), "
                               "~1 s left when the wait ended)")
    with pytest.raises(Busy) as e:                 # a model that is not loading: the message as it was
        await load_wait.opening(refused(), "b")
    assert e.value.message == "The server is shutting down; retry in a moment."
    engine.abort_load = True
    await asyncio.gather(loading, return_exceptions=True)

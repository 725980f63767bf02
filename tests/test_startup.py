"""omlx_site/startup.py: the first http or websocket scope starts the runtime, once per runtime, and
a start that fails is kept (the routes answer 503 naming it), not raised into the server."""

import asyncio

import pytest

from omlx_site import startup


class FakeRuntime:
    """pool.runtime.Runtime's start: idempotent under a lock; a failure is kept, not raised."""

    def __init__(self, *, fails: bool = False):
        self.started, self.fails, self.starts = False, fails, 0
        self._lock = asyncio.Lock()

    async def start(self):
        async with self._lock:
            if self.started:
                return
            self.starts += 1
            await asyncio.sleep(0.01)
            self.started = not self.fails


async def app(scope, receive, send):
    app.seen.append(scope["type"])


@pytest.fixture
def runtime(monkeypatch):
    holder = {"runtime": FakeRuntime()}
    monkeypatch.setattr(startup, "get_runtime", lambda: holder["runtime"])
    app.seen = []
    return holder


async def test_the_first_scopes_start_the_runtime_once(runtime):
    wrapped = startup.StartOnFirstScope(app)
    await wrapped({"type": "lifespan"}, None, None)
    assert runtime["runtime"].starts == 0                         # not a request
    await asyncio.gather(*(wrapped({"type": kind}, None, None) for kind in ("http", "websocket", "http")))
    await wrapped({"type": "http"}, None, None)
    assert runtime["runtime"].started and app.seen == ["lifespan", "http", "websocket", "http", "http"]
    assert runtime["runtime"].starts == 1
    runtime["runtime"] = FakeRuntime()                           # a new runtime (tests make them) starts too
    await wrapped({"type": "http"}, None, None)
    assert runtime["runtime"].started


async def test_a_failed_start_still_serves_the_request(runtime):
    runtime["runtime"] = FakeRuntime(fails=True)
    wrapped = startup.StartOnFirstScope(app)
    await wrapped({"type": "http"}, None, None)
    assert app.seen == ["http"] and not runtime["runtime"].started

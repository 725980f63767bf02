"""Start the runtime on the first request (datasette's AsgiRunOnFirstRequest): Daphne has no
lifespan protocol, and AppConfig.ready() also runs for `migrate`. `serve` starts it earlier, when
the server is ready; this covers every other ASGI server and the in-process tests."""

from __future__ import annotations

from pool.runtime import get_runtime


class StartOnFirstScope:
    """Wraps the application: the first http or websocket scope awaits the runtime's start. The
    start is idempotent and keeps a failure instead of raising (the routes answer 503 naming it),
    so scopes arriving meanwhile wait on the same start, and a failed one is tried again later."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            runtime = get_runtime()   # tests replace the runtime: each new one is started once
            if not runtime.started:
                await runtime.start()
        return await self.app(scope, receive, send)

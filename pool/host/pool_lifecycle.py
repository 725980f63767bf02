"""The engine pool's start and stop: pinned models loaded at start, requests ended, every engine
stopped at shutdown (adapters before their bases), and its background tasks kept referenced."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..policy.vocabulary import ModelState as State

log = logging.getLogger(__name__)


class PoolLifecycle:
    entries: dict[str, Any]
    _tasks: set[asyncio.Task]

    async def load(self, model_id: str) -> Any:
        raise NotImplementedError

    async def preload_pinned(self) -> None:
        for entry in list(self.entries.values()):
            if entry.pinned and entry.state == State.UNLOADED:
                self._spawn(self._quiet(self.load(entry.id)))

    def end_requests(self, message: str, code: str) -> None:
        """Every running request ends with this error; the models stay loaded."""
        for entry in self.entries.values():
            if entry.engine is not None:
                entry.engine.abort_all(message, code)

    async def shutdown(self) -> None:
        await asyncio.gather(*(e.load_future for e in self.entries.values()
                               if e.state == State.LOADING and e.load_future), return_exceptions=True)
        for entry in sorted(self.entries.values(), key=lambda e: e.base is None):   # adapters first
            if entry.engine is not None:
                await entry.engine.stop("the server is shutting down")
                entry.engine, entry.state = None, State.UNLOADED

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _quiet(coro) -> None:
        try:
            await coro
        except Exception as e:  # noqa: BLE001 - a pinned model that cannot load is shown as failed
            log.warning("background load failed: %s", e)

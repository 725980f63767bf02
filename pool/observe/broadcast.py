"""Publish the whole snapshot to the channel layer group "pool": on every enforcer tick and on pool
changes, at most 10 times a second. Whole snapshots, never deltas: the in-memory layer drops
messages when a channel is full, and the next snapshot repairs any loss."""

from __future__ import annotations

import asyncio
import logging
import time

from ..strict_json import dumps_finite

log = logging.getLogger(__name__)

GROUP = "pool"
MIN_INTERVAL = 0.1


class Broadcaster:
    def __init__(self, runtime):
        self.runtime = runtime
        self._pending: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._task: asyncio.Task | None = None

    def schedule(self) -> None:
        """Publish soon: at once if the last one was over 100 ms ago, else when that is true."""
        if self._pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(0.0, self._last + MIN_INTERVAL - time.monotonic())
        self._pending = loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._pending = None
        self._last = time.monotonic()
        self._task = asyncio.ensure_future(self.publish_now())

    async def publish_now(self, snapshot: dict | None = None) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None or not _has_listeners(layer):
            return
        try:
            snapshot = snapshot or self.runtime.snapshot()
            snapshot["sent_at"] = time.time()
            # encoded once here: the in-memory layer deep-copies each message for every dashboard
            await layer.group_send(GROUP, {"type": "pool.snapshot", "text": dumps_finite(snapshot)})
        except Exception:
            log.exception("could not publish the snapshot")

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


def _has_listeners(layer) -> bool:
    """Whether a dashboard is connected. The in-memory layer says so; building a snapshot nobody
    reads costs the event loop a memory probe ten times a second while requests stream."""
    groups = getattr(layer, "groups", None)
    return groups is None or bool(groups.get(GROUP))

"""Publish the whole snapshot to this host's channel layer group (`pool_group`): on every enforcer tick
and on pool changes, at most 10 times a second. A fleet's hosts share one Redis layer, so each host's
group has its name in it. Whole snapshots, never deltas: the in-memory layer drops
messages when a channel is full, and the next snapshot repairs any loss."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import re
import time

from ..strict_json import dumps_finite

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.1
REQUESTS_INTERVAL = 0.5     # the requests message: at most this often, while any request runs


def pool_group(host_id: str) -> str:
    """A Channels group name (ASCII letters, digits, `-_.`, under 100 characters) unique to the host."""
    digest = hashlib.blake2b(host_id.encode(), digest_size=4).hexdigest()
    return f"pool.{re.sub(r'[^A-Za-z0-9_.-]', '_', host_id)[:60]}.{digest}"


class Broadcaster:
    def __init__(self, runtime):
        self.runtime = runtime
        self.group = pool_group(runtime.settings.host_id)
        self._pending: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._task: asyncio.Task | None = None
        self._requests: asyncio.Task | None = None
        self._requests_dirty = False

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
        if layer is None or not _has_listeners(layer, self.group):
            return
        try:
            snapshot = snapshot or self.runtime.snapshot()
            snapshot["sent_at"] = time.time()
            # encoded once here: the in-memory layer deep-copies each message for every dashboard
            await layer.group_send(self.group, {"type": "pool.snapshot", "text": dumps_finite(snapshot)})
        except Exception:
            log.exception("could not publish the snapshot")

    def requests_changed(self) -> None:
        """A request began, ended or was cancelled: the requests message (pool/traces) goes out soon,
        then every REQUESTS_INTERVAL while any request runs (their phases move), whole each time."""
        self._requests_dirty = True
        if self._requests is not None and not self._requests.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._requests = loop.create_task(self._send_requests(), context=contextvars.Context())

    async def _send_requests(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        traces = self.runtime.traces
        while self._requests_dirty or traces.busy:
            self._requests_dirty = False
            if layer is not None and _has_listeners(layer, self.group):
                try:
                    text = dumps_finite(traces.message())
                    await layer.group_send(self.group, {"type": "pool.requests", "text": text})
                except Exception:
                    log.exception("could not publish the requests")
            await asyncio.sleep(REQUESTS_INTERVAL)

    def close(self) -> None:
        if self._requests is not None:
            self._requests.cancel()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


def _has_listeners(layer, group: str) -> bool:
    """Whether a dashboard is connected. The in-memory layer says so; building a snapshot nobody
    reads costs the event loop a memory probe ten times a second while requests stream."""
    groups = getattr(layer, "groups", None)
    return groups is None or bool(groups.get(group))

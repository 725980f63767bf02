"""The live fleet in Redis: each host's last published record under its own key, which expires when the
host stops refreshing it (OMLX_FLEET_TTL), and the same record sent to every host's dashboards over the
Channels layer (group "fleet"). Reading the fleet is one SCAN and one MGET."""

from __future__ import annotations

import json
import logging
from typing import Any

from redis import asyncio as aioredis

from ..strict_json import dumps_finite

log = logging.getLogger(__name__)

KEY_PREFIX = "omlx:fleet:host:"
GROUP = "fleet"


class Registry:
    def __init__(self, url: str, ttl: float):
        self.redis = aioredis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.ttl_ms = max(100, int(ttl * 1000))

    async def publish(self, host_id: str, record: dict[str, Any]) -> None:
        text = dumps_finite(record)
        await self.redis.set(KEY_PREFIX + host_id, text, px=self.ttl_ms)
        await _to_dashboards(text)

    async def leave(self, host_id: str) -> None:
        await self.redis.delete(KEY_PREFIX + host_id)

    async def hosts(self) -> list[dict[str, Any]]:
        keys = [key async for key in self.redis.scan_iter(match=KEY_PREFIX + "*", count=1000)]
        if not keys:
            return []
        records = []
        for raw in await self.redis.mget(keys):
            if raw is None:       # expired between the SCAN and the MGET
                continue
            try:
                records.append(json.loads(raw))
            except ValueError:
                log.warning("a fleet record that is not JSON was skipped")
        return sorted(records, key=lambda r: r.get("host", ""))

    async def close(self) -> None:
        await self.redis.aclose()


async def _to_dashboards(text: str) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(GROUP, {"type": "fleet.host", "text": text})

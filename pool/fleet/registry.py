"""The live fleet in Redis: each host's last published record under its own key, which expires when the
host stops refreshing it (OMLX_FLEET_TTL), and the same record sent to every host's dashboards over the
Channels layer (group "fleet"). Reading the fleet is one SCAN and one MGET. Records are signed with the
fleet key (seal.py): one that is unsigned or badly signed is ignored, and logged once per key."""

from __future__ import annotations

import logging
from typing import Any

from redis import asyncio as aioredis

from ..strict_json import dumps_finite
from .seal import Refused, seal, unseal

log = logging.getLogger(__name__)

KEY_PREFIX = "omlx:fleet:host:"
GROUP = "fleet"


class Registry:
    def __init__(self, url: str, ttl: float, key: str):
        self.redis = aioredis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.ttl_ms = max(100, int(ttl * 1000))
        self.key = key.encode()
        self._refused: set[str] = set()     # the keys whose records were ignored (and said so)

    async def publish(self, host_id: str, record: dict[str, Any]) -> None:
        text = dumps_finite(record)
        await self.redis.set(KEY_PREFIX + host_id, seal(text, key=self.key, host_id=host_id), px=self.ttl_ms)
        await _to_dashboards(text)

    async def leave(self, host_id: str) -> None:
        await self.redis.delete(KEY_PREFIX + host_id)

    async def hosts(self) -> list[dict[str, Any]]:
        keys = [key async for key in self.redis.scan_iter(match=KEY_PREFIX + "*", count=1000)]
        if not keys:
            return []
        records = []
        for key, raw in zip(keys, await self.redis.mget(keys)):
            if raw is None:       # expired between the SCAN and the MGET
                continue
            name = key.decode(errors="replace")
            try:
                records.append(unseal(raw, key=self.key, host_id=name.removeprefix(KEY_PREFIX)))
                self._refused.discard(name)
            except Refused as e:
                if name not in self._refused:
                    log.warning("the fleet record under %s is ignored: %s; no request goes there", name, e)
                self._refused.add(name)
        return sorted(records, key=lambda r: r.get("host", ""))

    async def close(self) -> None:
        await self.redis.aclose()


async def _to_dashboards(text: str) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(GROUP, {"type": "fleet.host", "text": text})

"""A read that spans the fleet: the same GET sent to every other live host, each answering for itself
(the hop's headers tell it not to ask further), the answers that came back within a bound. A host
that is slow or gone is left out: a listing never waits on, or fails for, one host."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from .proxy import FLEET_KEY, FORWARDED, client

log = logging.getLogger(__name__)

GATHER_SECONDS = 3.0


async def _one(record: dict, path: str, *, origin: str, fleet_key: str) -> tuple[str, Any] | None:
    try:
        response = await client().get(record["url"] + path, headers={FORWARDED: origin, FLEET_KEY: fleet_key},
                                      timeout=GATHER_SECONDS)
        if response.status_code == 200:
            return record["host"], response.json()
        log.warning("fleet read of %s from %s: status %s", path, record["host"], response.status_code)
    except (httpx.HTTPError, ValueError) as e:
        log.warning("fleet read of %s from %s failed: %s", path, record["host"], e)
    return None


async def gather_json(member, path: str) -> list[tuple[str, Any]]:
    """(host, JSON body) from every other live host that answered `GET path` with a 200 in time."""
    others = [r for r in await member.records() if r["host"] != member.host_id and r.get("url")]
    answers = await asyncio.gather(*(_one(r, path, origin=member.host_id, fleet_key=member.key) for r in others))
    return [answer for answer in answers if answer is not None]

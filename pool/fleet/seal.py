"""Fleet records signed with the fleet key (HMAC-SHA256): what a host publishes to Redis is sealed,
and what it reads there is opened, and believed, only with a good signature for the key's own host.
Anything that can write to Redis (any local process, when Redis has no password) could otherwise
add a "host" and receive prompts and, on every hop to it, the fleet key. Pure: no Redis, no clock."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

DOMAIN = b"omlx-fleet-record\n"     # a signature made for anything else is never a record's


class Refused(ValueError):
    """A stored record that is not believed; the message says why (for the log)."""


def _signature(key: bytes, host_id: str, text: str) -> str:
    return hmac.new(key, DOMAIN + host_id.encode() + b"\n" + text.encode(), hashlib.sha256).hexdigest()


def seal(text: str, *, key: bytes, host_id: str) -> str:
    """The record's JSON text as stored: the text itself and its signature."""
    return json.dumps({"record": text, "hmac": _signature(key, host_id, text)})


def unseal(raw: bytes | str, *, key: bytes, host_id: str) -> dict[str, Any]:
    """The record stored under `host_id`'s key, or Refused: not sealed, badly signed (another key, a
    changed text, another host's record), or not the record of that host."""
    try:
        outer = json.loads(raw)
    except ValueError:
        raise Refused("not JSON") from None
    if not (isinstance(outer, dict) and isinstance(outer.get("record"), str) and isinstance(outer.get("hmac"), str)):
        raise Refused("unsigned")
    text = outer["record"]
    if not hmac.compare_digest(outer["hmac"], _signature(key, host_id, text)):
        raise Refused("badly signed (not with this fleet's key, or changed since)")
    try:
        record = json.loads(text)
    except ValueError:
        raise Refused("signed, but not JSON") from None
    if not isinstance(record, dict) or record.get("host") != host_id:
        raise Refused("signed, but not the record of the host its key names")
    return record

"""What a request's key is, as plain values: the routes attach a KeyRecord to the request
(`request.omlx_key`), and the views, the fleet's hop and the traces read it. No Django here."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

BOOTSTRAP = "bootstrap"                   # OMLX_API_KEY's name: every model, no rate, its own cache scope
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
KEY_PREFIX = "omlx-"
SHOWN = 12                                # the characters kept to tell keys apart (the prefix, then 7)


@dataclass(frozen=True)
class KeyRecord:
    name: str
    models: tuple[str, ...] = ()          # model ids it may use; empty = every model
    rate_per_minute: int | None = None    # None = no limit
    shares_cache: bool = False

    def allows(self, model_id: str) -> bool:
        return not self.models or model_id in self.models

    @property
    def cache_scope(self) -> str | None:
        """Whose cached prompt prefixes this key's requests may reuse: its own (its name), or, for a
        key that shares, those of every sharing key (None, as a server without keys)."""
        return None if self.shares_cache else self.name


BOOTSTRAP_RECORD = KeyRecord(BOOTSTRAP)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a key, or None."""
    if name == BOOTSTRAP:
        return f"'{BOOTSTRAP}' names OMLX_API_KEY"
    if not NAME.match(name):
        return "a name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    return None

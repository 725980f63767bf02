"""Prompt-prefix keys: how a router can tell, without a tokenizer, which host's prompt cache holds the
start of a chat. A chat's keys are hashes of its first message, its first two, ... (shortest first);
a host remembers the key of each chat it served for a while (its prompt cache then holds that prompt)
and publishes them; the next turn of the chat starts with those messages, so it carries that key."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

KEYS_PER_MODEL = 256
KEY_SECONDS = 300.0     # LocalAI's entry TTL; the prompt cache itself keeps fewer, the disk tier more


def prefix_keys(messages: Iterable[Any]) -> list[str]:
    """The keys of every prefix of a message list, shortest first."""
    digest = hashlib.blake2b(digest_size=8)
    keys = []
    for message in messages:
        digest.update(json.dumps(message, sort_keys=True, separators=(",", ":"), default=str).encode())
        digest.update(b"\x1e")
        keys.append(digest.copy().hexdigest())
    return keys


class PrefixLedger:
    """The keys of the chats this host served, per model: the newest KEYS_PER_MODEL of the last
    KEY_SECONDS. Forgotten with the model when it unloads (its prompt cache goes with it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._keys: dict[str, OrderedDict[str, float]] = {}

    def served(self, model_id: str, keys: list[str]) -> None:
        if not keys:
            return
        held = self._keys.setdefault(model_id, OrderedDict())
        held[keys[-1]] = self.clock()
        held.move_to_end(keys[-1])
        while len(held) > KEYS_PER_MODEL:
            held.popitem(last=False)

    def forget(self, model_id: str) -> None:
        self._keys.pop(model_id, None)

    def published(self, model_ids: Iterable[str]) -> dict[str, list[str]]:
        cutoff = self.clock() - KEY_SECONDS
        out = {}
        for model_id in model_ids:
            held = self._keys.get(model_id)
            if not held:
                continue
            while held and next(iter(held.values())) < cutoff:
                held.popitem(last=False)
            if held:
                out[model_id] = list(held)
        return out

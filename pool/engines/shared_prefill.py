"""Several choices from one prompt (`n` > 1): the prompt is read once, in chunks between engine
steps like any other, then each choice decodes from its own copy of that KV cache. The choices
enter their lane together, so they decode as one batch."""

from __future__ import annotations

import copy
from typing import Any

from .checkpoints import next_stop
from .single_sequence import read_prompt_chunk


class SharedPrefill:
    """The prompt of `requests` (one per choice) read into one cache; `all_tokens` are already in it.
    At each of `checkpoints` (prompt positions) a copy of the cache is kept for the prompt cache."""

    def __init__(self, model, tokens: list[int], cache: list[Any], all_tokens: list[int], requests: list,
                 checkpoints: tuple[int, ...] = ()):
        self.model, self.cache, self.requests = model, cache, list(requests)
        self.pending, self.fed = list(tokens), list(all_tokens)
        self.checkpoints = checkpoints
        self.kept: list[tuple[list[Any], list[int]]] = []    # (a copy of the KV, its tokens) per checkpoint

    def step(self, chunk: int) -> bool:
        """Read one chunk of the prompt; True once only its last token is left (each choice's
        generator feeds that one, to get its first logits)."""
        if len(self.pending) > 1:
            n = min(next_stop(len(self.fed), self.checkpoints, chunk), len(self.pending) - 1)
            read_prompt_chunk(self.model, self.cache, self.pending[:n])
            self.fed += self.pending[:n]
            del self.pending[:n]
            if len(self.fed) in self.checkpoints:
                self.kept.append((copy.deepcopy(self.cache), list(self.fed)))
        return len(self.pending) <= 1

    def fork(self) -> list[tuple[Any, list[Any]]]:
        """(request, its own cache) for each choice; the first keeps the one read."""
        caches = [self.cache] + [copy.deepcopy(self.cache) for _ in self.requests[1:]]
        return list(zip(self.requests, caches))

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.cache)

"""The fast path for a request alone in its lane: mlx-lm's single-sequence `generate_step`.

mlx-lm's BatchGenerator decodes one sequence at about two thirds of `generate_step`'s speed on a
GPU (a batch cache, its masks and per-step bookkeeping). So a lane whose only request is decoding
runs it through `generate_step`, and hands it back to the batch when another request arrives.

A request moves between the two with its KV cache and the tokens in it. Both generators run one
step ahead, so the cache always holds the last token handed out; a move trims that token and
feeds it again, which yields the same next token (`Pending`, below). A model whose caches cannot be
cut back (a recurrent state, a sliding window: `KVLayout.trimmable` false) moves the other way: the
token `generate_step` has already sampled ahead is handed out, and the batch feeds it
(`handover_ahead`); such a request never leaves the batch again (the batch's look-ahead is not
reachable), and it keeps copies of its KV at its prompt's checkpoints as the batch would."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .checkpoints import next_stop


@dataclass
class Pending:
    """A request on its way into a generator: `tokens` still to feed on top of `cache`, which
    holds the KV of `all_tokens` (none yet: cache None, all_tokens []). Its logits processors go
    with it: they see the same token list on either side."""
    uid: int
    tokens: list[int]
    cache: list[Any] | None
    all_tokens: list[int]
    max_tokens: int
    sampler: Callable
    processors: tuple = ()
    checkpoints: tuple[int, ...] = ()   # prompt positions to keep a copy of the KV at (checkpoints.py)
    adapter: str | None = None          # the LoRA adapter its rows run with (multi_lora.py), None: the base


def read_prompt_chunk(model, cache: list[Any], tokens: list[int]) -> None:
    """Feed prompt tokens into `cache` without asking for logits (one engine step's worth)."""
    with mx.stream(generation_stream):
        model(mx.array(tokens)[None], cache=cache)
        mx.eval([c.state for c in cache])


def with_history(processors, history: list[int]) -> list:
    """mlx-lm's BatchGenerator hands a request's processors every token in its KV cache; its
    generate_step only the tokens it was given. Prefixing those with the ones already in the cache
    shows the processors the same list on both paths (a constraint's state depends on it)."""
    if not processors:
        return []
    if not history:
        return list(processors)
    prefix = mx.array(history, dtype=mx.int32)

    def processor(tokens, logits):
        seen = mx.concatenate([prefix, tokens.astype(mx.int32)])
        for p in processors:
            logits = p(seen, logits)
        return logits
    return [processor]


class SingleSequence:
    """One request: its prompt read in chunks (one per engine step, so other lanes and commands
    go on between them), then `generate_step`, one token per engine step."""

    def __init__(self, model, pending: Pending, stop: set[int]):
        self.model, self.stop = model, stop
        self.uid, self.sampler, self.max_tokens = pending.uid, pending.sampler, pending.max_tokens
        self.processors, self.adapter = pending.processors, pending.adapter
        self.cache = pending.cache if pending.cache is not None else make_prompt_cache(model)
        self.fed = list(pending.all_tokens)     # tokens whose KV is in the cache, before generation
        self.pending = list(pending.tokens)     # prompt tokens not yet read
        self.generated: list[int] = []
        self.first_token_at = 0.0
        self.checkpoints = pending.checkpoints
        self.kept: list[tuple[list[Any], list[int]]] = []   # (a copy of the KV, its tokens) per checkpoint passed
        self._steps: Any = None
        self._ahead: tuple[Any, Any] | None = None      # (token, logprobs) generate_step sampled ahead

    def step(self, prefill_step: int) -> tuple[int, Any, str | None] | None:
        """Read one chunk of prompt (returns None) or decode one token: (token, its logprobs
        vector, finish_reason)."""
        if self._steps is None and self._read_chunk(prefill_step):
            return None
        if self._steps is None:
            self._steps = self._start()
        token, logprobs = self._next()
        self.generated.append(token)
        if len(self.generated) == 1:
            self.first_token_at = time.perf_counter()
        finish = "stop" if token in self.stop else ("length" if len(self.generated) >= self.max_tokens else None)
        if finish is not None:
            self.close()
        return token, logprobs, finish

    def _read_chunk(self, prefill_step: int) -> bool:
        """Read one chunk of the prompt, all but its last token; False when there is none left."""
        if len(self.pending) <= 1:
            return False
        n = min(next_stop(len(self.fed), self.checkpoints, prefill_step), len(self.pending) - 1)
        read_prompt_chunk(self.model, self.cache, self.pending[:n])
        self.fed += self.pending[:n]
        del self.pending[:n]
        if len(self.fed) in self.checkpoints:
            self.kept.append((copy.deepcopy(self.cache), list(self.fed)))
        return True

    def _start(self):
        def sample(logprobs):     # generate_step samples a token ahead of the one it hands out
            token = self.sampler(logprobs)
            self._ahead = (token, logprobs)
            return token
        return generate_step(mx.array(self.pending), self.model, max_tokens=self.max_tokens, sampler=sample,
                             prompt_cache=self.cache, logits_processors=with_history(self.processors, self.fed))

    def _next(self) -> tuple[int, Any]:
        return next(self._steps)

    def decode_rate(self) -> tuple[int, float] | None:
        """(tokens generated after the first, the seconds they took), once there are some."""
        if len(self.generated) < 2:
            return None
        return len(self.generated) - 1, time.perf_counter() - self.first_token_at

    @property
    def all_tokens(self) -> list[int]:
        """The tokens whose KV the cache holds (the look-ahead has fed the last generated one)."""
        return self.fed + (self.pending + self.generated if self._steps is not None or self.generated else [])

    def finished_cache(self) -> tuple[list[Any], list[int]]:
        tokens = self.all_tokens
        self._trim_to(len(tokens))
        # a speculative round's end leaves the last token out of the cache (drafting.py)
        held = _length(self.cache)
        return self.cache, tokens if held is None else tokens[:held]

    def handover(self) -> Pending:
        """Stop here and give the request to another generator, as a `Pending` it can insert."""
        if self._steps is None and not self.generated:
            return Pending(self.uid, self.pending, self.cache, self.fed, self.max_tokens, self.sampler,
                           self.processors, self.checkpoints, adapter=self.adapter)
        self.close()
        tokens = self.all_tokens
        self._trim_to(len(tokens) - 1)
        return Pending(self.uid, tokens[-1:], self.cache, tokens[:-1], self.max_tokens - len(self.generated),
                       self.sampler, self.processors, adapter=self.adapter)

    def handover_ahead(self) -> tuple[int, Any, Pending | None, list[int]]:
        """For a cache that cannot be cut back: stop here and hand out the token sampled ahead: (it,
        its logprobs vector, the request as a `Pending` whose prompt is that token, or None when that
        token ends the request, the tokens whose KV the cache holds)."""
        self.close()
        if self._ahead is None:
            raise RuntimeError("no token was sampled ahead")
        sampled, logprobs = self._ahead
        token = int(sampled.item())
        logprobs = logprobs.squeeze(0) if logprobs.ndim == 2 else logprobs
        tokens = self.all_tokens
        self.generated.append(token)
        if token in self.stop or len(self.generated) >= self.max_tokens:
            return token, logprobs, None, tokens
        return token, logprobs, Pending(self.uid, [token], self.cache, tokens, self.max_tokens - len(self.generated),
                                        self.sampler, self.processors, adapter=self.adapter), tokens

    def take_kept(self) -> list[tuple[list[Any], list[int]]]:
        kept, self.kept = self.kept, []
        return kept

    def _trim_to(self, length: int) -> None:
        held = _length(self.cache)
        if held is not None and held > length and can_trim_prompt_cache(self.cache):
            trim_prompt_cache(self.cache, held - length)

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.cache)

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()
            self._steps = None


def _length(cache: list[Any]) -> int | None:
    """Tokens a prompt cache holds, from its first layer that counts them (a recurrent state does not)."""
    return next((c.offset for c in cache if hasattr(c, "offset")), None)

"""Constrained decoding on the engine thread: a request's grammar (pool/serving/constraints.py
makes its text) becomes an mlx-lm logits processor that masks every token the grammar does not
allow next, enforced with llguidance."""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

import mlx.core as mx
import numpy as np
from llguidance import LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer

log = logging.getLogger(__name__)

GRAMMARS_PER_TOKENIZER = 64   # compiled grammars kept per tokenizer (a request copies one: ~0.1 ms)


class UnenforceableGrammar(ValueError):
    """The grammar compiled for this tokenizer reports an error (the request's constraint, not the engine)."""


def make_processor(grammar: str, tokenizer) -> "GrammarProcessor":
    """A fresh logits processor for one request (mlx-lm's `processor(tokens, logits)`); call it on
    the engine thread: the tokenizer's tables are built there, once per tokenizer (~1 s)."""
    grammars = _grammars(tokenizer)
    return GrammarProcessor(grammars.matcher(grammar), grammars.eos, grammars.tokenizer.vocab_size)


class _TokenizerGrammars:
    """One tokenizer's llguidance tables and its recently compiled grammars (each kept as a matcher
    in its start state; a request gets a copy)."""

    def __init__(self, tokenizer):
        hf = getattr(tokenizer, "_tokenizer", tokenizer)    # mlx-lm's TokenizerWrapper, or the HF one
        eos = sorted(set(getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id]))
        self.tokenizer: LLTokenizer = from_tokenizer(hf, eos_token=eos)
        self.eos = tuple(eos)
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, grammar: str) -> LLMatcher:
        with self._lock:
            start = self._compiled.get(grammar)
            if start is None:
                start = LLMatcher(self.tokenizer, grammar, log_level=0)
                if start.is_error():
                    raise UnenforceableGrammar(start.get_error())
                self._compiled[grammar] = start
                while len(self._compiled) > GRAMMARS_PER_TOKENIZER:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(grammar)
            return start.deep_copy()


_by_tokenizer: "weakref.WeakKeyDictionary[Any, _TokenizerGrammars]" = weakref.WeakKeyDictionary()
_by_tokenizer_lock = threading.Lock()


def _grammars(tokenizer) -> _TokenizerGrammars:
    with _by_tokenizer_lock:
        found = _by_tokenizer.get(tokenizer)
        if found is None:
            found = _by_tokenizer[tokenizer] = _TokenizerGrammars(tokenizer)
        return found


def prepare(tokenizer) -> None:
    """Build a tokenizer's tables now (about 1 s), on a model's load say, rather than at its first
    constrained request, which would hold up the engine thread's other requests for that long."""
    _grammars(tokenizer)


def sync_plan(consumed: Sequence[int], seen: Sequence[int]) -> tuple[int, list[int]]:
    """How a matcher that has consumed `consumed` catches up with the generated tokens `seen`:
    (tokens to roll back, tokens to feed). A request re-fed its last token (it moved between
    mlx-lm's two generators) shows the same or a shorter list, which rolls back, never advances twice."""
    if len(seen) >= len(consumed) and list(seen[:len(consumed)]) == list(consumed):
        return 0, list(seen[len(consumed):])
    common = 0
    for a, b in zip(consumed, seen):
        if a != b:
            break
        common += 1
    return len(consumed) - common, list(seen[common:])


def allowed_mask(words: mx.array, vocab: int) -> mx.array:
    """llguidance's bitmask (one bit per token, 32 to a uint32 word) -> a bool per logit. (No MLX
    array at module level: a lazy one belongs to the importing thread's stream, not the engine's.)"""
    bits = mx.right_shift(words[:, None], mx.arange(32, dtype=mx.uint32)) & 1
    return bits.reshape(-1)[:vocab].astype(mx.bool_)


class GrammarProcessor:
    """An mlx-lm logits processor: masks every token the grammar does not allow next.

    mlx-lm calls it with the request's tokens (prompt and the tokens generated so far, the whole
    prompt at the first call) and the next token's logits. It keeps the matcher in step with those
    tokens (`sync_plan`), so it does not matter which generator calls it, or whether one repeats a
    step. Once the grammar is complete only EOS is allowed; if the matcher ever fails (a token it
    did not allow), only EOS too, so the request ends instead of the engine thread."""

    def __init__(self, matcher: LLMatcher, eos: Sequence[int], vocab_size: int):
        self._matcher = matcher
        self._eos = frozenset(eos)
        self._own_words = (vocab_size + 31) // 32      # llguidance's mask, over the tokenizer's vocabulary
        self._words: np.ndarray | None = None
        self._prompt_length: int | None = None
        self._consumed: list[int] = []
        self._failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self._sync(tokens)        # waits for the token sampled last, before this step's forward is queued
        mx.async_eval(logits)     # which then runs while this thread computes the mask
        vocab = logits.shape[-1]
        words = mx.array(self._next_words(vocab))
        return mx.where(allowed_mask(words, vocab), logits, mx.array(-mx.inf, dtype=logits.dtype))

    @property
    def consumed(self) -> list[int]:
        """The generated tokens the grammar has taken, in order."""
        return list(self._consumed)

    @property
    def failed(self) -> bool:
        return self._failed

    def _sync(self, tokens: mx.array) -> None:
        tokens = tokens.reshape(-1)
        if self._prompt_length is None:
            self._prompt_length = tokens.size
            return
        if self._failed:           # a failed matcher stays failed: EOS only from here on
            return
        seen = tokens[self._prompt_length:].tolist() if tokens.size > self._prompt_length else []
        ended = next((i for i, t in enumerate(seen) if t in self._eos), None)
        if ended is not None:      # the grammar allowed EOS, so it was complete: nothing after counts
            seen = seen[:ended]
        back, feed = sync_plan(self._consumed, seen)
        if back and not self._matcher.rollback(back):
            self._fail("rollback")
        if feed and not self._matcher.consume_tokens(feed):
            self._fail("consume")
        self._consumed = seen

    def _fail(self, what: str) -> None:
        if not self._failed:
            log.warning("constraint failed (%s): %s", what, self._matcher.get_error()[:300])
        self._failed = True

    def _next_words(self, vocab: int) -> np.ndarray:
        """The mask's words for `vocab` logits: a model's may outnumber its tokenizer's tokens (those
        bits stay 0) or fall short of them (cut)."""
        words = (vocab + 31) // 32
        if self._words is None or len(self._words) < words:
            self._words = np.zeros(max(words, self._own_words), dtype=np.uint32)
        own = self._words[:self._own_words]
        if self._failed or self._matcher.is_error():
            self._failed = True
            own[:] = 0
            for t in self._eos:
                own[t // 32] |= np.uint32(1 << (t % 32))
        else:
            self._matcher.unsafe_compute_mask_ptr(own.ctypes.data, own.nbytes)
        return self._words[:words]

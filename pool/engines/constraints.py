"""Constrained decoding: output that must be JSON, JSON matching a schema, or tool calls in the
server's fallback format, enforced token by token with llguidance.

llguidance, not xgrammar or outlines-core: it needs nothing beyond its own wheel (xgrammar imports
torch), builds a schema's grammar in milliseconds (outlines-core's token index takes seconds for a
20-field object), rolls back consumed tokens, and names the schema keywords it cannot enforce.

A `Constraint` is plain data (the grammar text), made on the event loop when a request is parsed.
The engine thread asks it for a logits processor per request; that processor is the only stateful
part, and it follows the token list mlx-lm hands it (see `GrammarProcessor`)."""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import numpy as np
from llguidance import LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer

log = logging.getLogger(__name__)

# json.dumps' separators, the spacing models have seen most; no other whitespace, so a small model
# cannot wander off into blank lines between the braces.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"   # the fallback tool format's tags
NEWLINE = "\n"
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
MAX_PARALLEL_CALLS = 8        # calls in one answer when parallel calls are allowed
GRAMMARS_PER_TOKENIZER = 64   # compiled grammars kept per tokenizer (a request copies one: ~0.1 ms)


class UnsupportedSchema(ValueError):
    """A schema asks for something the grammar library cannot enforce (or is not a valid schema)."""

    def __init__(self, feature: str):
        super().__init__(f"unsupported JSON schema: {feature}")
        self.feature = feature


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match: an llguidance grammar (JSON or Lark text)."""
    grammar: str
    kind: str                      # "json_object" | "json_schema" | "tool_calls"

    def make_processor(self, tokenizer) -> "GrammarProcessor":
        """A fresh logits processor for one request (mlx-lm's `processor(tokens, logits)`); call it on
        the engine thread: the tokenizer's tables are built there, once per tokenizer (~1 s)."""
        grammars = _grammars(tokenizer)
        return GrammarProcessor(grammars.matcher(self.grammar), grammars.eos, grammars.tokenizer.vocab_size)


@functools.cache
def json_object() -> Constraint:
    return Constraint(_checked(LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)),
                      "json_object")


def json_schema(schema: dict, strict: bool | None = None) -> Constraint:
    """The output is one JSON value valid against `schema`. `strict` changes nothing: the schema is
    always enforced, and a keyword that cannot be is an UnsupportedSchema whatever its value."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise UnsupportedSchema("a schema must be a JSON object")
    return Constraint(_checked(LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)), "json_schema")


def tool_calls(tools: Sequence[dict], name: str | None = None, parallel: bool = True, *,
               max_calls: int = MAX_PARALLEL_CALLS) -> Constraint:
    """The output is a call (with `parallel`, up to `max_calls`) in the fallback tool format:
    `<tool_call>\\n{"name": "<function>", "arguments": {...}}\\n</tool_call>`, calls joined by a
    newline; `name` forces that function. Each function's `parameters` is the root of its own
    arguments schema, so its local `$ref`s resolve. The cap is there because a small model, once
    it has written a call, tends to write the same one again until max_tokens cuts it off."""
    functions = [t["function"] if "function" in t else t for t in tools]
    if name is not None:
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            raise ValueError(f"no tool is a function named {name!r}")
    if not functions:
        raise ValueError("tool_calls needs at least one function")
    more = max_calls - 1 if parallel else 0
    rules = [f'start: call ("\\n" call){{0,{more}}}' if more > 0 else "start: call",
             f"call: {_lark_string(TOOL_CALL_START + NEWLINE)} function {_lark_string(NEWLINE + TOOL_CALL_END)}",
             "function: " + " | ".join(f"f{i}" for i in range(len(functions)))]
    for i, f in enumerate(functions):
        parameters = f.get("parameters") or NO_PARAMETERS
        if not isinstance(parameters, dict):
            raise UnsupportedSchema(f"the parameters of function {f['name']!r} must be a JSON object")
        head = _lark_string('{"name": ' + json.dumps(f["name"], ensure_ascii=False) + ', "arguments": ')
        rules.append(f"f{i}: {head} %json {json.dumps({**parameters, 'x-guidance': JSON_OPTIONS})} \"}}\"")
    return Constraint(_checked(LLMatcher.grammar_from_lark("\n".join(rules) + "\n")), "tool_calls")


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)   # a JSON string is a valid Lark literal


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*)\]')


def unsupported_feature(message: str) -> str:
    """llguidance's error message -> the feature to name to a client."""
    found = _UNIMPLEMENTED.search(message)
    if found:
        return ", ".join(json.loads(f"[{found.group(1)}]"))
    lines = [line.strip() for line in message.splitlines() if line.strip().strip("^")]   # not the carets
    return " ".join(lines)[:300] or "unknown error"


def _checked(grammar: str) -> str:
    """The grammar, or UnsupportedSchema naming what the library rejects (no tokenizer needed)."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise UnsupportedSchema(unsupported_feature(messages[0] if messages else ""))
    return grammar


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
                    raise UnsupportedSchema(unsupported_feature(start.get_error()))
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

"""Constrained decoding: output that must be JSON, JSON matching a schema, or tool calls in the
server's fallback format, enforced token by token with llguidance.

llguidance, not xgrammar or outlines-core: it needs nothing beyond its own wheel (xgrammar imports
torch), builds a schema's grammar in milliseconds (outlines-core's token index takes seconds for a
20-field object), rolls back consumed tokens, and names the schema keywords it cannot enforce.

A `Constraint` is plain data (the grammar text), made on the event loop when a request is parsed;
nothing here needs a tokenizer or MLX. The engine thread turns it into a logits processor per
request (pool/engines/grammar.py)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Sequence

from llguidance import LLMatcher

from .schema_bounds import bounded

# json.dumps' separators, the spacing models have seen most; no other whitespace, so a small model
# cannot wander off into blank lines between the braces.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"   # the fallback tool format's tags
NEWLINE = "\n"
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
MAX_PARALLEL_CALLS = 8        # calls in one answer when parallel calls are allowed


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


@functools.cache
def json_object() -> Constraint:
    return Constraint(_checked(LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)),
                      "json_object")


def json_schema(schema: dict, strict: bool | None = None) -> Constraint:
    """The output is one JSON value valid against `schema`, with the bounds it leaves open closed
    (schema_bounds.py: its objects take only their properties, its numbers and strings end).
    `strict` changes nothing: the schema is always enforced, and a keyword that cannot be is an
    UnsupportedSchema whatever its value."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise UnsupportedSchema("a schema must be a JSON object")
    return Constraint(_checked(LLMatcher.grammar_from_json_schema(bounded(schema), defaults=JSON_OPTIONS)),
                      "json_schema")


def tool_calls(tools: Sequence[dict], name: str | None = None, parallel: bool = True, *,
               max_calls: int = MAX_PARALLEL_CALLS) -> Constraint:
    """The output is a call (with `parallel`, up to `max_calls`) in the fallback tool format:
    `<tool_call>\\n{"name": "<function>", "arguments": {...}}\\n</tool_call>`, calls joined by a
    newline; `name` forces one call of that function (a named tool_choice asks for that call, and
    instructor and LangChain read only the first). Each function's `parameters` is the root of its own
    arguments schema, so its local `$ref`s resolve, bounded as json_schema's are. The cap is there
    because a small model, once it has written a call, tends to write the same one again until
    max_tokens cuts it off."""
    functions = [t["function"] if "function" in t else t for t in tools]
    if name is not None:
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            raise ValueError(f"no tool is a function named {name!r}")
    if not functions:
        raise ValueError("tool_calls needs at least one function")
    more = max_calls - 1 if parallel and name is None else 0
    rules = [f'start: call ("\\n" call){{0,{more}}}' if more > 0 else "start: call",
             f"call: {_lark_string(TOOL_CALL_START + NEWLINE)} function {_lark_string(NEWLINE + TOOL_CALL_END)}",
             "function: " + " | ".join(f"f{i}" for i in range(len(functions)))]
    for i, f in enumerate(functions):
        parameters = f.get("parameters") or NO_PARAMETERS
        if not isinstance(parameters, dict):
            raise UnsupportedSchema(f"the parameters of function {f['name']!r} must be a JSON object")
        head = _lark_string('{"name": ' + json.dumps(f["name"], ensure_ascii=False) + ', "arguments": ')
        arguments = json.dumps({**bounded(parameters), "x-guidance": JSON_OPTIONS})
        rules.append(f"f{i}: {head} %json {arguments} \"}}\"")
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

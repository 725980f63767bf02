"""The Responses API's conversation items -> the chat messages the serving door renders.

`input` is a string (one user message) or a list of items: messages (`{"role", "content"}`, with
`"type": "message"` or without; content a string or a list of `input_text` / `output_text` parts),
`function_call` (`call_id`, `name`, `arguments`) and `function_call_output` (`call_id`, `output`).
`reasoning` items are skipped (this server writes none); anything else (images, files,
`item_reference`, hosted tools' items) is a 400 naming the item. The items are checked and kept
as given (for the store); `messages()` turns a checked list into chat messages: a run of
function_call items becomes one assistant message with `tool_calls`, joined to the assistant text
just before it."""

from __future__ import annotations

import json
import uuid

from ...conf import get_settings
from ...errors import InvalidRequest
from ..fields import check_count

ROLES = {"user", "assistant", "system", "developer"}
TEXT_PARTS = {"input_text", "output_text", "text"}
SKIPPED = {"reasoning"}


def input_items(value) -> list[dict]:
    """`input` checked, as a list of items (a string is one user message), each message's content as
    a list of parts and each item with an id, as OpenAI lists a response's input items."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty list of items", param="input")
    check_count(value, "input", get_settings().max_messages)
    for i, item in enumerate(value):
        check_item(item, f"input[{i}]")
    return [_normal(item) for item in value]


def _normal(item: dict) -> dict:
    kind = item.get("type", "message")
    item = {**item, "type": kind}
    if kind == "message" and isinstance(item["content"], str):
        part = "output_text" if item["role"] == "assistant" else "input_text"
        item["content"] = [{"type": part, "text": item["content"]}]
    if not item.get("id"):
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
        item["id"] = f"{prefix}_{uuid.uuid4().hex}"
    return item


def check_item(item, where: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = item.get("type", "message")
    if kind == "message":
        _check_message(item, where)
    elif kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise InvalidRequest(f"{where}.{name} must be a string", param=f"{where}.{name}")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise InvalidRequest(f"{where}.call_id must be a string", param=f"{where}.call_id")
        _output_text(item.get("output"), f"{where}.output")
    elif kind not in SKIPPED:
        raise InvalidRequest(f"{where}.type {kind!r} is not supported: this server takes messages with text, "
                             f"function_call and function_call_output items", param=f"{where}.type")


def _check_message(item: dict, where: str) -> None:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}", param=f"{where}.role")
    _text(item.get("content"), f"{where}.content")


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of text parts", param=where)
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else None
            raise InvalidRequest(f"{where}[{j}]: only input_text and output_text parts are supported"
                                 + (f" (got {kind!r})" if kind else ""), param=f"{where}[{j}]")
        parts.append(part["text"])
    return "".join(parts)


def _output_text(output, where: str) -> str:
    if isinstance(output, (dict, list)) and not (isinstance(output, list) and all(isinstance(p, dict) for p in output)):
        return json.dumps(output)
    return _text(output, where) if output is not None else ""


def messages(items: list[dict]) -> list[dict]:
    """Checked items -> chat messages (system for developer)."""
    out: list[dict] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _text(item["content"], "input")})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _output_text(item.get("output"), "input")})
    return out


def drop_oldest(items: list[dict]) -> list[dict] | None:
    """`truncation: "auto"`: the conversation without its oldest turn (the first item, and any call
    outputs or calls left without their partner); None when nothing more can go."""
    if len(items) <= 1:
        return None
    rest = items[1:]
    while len(rest) > 1 and rest[0].get("type") in ("function_call_output", "function_call", "reasoning"):
        rest = rest[1:]
    return rest

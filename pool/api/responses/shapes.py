"""The Responses API's objects: the response (`"object": "response"`), its output items (an
assistant `message` with `output_text` parts, a `function_call`), usage with
`input_tokens_details.cached_tokens`, and ids. Pure: the routes hand it values."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from ...tools.calls import ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Text:
    text: str


Piece = Text | ToolCall


def message_item(item_id: str, text: str | None, *, status: str = "completed") -> dict:
    content = [] if text is None else [output_text(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: ToolCall, *, status: str = "completed", arguments: str | None = None,
              namespace: str | None = None) -> dict:
    item = {"id": item_id, "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments}
    return item if namespace is None else {**item, "namespace": namespace}


def output_items(pieces: list[Piece], namespaces: dict[str, str] | None = None) -> list[dict]:
    """Pieces of an answer -> its output items: adjacent text in one message, an item per call."""
    items: list[dict] = []
    for piece in pieces:
        if isinstance(piece, ToolCall):
            items.append(call_item(new_id("fc"), piece, namespace=(namespaces or {}).get(piece.name)))
        elif not piece.text:
            continue
        elif items and items[-1]["type"] == "message":
            items[-1]["content"][0]["text"] += piece.text
        else:
            items.append(message_item(new_id("msg"), piece.text))
    return items


def usage(input_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def status_of(finish_reason: str | None, output: list[dict], *, requested: int | None = None,
              output_tokens: int = 0) -> tuple[str, dict | None]:
    """(status, incomplete_details) for how generation ended: an answer that holds a call is complete
    (as the chat route's finish_reason "tool_calls"). Without the client's `max_output_tokens` the
    server's own limit ended it: the details say so, and what it was (the tokens it allowed)."""
    if finish_reason != "length" or any(item["type"] == "function_call" for item in output):
        return "completed", None
    if requested is not None:
        return "incomplete", {"reason": "max_output_tokens"}
    return "incomplete", {"reason": "max_output_tokens", "limit": "server_default", "max_output_tokens": output_tokens}


def output_text_of(output: list[dict]) -> str:
    return "".join(part["text"] for item in output if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


class Response:
    """One response's fixed fields; `body(...)` is the object at any point of its life."""

    def __init__(self, *, model: str, echo: dict, response_id: str | None = None,
                 namespaces: dict[str, str] | None = None):
        self.id = response_id or new_id("resp")
        self.created_at = int(time.time())
        self.model, self.echo = model, echo
        self.namespaces = namespaces or {}      # a namespaced function's calls name the namespace

    def body(self, *, status: str, output: list[dict], usage: dict | None = None,
             incomplete_details: dict | None = None, error: dict | None = None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "background": False, "error": error, "incomplete_details": incomplete_details,
                "completed_at": int(time.time()) if status == "completed" else None,
                "model": self.model, "output": output,
                "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
                **self.echo, "usage": usage}

"""A tool call as the answers carry it, and how it changes a finish reason: plain values, for the
routes that frame them (stream.py finds them in a model's text)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str     # a JSON object, as OpenAI sends it

    def openai(self) -> dict:
        """As in a chat completion's `message.tool_calls`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def openai_delta(self, index: int) -> dict:
        """As in a chunk's `delta.tool_calls`: the whole call in one delta (the client concatenates)."""
        return {"index": index, **self.openai()}


Delta = Union[str, ToolCall]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def finish_reason(engine_reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and engine_reason is not None else engine_reason

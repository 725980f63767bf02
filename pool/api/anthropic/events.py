"""An answer as Anthropic's Messages API shapes it: content blocks, stop_reason, usage, and the
stream's event sequence. Pure: the route feeds it pieces of the answer (text, tool calls) and sends
what it returns."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolUse:
    id: str
    name: str
    arguments: str          # a JSON object, as the tools layer gives it


Piece = Text | ToolUse


def stop_reason(finish_reason: str | None, stop_sequence: str | None, *, tool_use: bool) -> str:
    if tool_use:
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence else "end_turn"


def tool_input(arguments: str) -> dict:
    """A call's arguments as the `input` object (empty when they are not a JSON object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(pieces: list[Piece]) -> list[dict]:
    """Pieces -> content: adjacent text joined in one text block, a tool_use block per call."""
    blocks: list[dict] = []
    for piece in pieces:
        if isinstance(piece, ToolUse):
            blocks.append({"type": "tool_use", "id": piece.id, "name": piece.name,
                           "input": tool_input(piece.arguments)})
        elif not piece.text:
            continue
        elif blocks and blocks[-1]["type"] == "text":
            blocks[-1]["text"] += piece.text
        else:
            blocks.append({"type": "text", "text": piece.text})
    return blocks


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict:
    """Anthropic's usage: `input_tokens` are the prompt's tokens not read from the cache (those are
    `cache_read_input_tokens`; the prompt is their sum). Nothing is written on request here: every
    prompt is cached as it is read, so `cache_creation_input_tokens` is 0."""
    return {"input_tokens": prompt_tokens - cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens, "output_tokens": output_tokens}


def message(*, model: str, content: list[dict], stop_reason: str | None, stop_sequence: str | None,
            usage: dict, id: str | None = None) -> dict:
    return {"id": id or new_id(), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}


def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


class EventStream:
    """The events of one streamed answer: `start()`, then `feed(piece)` for each piece, then
    `finish(...)`; each returns a list of (event name, data) pairs. A text block opens at the first
    text and stays open while text follows; each tool call is a whole tool_use block. The ping comes
    after the first block opens (or before the end, when none does)."""

    def __init__(self, *, model: str, input_tokens: int):
        self.model, self.input_tokens = model, input_tokens
        self._index = -1
        self._open: str | None = None     # the type of the block that is open
        self._pinged = False
        self.tool_use = False

    def start(self) -> list[tuple[str, dict]]:
        shell = message(model=self.model, content=[], stop_reason=None, stop_sequence=None,
                        usage=usage(self.input_tokens, 0))
        return [("message_start", {"type": "message_start", "message": shell})]

    def feed(self, piece: Piece) -> list[tuple[str, dict]]:
        if isinstance(piece, ToolUse):
            self.tool_use = True
            block = {"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            return [*self._begin(block), self._delta(delta), *self._close()]
        if not piece.text:
            return []
        events = [] if self._open == "text" else self._begin({"type": "text", "text": ""})
        return [*events, self._delta({"type": "text_delta", "text": piece.text})]

    def finish(self, *, stop_reason: str, stop_sequence: str | None, output_tokens: int,
               cached_tokens: int = 0) -> list[tuple[str, dict]]:
        """The end; its usage is the whole request's (message_start's was sent before the prompt
        cache was asked, so it counted every prompt token as input)."""
        events = [*self._close(), *self._ping()]
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                         "usage": usage(self.input_tokens, output_tokens, cached_tokens)}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _begin(self, block: dict) -> list[tuple[str, dict]]:
        events = self._close()
        self._index += 1
        self._open = block["type"]
        events.append(("content_block_start", {"type": "content_block_start", "index": self._index,
                                               "content_block": block}))
        return events + self._ping()

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _close(self) -> list[tuple[str, dict]]:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _ping(self) -> list[tuple[str, dict]]:
        if self._pinged:
            return []
        self._pinged = True
        return [("ping", {"type": "ping"})]


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()

"""A streamed response as the Responses API's events, each with its `sequence_number`:

    response.created, response.in_progress,
    per message: response.output_item.added, response.content_part.added,
                 response.output_text.delta..., response.output_text.done,
                 response.content_part.done, response.output_item.done
    per call:    response.output_item.added, response.function_call_arguments.delta,
                 response.function_call_arguments.done, response.output_item.done
    response.completed (response.incomplete when max_output_tokens ended it)
    on a failure: error, then response.failed.

Pure: the route feeds it pieces of the answer and sends what it returns, as `event:`/`data:` SSE.
`replay` is a stored response as the events its stream sent (GET /v1/responses/{id}?stream=true)."""

from __future__ import annotations

import itertools
import json

from ...tools.calls import ToolCall
from .shapes import Piece, Response, call_item, message_item, new_id, output_text, output_text_of, status_of

FINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


class EventStream:
    def __init__(self, response: Response):
        self.response = response
        self.output: list[dict] = []
        self.sequence = 0
        self._text: list[str] | None = None    # the open message's text, while one is open
        self.final: dict | None = None          # the last response object sent

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict]:
        body = self.response.body(status="in_progress", output=[])
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def feed(self, piece: Piece) -> list[dict]:
        if isinstance(piece, ToolCall):
            return [*self._close(), *self._call(piece)]
        if not piece.text:
            return []
        events = self._open() if self._text is None else []
        assert self._text is not None
        self._text.append(piece.text)
        return [*events, self._event("response.output_text.delta", item_id=self._item_id, output_index=self._index,
                                     content_index=0, delta=piece.text, logprobs=[])]

    @property
    def _index(self) -> int:
        return len(self.output) - 1

    @property
    def _item_id(self) -> str:
        return self.output[-1]["id"]

    def _open(self) -> list[dict]:
        self._text = []
        self.output.append(message_item(new_id("msg"), None, status="in_progress"))
        added = self._event("response.output_item.added", output_index=self._index, item=dict(self.output[-1]))
        part = self._event("response.content_part.added", item_id=self._item_id, output_index=self._index,
                           content_index=0, part=output_text(""))
        return [added, part]

    def _close(self) -> list[dict]:
        if self._text is None:
            return []
        text = "".join(self._text)
        self._text = None
        item = self.output[-1] = message_item(self._item_id, text)
        where = {"item_id": item["id"], "output_index": self._index, "content_index": 0}
        return [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=output_text(text)),
                self._event("response.output_item.done", output_index=self._index, item=item)]

    def _call(self, call: ToolCall) -> list[dict]:
        namespace = self.response.namespaces.get(call.name)
        self.output.append(call_item(new_id("fc"), call, status="in_progress", arguments="", namespace=namespace))
        where = {"item_id": self._item_id, "output_index": self._index}
        added = self._event("response.output_item.added", output_index=self._index, item=dict(self.output[-1]))
        delta = self._event("response.function_call_arguments.delta", **where, delta=call.arguments)
        done = self._event("response.function_call_arguments.done", **where, arguments=call.arguments)
        item = self.output[-1] = call_item(self._item_id, call, namespace=namespace)
        return [added, delta, done, self._event("response.output_item.done", output_index=self._index, item=item)]

    def finish(self, *, finish_reason: str | None, usage: dict) -> list[dict]:
        """The open message's closing events; the response is then `final`, and its own event
        `final_event()` (the route stores the response between the two)."""
        events = self._close()
        status, details = status_of(finish_reason, self.output, requested=self.response.echo.get("max_output_tokens"),
                                    output_tokens=usage.get("output_tokens", 0))
        self.final = self.response.body(status=status, output=self.output, usage=usage, incomplete_details=details)
        return events

    def final_event(self) -> dict:
        assert self.final is not None
        return self._event(FINAL[self.final["status"]], response=self.final)

    def fail(self, *, code: str | None, message: str, param: str | None) -> list[dict]:
        """The error event, then response.failed with the error on the response."""
        error = self._event("error", code=code, message=message, param=param)
        code = code if code in ("server_error", "rate_limit_exceeded", "invalid_prompt") else "server_error"
        self.final = self.response.body(status="failed", output=self.output,
                                        error={"code": code, "message": message})
        return [error, self._event("response.failed", response=self.final)]


def replay(body: dict) -> list[dict]:
    """A stored response as the events of its stream: each text in one delta, a call's arguments whole;
    one still streaming (`in_progress`) as far as its `response.in_progress`."""
    numbers = itertools.count()

    def event(kind: str, **fields) -> dict:
        return {"type": kind, "sequence_number": next(numbers), **fields}

    start = {**body, "status": "in_progress", "output": [], "usage": None, "completed_at": None,
             "incomplete_details": None, "error": None}
    events = [event("response.created", response=start), event("response.in_progress", response=start)]
    if body["status"] not in FINAL:
        return events
    for index, item in enumerate(body["output"]):
        added = event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", **(
            {"content": []} if item["type"] == "message" else {"arguments": ""})})
        if item["type"] == "message":
            text = output_text_of([item])
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [added, event("response.content_part.added", **where, part=output_text("")),
                       event("response.output_text.delta", **where, delta=text, logprobs=[]),
                       event("response.output_text.done", **where, text=text, logprobs=[]),
                       event("response.content_part.done", **where, part=output_text(text))]
        else:
            where = {"item_id": item["id"], "output_index": index}
            events += [added, event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                       event("response.function_call_arguments.done", **where, arguments=item["arguments"])]
        events.append(event("response.output_item.done", output_index=index, item=item))
    return [*events, event(FINAL[body["status"]], response=body)]

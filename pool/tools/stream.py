"""A model's answer -> content and tool calls, parsed with mlx-lm's tool parsers.

mlx-lm's TextStateMachine splits the text on the format's start/end markers (holding back a partial
marker until it is known not to be one); the text between them goes to the format's mlx-lm parser.
Text outside calls is content; a call that does not parse, or names a function the request did not
give, is content too (markers included), never an error. Whitespace that only separates calls is
dropped; an answer without calls comes back unchanged.

Small models, once they have written a call, tend to write the same call again until max_tokens: a
call identical to an earlier one of the same answer (name and arguments) is dropped. A call cut by
max_tokens (its start marker without its end marker) is parsed as it is and, when it does not parse,
dropped: the format's markup is never content (the finish reason, "length", tells the client)."""

from __future__ import annotations

import json
from typing import Any

from .calls import Delta, ToolCall, new_call_id
from .formats import ToolFormat

NORMAL, TOOL = "normal", "tool"


class ToolStream:
    """Feed an answer's text as it comes; get content text and completed calls, in order.

    `tools` (the request's tool dicts) are given to parsers that use the schemas and restrict calls
    to those names; with `parallel=False` only the first call is kept."""

    def __init__(self, fmt: ToolFormat, *, tools: list[dict] | tuple[dict, ...] | None = None,
                 parallel: bool = True):
        self.fmt = fmt
        self._tools = list(tools) if tools else None
        self._names = {t["function"]["name"] for t in tools} if tools else None
        self._parallel = parallel
        transitions = {NORMAL: [(fmt.start, TOOL)], TOOL: [(fmt.end, NORMAL)] if fmt.end else []}
        # imported here: mlx-lm brings transformers (over a second of a server's start), wanted only
        # once a model answers
        from mlx_lm.generate import TextStateMachine

        self._machine: Any = TextStateMachine
        self._state = TextStateMachine(transitions).make_state(NORMAL)
        self._call = ""           # text of the call being read
        self._held = ""           # trailing whitespace of the content, until text follows
        self._after_call = False  # drop whitespace right after a call
        self._seen: set[tuple[str, str]] = set()
        self.calls = 0

    def feed(self, text: str) -> list[Delta]:
        if not text:
            return []
        self._state, segments = self._machine.split(self._state, text)
        out: list[Delta] = []
        for k, (state, piece) in enumerate(segments):
            if k:   # a marker between segments: a call starts (after normal) or ends (after tool)
                if segments[k - 1][0] == TOOL:
                    self._close(out, ended=True)
                else:
                    self._call = ""
            if state == TOOL:
                self._call += piece
            else:
                self._content(piece, out)
        return out

    def finish(self) -> list[Delta]:
        """The rest: a held-back partial marker is content; an unended call is parsed as it is
        (formats whose calls run to the end of the answer, or an answer cut by max_tokens), and
        dropped when it does not parse and its format has an end marker."""
        self._state, rest, state = self._machine.flush(self._state)
        out: list[Delta] = []
        if state == TOOL:
            self._call += rest
            self._close(out, ended=False)
        else:
            self._content(rest, out)
        if self._held and not self.calls:
            out.append(self._held)
        self._held = ""
        return out

    def _content(self, piece: str, out: list[Delta]) -> None:
        if self._after_call:
            piece = piece.lstrip()
            if not piece:
                return
            self._after_call = False
        text = self._held + piece
        body = text.rstrip()
        self._held = text[len(body):]
        if body:
            out.append(body)

    def _close(self, out: list[Delta], *, ended: bool) -> None:
        body, self._call = self._call, ""
        calls = self._parse(body)
        if calls is None and not ended and (self.calls or self.fmt.end):
            return                # cut off: a partial call, not content
        if calls is None:
            self._content(self.fmt.start + body + (self.fmt.end if ended else ""), out)
            return
        self._held, self._after_call = "", True
        for call in calls:
            if (call.name, call.arguments) in self._seen or not (self._parallel or not self.calls):
                continue
            self._seen.add((call.name, call.arguments))
            out.append(call)
            self.calls += 1

    def _parse(self, body: str) -> list[ToolCall] | None:
        try:
            parsed = self.fmt.parse_call(body, self._tools)
        except Exception:  # noqa: BLE001 - mlx-lm's parsers raise many kinds on malformed text
            return None
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = [self._call_of(item) for item in items]
        return calls if calls and all(calls) else None

    def _call_of(self, item) -> ToolCall | None:
        if not isinstance(item, dict):
            return None
        name, arguments = item.get("name"), item.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            return None
        if self._names is not None and name not in self._names:
            return None
        return ToolCall(id=new_call_id(), name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def split_tool_calls(text: str, fmt: ToolFormat, *, tools=None, parallel: bool = True
                     ) -> tuple[str | None, list[ToolCall]]:
    """A whole answer -> (content, calls). Content is None when the answer is only calls."""
    stream = ToolStream(fmt, tools=tools, parallel=parallel)
    deltas = stream.feed(text) + stream.finish()
    content = "".join(d for d in deltas if isinstance(d, str))
    calls = [d for d in deltas if isinstance(d, ToolCall)]
    return (None if calls and not content else content), calls

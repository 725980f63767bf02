"""Anthropic's Messages API, the answer side, as tables of cases: stop reasons, content blocks (text joined,
calls in order), the server-sent event sequence and its indexes, a tool_use block's arguments as an
input_json_delta, and an answer in the fallback tool-call format read into pieces. The request side is in
test_anthropic_parse.py, the routes in test_anthropic_routes.py."""

import pytest

from pool.api.anthropic import events
from pool.api.anthropic.events import EventStream, Text, ToolUse
from tests.api.anthropic_fixtures import WEATHER_FN

# ---- the answer's shapes -------------------------------------------------------------------------

STOP_REASONS = [("stop", None, False, "end_turn"), ("stop", "###", False, "stop_sequence"),
                ("length", None, False, "max_tokens"), ("stop", None, True, "tool_use"),
                ("length", None, True, "tool_use")]


@pytest.mark.parametrize("finish,stop_sequence,tool_use,expected", STOP_REASONS)
def test_stop_reason(finish, stop_sequence, tool_use, expected):
    assert events.stop_reason(finish, stop_sequence, tool_use=tool_use) == expected


def test_content_blocks_join_text_and_keep_calls_in_order():
    pieces = [Text("a"), Text(""), Text("b"), ToolUse("toolu_1", "f", '{"x": 1}'), ToolUse("toolu_2", "g", "[1]"),
              Text("c")]
    assert events.content_blocks(pieces) == [
        {"type": "text", "text": "ab"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
        {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
        {"type": "text", "text": "c"}]
    assert events.content_blocks([Text("")]) == []


def _names(evts):
    return [name for name, _ in evts]


STREAMS = [
    ("text", [Text("Hel"), Text("lo")],
     ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
      "content_block_stop", "message_delta", "message_stop"]),
    ("nothing", [Text("")], ["message_start", "ping", "message_delta", "message_stop"]),
    ("text then call then text", [Text("Let me see."), ToolUse("toolu_1", "f", "{}"), Text("done")],
     ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]),
    ("two calls", [ToolUse("toolu_1", "f", "{}"), ToolUse("toolu_2", "f", "{}")],
     ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]),
]


@pytest.mark.parametrize("name,pieces,expected", STREAMS, ids=[s[0] for s in STREAMS])
def test_event_sequence(name, pieces, expected):
    stream = EventStream(model="m", input_tokens=9)
    out = stream.start()
    for piece in pieces:
        out += stream.feed(piece)
    out += stream.finish(stop_reason="end_turn", stop_sequence=None, output_tokens=4, cached_tokens=6)
    assert _names(out) == expected
    assert all(data["type"] == name for name, data in out)
    indexes = [data["index"] for name, data in out if name.startswith("content_block")]
    starts = [data["index"] for name, data in out if name == "content_block_start"]
    assert starts == list(range(len(starts))) and indexes == sorted(indexes)
    assert out[0][1]["message"]["usage"] == {"input_tokens": 9, "cache_creation_input_tokens": 0,
                                             "cache_read_input_tokens": 0, "output_tokens": 0}
    # the end's usage is the request's: 6 of the 9 prompt tokens came from the prompt cache
    assert out[-2][1]["usage"] == {"input_tokens": 3, "cache_creation_input_tokens": 0,
                                   "cache_read_input_tokens": 6, "output_tokens": 4}


def test_stream_tool_use_block_carries_its_arguments_as_json_delta():
    stream = EventStream(model="m", input_tokens=1)
    out = stream.feed(ToolUse("toolu_1", "f", '{"a": 1}'))
    assert out[0][1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    assert out[2][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    assert stream.tool_use
    assert events.sse("ping", {"type": "ping"}) == b'event: ping\ndata: {"type": "ping"}\n\n'


def test_answer_text_with_a_call_in_the_fallback_format_becomes_pieces():
    from pool.api.anthropic.messages import _WithTools
    from pool.tools.formats import FALLBACK, fallback_call_text
    from pool.tools.stream import ToolStream

    reader = _WithTools(ToolStream(FALLBACK, tools=[WEATHER_FN]))
    text = "Let me check. " + fallback_call_text("get_weather", {"city": "Paris"})
    pieces = [p for i in range(0, len(text), 7) for p in reader.feed(text[i:i + 7])] + reader.finish()
    blocks = events.content_blocks(pieces)
    assert blocks[0] == {"type": "text", "text": "Let me check."}
    assert blocks[1]["type"] == "tool_use" and blocks[1]["id"].startswith("toolu_")
    assert (blocks[1]["name"], blocks[1]["input"]) == ("get_weather", {"city": "Paris"})

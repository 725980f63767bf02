"""pool/tools: reading tool calls out of a model's answer, whole (split_tool_calls) and streamed
(ToolStream), in the fallback format and in mlx-lm's other formats; what the openai client assembles from
the streamed chunks; and the finish_reason a call gives. The demo tokenizer streams the answers token by
token (tools_fixtures.py)."""

import json
import random

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from pool.tools.calls import ToolCall, finish_reason
from pool.tools.formats import FALLBACK, fallback_call_text, parser_format, tool_format
from pool.tools.stream import ToolStream, split_tool_calls
from tests.pool.tools_fixtures import TOOLS

# ---- split_tool_calls ----------------------------------------------------------------------------

def call(name, args):
    return fallback_call_text(name, args)


W = call("get_weather", {"city": "Paris"})
T = call("get_time", {})

# (text, content, [(name, arguments)]) in the fallback format, with the request's tools
CASES = [
    ("Hello there.", "Hello there.", []),
    ("  spaced \n", "  spaced \n", []),                                  # no calls: unchanged
    ("", "", []),
    (W, None, [("get_weather", {"city": "Paris"})]),
    (W + "\n", None, [("get_weather", {"city": "Paris"})]),
    ("Let me check.\n" + W, "Let me check.", [("get_weather", {"city": "Paris"})]),
    (W + "\n" + T + "\n", None, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (W + "\nDone.", "Done.", [("get_weather", {"city": "Paris"})]),
    ('<tool_call>{"name": "get_time"}</tool_call>', None, [("get_time", {})]),          # no arguments: {}
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>', None,
     [("get_weather", {"city": "Rome"})]),                               # arguments as a JSON string
    ('<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {}}]</tool_call>',
     None, [("get_time", {}), ("get_weather", {})]),                    # a list in one block
    (W + "\n" + W + "\n" + W, None, [("get_weather", {"city": "Paris"})]),          # a repeated call: once
    (W + "\n" + call("get_weather", {"city": "Rome"}), None,
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),       # other arguments: kept
    (W + '\n<tool_call>\n{"name": "get_weather", "arguments": {"ci', None,
     [("get_weather", {"city": "Paris"})]),                             # cut mid-call after a call: dropped
    ("<tool_call>{not json</tool_call>", "<tool_call>{not json</tool_call>", []),
    ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "launch", "arguments": {}}</tool_call>', []),  # not a given tool
    ('<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>', []),
    ('<tool_call>"get_time"</tool_call>', '<tool_call>"get_time"</tool_call>', []),
    ("Bad " + '<tool_call>{"name": 1}</tool_call>' + " then " + T, 'Bad <tool_call>{"name": 1}</tool_call> then',
     [("get_time", {})]),
    ("a < b <tool", "a < b <tool", []),                                  # a partial marker at the end
    ("x <tool_call> y", "x ", []),                                       # cut before the end marker: dropped
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n', None, [("get_time", {})]),   # ended by max_tokens
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "", []),   # a forced call cut: no markup
    ("</tool_call> stray end", "</tool_call> stray end", []),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>', None,
     [("get_weather", {"city": "Zürich"})]),
]


def outcome(content, calls):
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_split_tool_calls_fallback(text, content, calls):
    assert outcome(*split_tool_calls(text, FALLBACK, tools=TOOLS)) == (content, calls)


def test_split_ids_and_arguments_are_openais_shape():
    _, calls = split_tool_calls(W + T, FALLBACK, tools=TOOLS)
    assert all(c.id.startswith("call_") and len(c.id) > 10 for c in calls) and calls[0].id != calls[1].id
    assert calls[0].arguments == '{"city": "Paris"}' and calls[1].arguments == "{}"
    assert calls[0].openai() == {"id": calls[0].id, "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert calls[1].openai_delta(1) == {"index": 1, **calls[1].openai()}


def test_any_name_is_a_call_without_the_requests_tools():
    assert outcome(*split_tool_calls('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', FALLBACK)) \
        == (None, [("launch", {})])


def test_parallel_false_keeps_the_first_call():
    assert outcome(*split_tool_calls("Sure " + W + T, FALLBACK, tools=TOOLS, parallel=False)) \
        == ("Sure", [("get_weather", {"city": "Paris"})])


# Other mlx-lm formats, parsed by their own mlx-lm parsers
NATIVE_CASES = [
    ("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>", "Checking.", [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', None, [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", '
     '"arguments": {}}]', None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("mistral", "[TOOL_CALLS]get_weather[ARGS]{broken", "[TOOL_CALLS]get_weather[ARGS]{broken", []),
    ("pythonic", 'Ok <|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>', "Ok",
     [("get_weather", {"city": "Paris"})]),
    ("glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", None,
     [("get_weather", {"city": "Paris"})]),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', None,
     [("get_weather", {"city": "Paris"})]),
]


@pytest.mark.parametrize("parser, text, content, calls", NATIVE_CASES)
def test_split_tool_calls_native_formats(parser, text, content, calls):
    fmt = parser_format(parser)
    assert outcome(*split_tool_calls(text, fmt, tools=TOOLS)) == (content, calls)


def test_split_tool_calls_of_the_native_qwen_fixture(toks):
    fmt = tool_format(toks["qwen"])
    text = 'I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert outcome(*split_tool_calls(text, fmt, tools=TOOLS)) == ("I will look.", [("get_weather", {"city": "Paris"})])


# ---- ToolStream ----------------------------------------------------------------------------------

def run_stream(fmt, pieces, **kw):
    stream = ToolStream(fmt, **kw)
    deltas = [d for p in pieces for d in stream.feed(p)] + stream.finish()
    return deltas, stream


def joined(deltas):
    content = "".join(d for d in deltas if isinstance(d, str))
    calls = [d for d in deltas if isinstance(d, ToolCall)]
    return outcome(None if calls and not content else content, calls)


def token_pieces(tok, text) -> list[str]:
    """The text as the engine streams it: one detokenized segment per token of the demo tokenizer."""
    detok = tok.detokenizer
    pieces = []
    for token in tok.encode(text, add_special_tokens=False):
        detok.add_token(token)
        pieces.append(detok.last_segment)
    detok.finalize()
    pieces.append(detok.last_segment)
    return pieces


@pytest.mark.parametrize("text, content, calls", CASES)
def test_streaming_matches_the_whole_answer(toks, text, content, calls):
    rng = random.Random(text)
    cuts = sorted(rng.sample(range(1, len(text)), min(4, max(0, len(text) - 1)))) if len(text) > 1 else []
    splits = {"whole": [text], "chars": list(text), "tokens": token_pieces(toks["demo"], text),
              "random": [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]}
    for how, pieces in splits.items():
        # the detokenizer drops the leading space of a first token: compare with the text it gave
        whole = outcome(*split_tool_calls("".join(pieces), FALLBACK, tools=TOOLS))
        assert how == "tokens" or whole == (content, calls)
        deltas, stream = run_stream(FALLBACK, pieces, tools=TOOLS)
        assert joined(deltas) == whole, how
        assert stream.calls == len(whole[1])


@pytest.mark.parametrize("parser, text, content, calls", NATIVE_CASES)
def test_streaming_native_formats_char_by_char(parser, text, content, calls):
    deltas, _ = run_stream(parser_format(parser), list(text), tools=TOOLS)
    assert joined(deltas) == (content, calls)


def test_text_before_a_call_streams_and_a_partial_marker_waits():
    stream = ToolStream(FALLBACK, tools=TOOLS)
    assert stream.feed("Let me check") == ["Let me check"]
    assert stream.feed(" the weather. <tool") == [" the weather."]     # the space and '<tool' wait
    assert stream.feed("_call>\n{\"name\": \"get_weather\", ") == []
    done = stream.feed('"arguments": {"city": "Paris"}}\n</tool_call>\n')
    assert [(d.name, d.arguments) for d in done] == [("get_weather", '{"city": "Paris"}')]
    assert stream.finish() == []


def test_a_held_marker_that_is_not_one_is_released():
    stream = ToolStream(FALLBACK)
    assert stream.feed("x <tool") == ["x"]
    assert stream.feed("box> y") == [" <toolbox> y"]


# ---- what the openai client builds from the stream -----------------------------------------------

def chunks_for(deltas, finish):
    """The chat.completion.chunk objects a route sends for a ToolStream's deltas."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta, finish_reason=None):
        return ChatCompletionChunk.model_validate(
            {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]})
    out, index = [chunk({"role": "assistant", "content": ""})], 0
    for d in deltas:
        if isinstance(d, str):
            out.append(chunk({"content": d}))
        else:
            out.append(chunk({"tool_calls": [d.openai_delta(index)]}))
            index += 1
    out.append(chunk({}, finish))
    return out


@pytest.mark.parametrize("text, content, calls", [
    ("Let me check.\n" + W + "\n" + T, "Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (W, None, [("get_weather", {"city": "Paris"})]),
    ("Just text.", "Just text.", []),
])
def test_the_openai_client_reassembles_the_stream(toks, text, content, calls):
    deltas, stream = run_stream(FALLBACK, token_pieces(toks["demo"], text), tools=TOOLS)
    state = ChatCompletionStreamState()
    for c in chunks_for(deltas, finish_reason("stop", stream.calls > 0)):
        state.handle_chunk(c)
    choice = state.get_final_completion().choices[0]
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
    assert (choice.message.content or None) == (content or None)
    got = [(t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls or []]
    assert got == calls
    assert all(t.id.startswith("call_") and t.type == "function" for t in choice.message.tool_calls or [])


# ---- finish_reason -------------------------------------------------------------------------------

@pytest.mark.parametrize("engine, has_calls, expected", [
    ("stop", True, "tool_calls"),
    ("length", True, "tool_calls"),
    ("stop", False, "stop"),
    ("length", False, "length"),
    (None, True, None),
])
def test_finish_reason(engine, has_calls, expected):
    assert finish_reason(engine, has_calls) == expected

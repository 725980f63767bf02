"""pool/tools: the messages a request with tools is rendered from (prepare_messages): the fallback's system
message of tools and instructions, the history rewritten in the fallback format, a template without a
system role, the native format's tools and history handed to the template, and bad history named. The
tokenizers are real (tools_fixtures.py)."""

import json

import pytest

from pool.errors import InvalidRequest
from pool.tools.formats import fallback_call_text, tool_format
from pool.tools.prompt import prepare_messages
from pool.tools.request import ToolRequest
from pool.tools.stream import split_tool_calls
from tests.pool.tools_fixtures import ASK, HISTORY, TOOLS, WEATHER, render


def req(choice="auto", parallel=True, tools=TOOLS):
    return ToolRequest(tools=tuple(tools), tool_choice=choice, parallel_tool_calls=parallel)


def test_fallback_shows_the_tools_in_a_system_message_of_ours(toks):
    fmt = tool_format(toks["demo"])
    messages, template_tools = prepare_messages([ASK], req(), fmt)
    assert template_tools is None and messages[1:] == [ASK]
    system = messages[0]
    assert system["role"] == "system"
    for tool in TOOLS:
        assert json.dumps(tool) in system["content"]
    assert fallback_call_text("<function name>", {"<argument>": "<value>"}) in system["content"]
    prompt = render(toks["demo"], messages)
    assert system["content"] in prompt and "named SmolLM" not in prompt   # ours replaces the default


@pytest.mark.parametrize("choice, parallel, says, never", [
    ("auto", True, ["one <tool_call></tool_call> block for each"], ["must call", "at most one"]),
    ("auto", False, ["at most one function"], ["must call"]),
    ("required", True, ["must call at least one function"], ["get_time' now"]),
    ({"type": "function", "function": {"name": "get_time"}}, True, ["must call the function 'get_time' now"],
     ["at least one"]),
])
def test_fallback_instructions_follow_the_choice(toks, choice, parallel, says, never):
    messages, _ = prepare_messages([ASK], req(choice, parallel), tool_format(toks["demo"]))
    for text in says:
        assert text in messages[0]["content"]
    for text in never:
        assert text not in messages[0]["content"]


def test_fallback_merges_into_the_clients_system_message(toks):
    messages, _ = prepare_messages([{"role": "system", "content": "Be brief."}, ASK], req(),
                                   tool_format(toks["demo"]))
    assert len(messages) == 2 and messages[0]["content"].startswith("Be brief.\n\n# Tools\n")


def test_fallback_rewrites_history_in_its_own_format(toks):
    fmt = tool_format(toks["demo"])
    messages, _ = prepare_messages(HISTORY, req(), fmt)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2] == {"role": "assistant", "content": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')}
    assert messages[3] == {"role": "user", "content": (
        '<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response>')}
    # what the model wrote is what the fallback parser reads back
    _, calls = split_tool_calls(messages[2]["content"], fmt)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                  ("get_time", {})]
    prompt = render(toks["demo"], messages)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather"' in prompt


def test_tool_choice_none_hides_the_tools_but_keeps_the_history(toks):
    messages, template_tools = prepare_messages(HISTORY, req("none"), tool_format(toks["demo"]))
    assert template_tools is None and [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "# Tools" not in render(toks["demo"], messages)
    native, template_tools = prepare_messages(HISTORY, req("none"), tool_format(toks["qwen"]))
    assert template_tools is None and "<tools>" not in render(toks["qwen"], native)


def test_history_without_tools_in_the_request_is_still_rendered(toks):
    messages, template_tools = prepare_messages(HISTORY, None, tool_format(toks["demo"]))
    assert template_tools is None and [m["role"] for m in messages] == ["user", "assistant", "user"]


def test_fallback_without_a_system_role_uses_the_first_user_turn(toks):
    fmt = tool_format(toks["gemma"])
    messages, _ = prepare_messages([*HISTORY, {"role": "assistant", "content": "21 degrees at noon."},
                                    {"role": "user", "content": "Thanks"}], req(), fmt)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("# Tools\n") and messages[0]["content"].endswith(ASK["content"])
    prompt = render(toks["gemma"], messages)       # alternation holds: the template does not raise
    assert prompt.count("<start_of_turn>user") == 3


def test_native_passes_the_tools_and_the_history_to_the_template(toks):
    fmt = tool_format(toks["qwen"])
    messages, template_tools = prepare_messages(HISTORY, req(), fmt)
    assert template_tools == TOOLS
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}   # dicts, as HF expects
    assert messages[1]["content"] == ""
    assert [m.get("name") for m in messages[2:]] == ["get_weather", "get_time"]
    prompt = render(toks["qwen"], messages, template_tools)
    assert json.dumps(WEATHER) in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00" in prompt


def test_prepare_messages_leaves_its_input_alone(toks):
    history = json.loads(json.dumps(HISTORY))
    for name in ("demo", "qwen"):
        prepare_messages(history, req(), tool_format(toks[name]))
    assert history == HISTORY


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "tool_calls": {"id": "x"}}, "messages[1].tool_calls"),
    ({"role": "assistant", "tool_calls": ["get_weather"]}, "messages[1].tool_calls[0]"),
    ({"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}, "messages[1].tool_calls[0]"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "tool", "tool_call_id": "x", "content": {"a": 1}}, "messages[1].content"),
])
@pytest.mark.parametrize("fmt_name", ["demo", "qwen"])
def test_bad_history_is_a_bad_request_naming_the_message(toks, message, param, fmt_name):
    with pytest.raises(InvalidRequest) as e:
        prepare_messages([ASK, message], req(), tool_format(toks[fmt_name]))
    assert e.value.param == param

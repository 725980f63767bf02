"""pool/tools: which tool-call format a tokenizer gets (its own, or the fallback for a model without tool
support, a template without a system role, or a forced call on a Qwen3-Coder-style model), and the
request's `tools`, `tool_choice` and `parallel_tool_calls` checked field by field. The tokenizers are real
(tools_fixtures.py)."""

import pytest

from pool.api.errors import status_of
from pool.errors import InvalidRequest
from pool.tools.formats import FALLBACK, request_format, tool_format
from pool.tools.prompt import prepare_messages
from pool.tools.request import ToolRequest, parse_tool_request
from tests.pool.tools_fixtures import HISTORY, TOOLS, WEATHER, render

# ---- tool_format ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, native, parser, start, end, system_role", [
    ("demo", False, "json_tools", "<tool_call>", "</tool_call>", True),     # no tool support: fallback
    ("qwen", True, "json_tools", "<tool_call>", "</tool_call>", True),
    ("coder", True, "qwen3_coder", "<tool_call>", "</tool_call>", True),
    ("gemma", False, "json_tools", "<tool_call>", "</tool_call>", False),   # fallback, in the user turn
    ("plain", False, "json_tools", "<tool_call>", "</tool_call>", True),    # no template: role lines
])
def test_tool_format_of_real_tokenizers(toks, name, native, parser, start, end, system_role):
    fmt = tool_format(toks[name])
    assert (fmt.native, fmt.parser_name, fmt.start, fmt.end, fmt.system_role) == (native, parser, start, end,
                                                                                   system_role)
    assert fmt.writes_fallback_calls == (parser == "json_tools")
    assert tool_format(toks[name]) is fmt      # remembered per tokenizer


def test_no_tokenizer_gets_the_fallback():
    assert tool_format(None) == FALLBACK     # an engine without one (the pool's fakes)


def test_the_fallback_format_is_mlx_lms_json_tools():
    """FALLBACK names json_tools' markers without importing mlx-lm; they must be the parser's own."""
    from mlx_lm.tool_parsers import json_tools

    assert (FALLBACK.start, FALLBACK.end) == (json_tools.tool_call_start, json_tools.tool_call_end)


def test_the_demo_tokenizer_has_no_tool_support_of_its_own(toks):
    assert not toks["demo"].has_tool_calling and toks["qwen"].has_tool_calling


@pytest.mark.parametrize("name, choice, native", [
    ("qwen", "auto", True),
    ("qwen", "required", True),          # its own calls are what the constraint writes
    ("coder", "auto", True),
    ("coder", "none", True),
    ("coder", "required", False),        # forced: prompted and parsed in the fallback format
    ("coder", {"type": "function", "function": {"name": "get_time"}}, False),
    ("demo", "required", False),
])
def test_request_format(toks, name, choice, native):
    fmt = request_format(tool_format(toks[name]), ToolRequest(tools=tuple(TOOLS), tool_choice=choice))
    assert fmt.native == native and (native or fmt.writes_fallback_calls)
    assert request_format(tool_format(toks[name]), None) is tool_format(toks[name])


def test_forced_calls_on_a_coder_model_render_the_fallback_prompt(toks):
    forced = ToolRequest(tools=tuple(TOOLS), tool_choice="required")
    fmt = request_format(tool_format(toks["coder"]), forced)
    messages, template_tools = prepare_messages(HISTORY, forced, fmt)
    prompt = render(toks["coder"], messages, template_tools)
    assert template_tools is None and "must call at least one function" in prompt
    assert "<function=" not in prompt and '<tool_call>\n{"name": "get_weather"' in prompt


# ---- parse_tool_request --------------------------------------------------------------------------

def fn(name, **function):
    return {"type": "function", "function": {"name": name, **function}}


@pytest.mark.parametrize("body, tools, choice, parallel", [
    ({}, None, None, None),
    ({"tools": None}, None, None, None),
    ({"tools": []}, None, None, None),
    ({"tools": [], "tool_choice": "auto", "parallel_tool_calls": False}, None, None, None),
    ({"tool_choice": "none"}, None, None, None),
    ({"tools": TOOLS}, TOOLS, "auto", True),
    ({"tools": TOOLS, "tool_choice": "none"}, TOOLS, "none", True),
    ({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}, TOOLS, "required", False),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     TOOLS, {"type": "function", "function": {"name": "get_time"}}, True),
    ({"tools": [fn("a-b_C9")]}, [fn("a-b_C9", parameters={"type": "object", "properties": {}})], "auto", True),
    ({"tools": [fn("x", parameters={})]}, [fn("x", parameters={})], "auto", True),
    ({"tools": TOOLS, "parallel_tool_calls": None}, TOOLS, "auto", True),
])
def test_parse_tool_request_accepts(body, tools, choice, parallel):
    req = parse_tool_request(body)
    if tools is None:
        assert req is None
        return
    assert req == ToolRequest(tools=tuple(tools), tool_choice=choice, parallel_tool_calls=parallel)


@pytest.mark.parametrize("body, param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [WEATHER, fn("has space")]}, "tools[1].function.name"),
    ({"tools": [fn("")]}, "tools[0].function.name"),
    ({"tools": [fn("x" * 65)]}, "tools[0].function.name"),
    ({"tools": [fn("dot.ted")]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": 3}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [fn("x", description=["no"])]}, "tools[0].function.description"),
    ({"tools": [fn("x", parameters={"type": "array"})]}, "tools[0].function.parameters"),
    ({"tools": [fn("x", parameters="{}")]}, "tools[0].function.parameters"),
    ({"tools": [fn("x", strict="yes")]}, "tools[0].function.strict"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": 1}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "true"}, "parallel_tool_calls"),
])
def test_parse_tool_request_names_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        parse_tool_request(body)
    assert e.value.param == param and status_of(e.value) == 400


@pytest.mark.parametrize("choice, shown, forces, name", [
    ("auto", True, False, None),
    ("none", False, False, None),
    ("required", True, True, None),
    ({"type": "function", "function": {"name": "get_time"}}, True, True, "get_time"),
])
def test_tool_request_properties(choice, shown, forces, name):
    req = ToolRequest(tools=tuple(TOOLS), tool_choice=choice)
    assert (req.shown, req.forces_call, req.forced_name, req.names) == (shown, forces, name,
                                                                       ("get_weather", "get_time"))

"""pool/tools: formats, request validation, prompts and call parsing, with real tokenizers: the demo
model's (no tool support: the fallback format) and tokenizer folders made from it with other chat
templates (Qwen2.5's, which mlx-lm parses with json_tools; a Qwen3-Coder-style one; a Gemma-style
one without a system role)."""

import json
import random
import shutil
from pathlib import Path

import pytest
from mlx_lm.utils import load_tokenizer
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from pool.api.errors import status_of
from pool.errors import InvalidRequest
from pool.tools.calls import ToolCall, finish_reason
from pool.tools.formats import FALLBACK, fallback_call_text, parser_format, request_format, tool_format
from pool.tools.prompt import prepare_messages
from pool.tools.request import ToolRequest, parse_tool_request
from pool.tools.stream import ToolStream, split_tool_calls

# Qwen2.5-Instruct's chat template (tools in the system turn, calls as <tool_call>{json}</tool_call>)
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Calls written the Qwen3-Coder way (mlx-lm's qwen3_coder parser), which is not the fallback's
CODER_TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
Call a function like this:
<tool_call>
<function=example_function_name>
<parameter=example_parameter>
value
</parameter>
</function>
</tool_call><|im_end|>
{% endif %}{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}{% if message.tool_calls %}{% for tc in message.tool_calls %}
<tool_call>
<function={{ tc.function.name }}>{% for k, v in tc.function.arguments.items() %}
<parameter={{ k }}>
{{ v }}
</parameter>{% endfor %}
</function>
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Gemma's shape: no system role, strict user/model alternation
GEMMA_TEMPLATE = """{% for message in messages %}{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}
{{ message['content'] | trim }}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]


def tokenizer_dir(demo: Path, out: Path, template: str | None) -> Path:
    """The demo model's tokenizer with another chat template (None: none at all)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(demo / name, out / name)
    if template is not None:
        (out / "chat_template.jinja").write_text(template)
    return out


@pytest.fixture(scope="module")
def toks(demo_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tool-tokenizers")
    return {"demo": load_tokenizer(demo_model_dir),
            "qwen": load_tokenizer(tokenizer_dir(demo_model_dir, root / "qwen", QWEN25_TEMPLATE)),
            "coder": load_tokenizer(tokenizer_dir(demo_model_dir, root / "coder", CODER_TEMPLATE)),
            "gemma": load_tokenizer(tokenizer_dir(demo_model_dir, root / "gemma", GEMMA_TEMPLATE)),
            "plain": load_tokenizer(tokenizer_dir(demo_model_dir, root / "plain", None))}


def render(tok, messages, tools=None) -> str:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


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


# ---- prepare_messages ----------------------------------------------------------------------------

ASK = {"role": "user", "content": "Weather in Paris and the time?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
RESULTS = [{"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
           {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]
HISTORY = [ASK, CALLED, *RESULTS]


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
    ("x <tool_call> y", "x <tool_call> y", []),                          # cut before the end marker
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n', None, [("get_time", {})]),   # ended by max_tokens
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', '<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": "Pa', []),
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

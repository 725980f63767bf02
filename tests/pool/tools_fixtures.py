"""Shared by the pool/tools tests (test_tool_formats.py, test_tool_prompts.py, test_tool_calls.py): chat
templates copied from real models, the tools a request offers, a tool-call history, and tokenizers made from
the demo model's with those templates (the `toks` fixture in tests/pool/conftest.py builds them)."""

import shutil
from pathlib import Path

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
"""  # noqa: E501 -- verbatim: Qwen2.5-Instruct's chat template, long lines and all

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
{% endif %}"""  # noqa: E501 -- verbatim: Gemma's chat template (its first line)

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


def tool_tokenizers(demo: Path, root: Path) -> dict:
    """The demo model's tokenizer (no tool support: the fallback format) and tokenizers made from it with
    Qwen2.5's template (json_tools), a Qwen3-Coder-style one, a Gemma-style one without a system role,
    and none at all."""
    from mlx_lm.utils import load_tokenizer

    return {"demo": load_tokenizer(demo),
            "qwen": load_tokenizer(tokenizer_dir(demo, root / "qwen", QWEN25_TEMPLATE)),
            "coder": load_tokenizer(tokenizer_dir(demo, root / "coder", CODER_TEMPLATE)),
            "gemma": load_tokenizer(tokenizer_dir(demo, root / "gemma", GEMMA_TEMPLATE)),
            "plain": load_tokenizer(tokenizer_dir(demo, root / "plain", None))}


def render(tok, messages, tools=None) -> str:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


# A question, the assistant's two calls and their results
ASK = {"role": "user", "content": "Weather in Paris and the time?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
RESULTS = [{"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
           {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]
HISTORY = [ASK, CALLED, *RESULTS]

"""Request bodies of Anthropic's Messages API -> the serving door's CompletionSpec.

Anthropic's content blocks become the OpenAI-style chat messages the chat templates (and the tools
layer) take: `tool_use` blocks an assistant message's `tool_calls` with JSON-string arguments,
`tool_result` blocks `role: "tool"` messages; its tools OpenAI function tools. Errors name the field
the way Anthropic's do (`messages.0.content.1.type`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.core.exceptions import RequestDataTooBig

from ...conf import get_settings
from ...errors import InvalidRequest
from ...serving.images import MEDIA_TYPES, Image, ImageBudget, parts
from ...serving.specs import CompletionSpec
from ..errors import RequestTooLarge
from ..fields import check_count, flag, image_budget, integer, json_body, number, stop_strings

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Blocks a client sends back from an earlier answer that a local model cannot use: dropped.
DROPPED_BLOCKS = {"thinking", "redacted_thinking"}


@dataclass(frozen=True)
class MessagesRequest:
    spec: CompletionSpec
    stream: bool = False


def read_body(request) -> dict:
    try:
        _ = request.body      # Django raises here when the body is over its limit
    except RequestDataTooBig:
        raise RequestTooLarge("The request body is larger than this server takes.") from None
    return json_body(request)


def parse_messages(body: dict) -> MessagesRequest:
    """POST /v1/messages."""
    max_tokens = integer(body, "max_tokens", minimum=1)
    if max_tokens is None:
        raise InvalidRequest("max_tokens: Field required", param="max_tokens")
    integer(body, "top_k", minimum=0)        # validated; the sampler has no top-k yet (see the README)
    return MessagesRequest(
        spec=_spec(body, max_tokens=max_tokens,
                   temperature=number(body, "temperature", 0, 1),
                   top_p=number(body, "top_p", 0, 1, lo_open=True),
                   stop=stop_strings(body.get("stop_sequences"), name="stop_sequences", where="stop_sequences:",
                                     max_count=None, strings_only=True)),
        stream=flag(body, "stream", default=False))


def parse_count_tokens(body: dict) -> CompletionSpec:
    """POST /v1/messages/count_tokens: the same prompt as /v1/messages, nothing generated."""
    return _spec(body)


def _spec(body: dict, **sampling) -> CompletionSpec:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required (a string)", param="model")
    messages = chat_messages(body.get("system"), body.get("messages"))
    return CompletionSpec(model=model, messages=messages, **sampling,
                          **tool_fields(body.get("tools"), body.get("tool_choice")))


# ---- messages ------------------------------------------------------------------------------------

def chat_messages(system, messages) -> list[dict]:
    """Anthropic's `system` and `messages` -> OpenAI-style chat messages."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: must be a non-empty list", param="messages")
    check_count(messages, "messages", get_settings().max_messages, where="messages:")
    out = []
    budget = image_budget()
    system_text = _system(system)
    if system_text:
        out.append({"role": "system", "content": system_text})
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        role = message.get("role")
        blocks = _blocks(message.get("content"), f"{where}.content")
        if role == "user":
            out.extend(_user(blocks, f"{where}.content", budget))
        elif role == "assistant":
            out.append(_assistant(blocks, f"{where}.content"))
        else:
            raise InvalidRequest(f"{where}.role: must be 'user' or 'assistant' (the system prompt is the "
                             "top-level 'system' field)", param=f"{where}.role")
    return out


def _system(system) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list):
        return _text_blocks(system, "system")
    raise InvalidRequest("system: must be a string or a list of text blocks", param="system")


def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or a list of content blocks", param=where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.{j}: must be a content block with a 'type'", param=f"{where}.{j}")
    return content


def _text_blocks(blocks: list, where: str) -> str:
    """A list of text blocks as one string (blocks joined by a blank line)."""
    texts = []
    for j, block in enumerate(blocks):
        texts.append(_text(block, f"{where}.{j}"))
    return "\n\n".join(t for t in texts if t)


def _text(block, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise InvalidRequest(f"{where}.type: only text blocks are supported here, not {kind!r}", param=f"{where}.type")
    if not isinstance(block.get("text"), str):
        raise InvalidRequest(f"{where}.text: must be a string", param=f"{where}.text")
    return block["text"]


def _unsupported(block: dict, where: str, allowed: str) -> InvalidRequest:
    return InvalidRequest(f"{where}.type: {block['type']!r} blocks are not supported here; this server takes "
                      f"{allowed}", param=f"{where}.type")


def _user(blocks: list[dict], where: str, budget: ImageBudget) -> list[dict]:
    """A user turn: its text and images as a user message, each tool_result as a `tool` message, in order."""
    out: list[dict] = []
    texts: list[str | Image] = []

    def flush():
        if texts:
            out.append({"role": "user", "content": parts(texts, "\n\n")})
            texts.clear()
    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, f"{where}.{j}"))
        elif kind == "image":
            texts.append(_image(block, f"{where}.{j}", budget))
        elif kind == "tool_result":
            flush()
            out.append(_tool_result(block, f"{where}.{j}"))
        elif kind not in DROPPED_BLOCKS:
            raise _unsupported(block, f"{where}.{j}", "text, image and tool_result blocks in user turns")
    flush()
    return out or [{"role": "user", "content": ""}]


def _image(block: dict, where: str, budget: ImageBudget) -> Image:
    """`{"type": "image", "source": {"type": "base64", "media_type", "data"}}`, or a `url` source
    (fetched only when OMLX_IMAGE_FETCH is on)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type = source.get("media_type")
        if media_type not in MEDIA_TYPES.values():
            raise InvalidRequest(f"{where}.source.media_type: must be one of {', '.join(MEDIA_TYPES.values())}",
                                 param=f"{where}.source.media_type")
        return budget.base64(source.get("data"), f"{where}.source.data", media_type=media_type)
    if kind == "url":
        return budget.url(source.get("url"), f"{where}.source.url")
    raise InvalidRequest(f"{where}.source.type: must be 'base64' or 'url'", param=f"{where}.source.type")


def _tool_result(block: dict, where: str) -> dict:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise InvalidRequest(f"{where}.tool_use_id: Field required (a string)", param=f"{where}.tool_use_id")
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        text = _text_blocks(content, f"{where}.content")
    else:
        raise InvalidRequest(f"{where}.content: must be a string or a list of text blocks", param=f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidRequest(f"{where}.is_error: must be true or false", param=f"{where}.is_error")
    # chat templates have no field for a failed call: the model reads it in the text
    return {"role": "tool", "tool_call_id": tool_use_id, "content": f"Error: {text}" if is_error else text}


def _assistant(blocks: list[dict], where: str) -> dict:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, f"{where}.{j}"))
        elif kind == "tool_use":
            calls.append(_tool_call(block, f"{where}.{j}"))
        elif kind not in DROPPED_BLOCKS:
            raise _unsupported(block, f"{where}.{j}", "text and tool_use blocks in assistant turns")
    message = {"role": "assistant", "content": "\n\n".join(t for t in texts if t)}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: dict, where: str) -> dict:
    for name in ("id", "name"):
        if not isinstance(block.get(name), str) or not block[name]:
            raise InvalidRequest(f"{where}.{name}: Field required (a string)", param=f"{where}.{name}")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{where}.input: must be an object", param=f"{where}.input")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(arguments)}}


# ---- tools ---------------------------------------------------------------------------------------

def tool_fields(tools, tool_choice) -> dict:
    """CompletionSpec's `tools`, `tool_choice`, `parallel_tool_calls` (none of them when the request
    has neither tools nor a tool_choice)."""
    if tools is None and tool_choice is None:
        return {}
    functions = openai_tools(tools)
    choice, parallel = openai_tool_choice(tool_choice, {f["function"]["name"] for f in functions})
    return {"tools": functions, "tool_choice": choice, "parallel_tool_calls": parallel}


def openai_tools(tools) -> tuple[dict, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be a list", param="tools")
    check_count(tools, "tools", get_settings().max_tools, where="tools:")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        if tool.get("type", "custom") != "custom":
            raise InvalidRequest(f"{where}.type: {tool['type']!r} is one of Anthropic's server tools, which this "
                             "server does not run; send custom tools (name, description, input_schema)",
                             param=f"{where}.type")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise InvalidRequest(f"{where}.name: must match {TOOL_NAME.pattern}", param=f"{where}.name")
        if name in seen:
            raise InvalidRequest(f"{where}.name: tool names must be unique; {name!r} repeats", param=f"{where}.name")
        seen.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise InvalidRequest(f"{where}.input_schema: must be a JSON schema object with type 'object'",
                             param=f"{where}.input_schema")
        function = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise InvalidRequest(f"{where}.description: must be a string", param=f"{where}.description")
            function["description"] = description
        out.append({"type": "function", "function": function})
    return tuple(out)


def openai_tool_choice(choice, names: set[str]) -> tuple[object, bool]:
    """Anthropic's tool_choice -> (OpenAI's tool_choice, parallel_tool_calls)."""
    if choice is None:
        return "auto", True
    if not isinstance(choice, dict):
        raise InvalidRequest("tool_choice: must be an object with a 'type'", param="tool_choice")
    parallel = not flag(choice, "disable_parallel_tool_use", default=False)
    kind = choice.get("type")
    if kind in ("any", "tool") and not names:
        raise InvalidRequest(f"tool_choice.type: {kind!r} needs 'tools'", param="tool_choice.type")
    if kind == "auto":
        return "auto", parallel
    if kind == "none":
        return "none", parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        name = choice.get("name")
        if name not in names:
            raise InvalidRequest(f"tool_choice.name: must name one of the tools; got {name!r}",
                                 param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise InvalidRequest("tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'", param="tool_choice.type")

"""A POST /v1/responses body -> a ResponsesRequest: the checked conversation input, the fields the
serving door's CompletionSpec takes, and the fields the response object echoes. Errors are 400s in
OpenAI's envelope naming the field as the Responses API names it (`text.format`, `tools[0].name`).

What maps where: `instructions` -> a system message first (not carried to the next turn, as OpenAI's),
`max_output_tokens` -> max_tokens, `temperature`, `top_p`; `tools` (function tools, flat:
`{"type": "function", "name", "description", "parameters", "strict"}`), `tool_choice`,
`parallel_tool_calls` -> the chat route's tool request; `text.format` -> constrained decoding. The
server's own extensions are read as on the chat route: `keep_alive`, `cache_prompt`, `seed` and the
KV fields. Hosted tools the server would have to run (`web_search`, `file_search`, `code_interpreter`,
`image_generation`, `computer_use_preview`, `mcp`) are left out of what the model sees: Codex sends
`web_search` on every turn. A `namespace` tool's functions are offered under their own names, and a
call of one names its namespace. Refused: `background: true`, `conversation`, `prompt`, tools the
client runs in other shapes (`custom`, `local_shell`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...conf import get_settings
from ...errors import InvalidRequest
from ...serving.constraints import UnsupportedSchema, json_object, json_schema
from ...serving.images import Image
from ...serving.specs import CompletionSpec
from ...tools.request import parse_tool_request
from ..fields import check_count, flag, integer, keep_alive, kv_fields, number
from .items import input_items, messages

TRUNCATIONS = ("disabled", "auto")
FORMATS = ("text", "json_object", "json_schema")
MAX_METADATA = 16                 # OpenAI's limits on `metadata`
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
REFUSED = {"background": "background responses", "conversation": "conversations", "prompt": "prompt templates"}
HOSTED = ("web_search", "file_search", "code_interpreter", "image_generation", "computer_use", "mcp")


@dataclass(frozen=True)
class ResponsesRequest:
    model: str
    input: list[dict]                          # this request's items, checked, as given
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    namespaces: dict[str, str] = field(default_factory=dict)   # a namespace tool's function -> its namespace
    owner: str = ""                            # the API key's name: whose stored responses it reads and writes
    truncation: str = "disabled"
    spec_fields: dict[str, Any] = field(default_factory=dict)   # CompletionSpec's, all but messages
    echo: dict[str, Any] = field(default_factory=dict)          # the response object's request fields
    images: dict[str, Image] = field(default_factory=dict)      # the conversation's images by data URL

    def spec(self, conversation: list[dict]) -> CompletionSpec:
        """The door's request for this conversation (earlier items, then this input)."""
        chat = messages(conversation, self.images)
        if self.instructions:
            chat = [{"role": "system", "content": self.instructions}, *chat]
        return CompletionSpec(model=self.model, messages=chat, **self.spec_fields)


def _string(body, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", param=name)
    return value


def _metadata(body) -> dict | None:
    value = body.get("metadata")
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise InvalidRequest(f"'metadata' must be an object of at most {MAX_METADATA} keys", param="metadata")
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(text, str) or len(text) > MAX_METADATA_VALUE:
            raise InvalidRequest(f"'metadata' keys are at most {MAX_METADATA_KEY} characters and values strings of "
                                 f"at most {MAX_METADATA_VALUE}", param="metadata")
    return value


def _function(tool, where: str) -> dict:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    if tool.get("type") != "function":
        raise InvalidRequest(f"{where}.type must be 'function' ({tool.get('type')!r} tools are not run here)",
                             param=f"{where}.type")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _function_tools(value) -> tuple[list[dict], dict[str, str]]:
    """Responses' flat function tools -> the chat route's `{"type": "function", "function": {...}}`,
    and which namespace each namespaced function came from."""
    if value is None:
        return [], {}
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be a list of function tools", param="tools")
    check_count(value, "tools", get_settings().max_tools)
    out, namespaces = [], {}
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind.startswith(HOSTED):
            continue
        if kind == "namespace" and isinstance(tool.get("name"), str):
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise InvalidRequest(f"{where}.tools must be a list of function tools", param=f"{where}.tools")
            for j, function in enumerate(inner):
                out.append(_function(function, f"{where}.tools[{j}]"))
                namespaces[str(function.get("name"))] = tool["name"]
            continue
        out.append(_function(tool, where))
    check_count(out, "tools", get_settings().max_tools)
    return out, namespaces


def _tool_choice(value):
    """Responses' tool_choice -> the chat route's (`{"type": "function", "name"}` nests the name)."""
    if isinstance(value, dict) and value.get("type") == "function" and "function" not in value:
        return {"type": "function", "function": {"name": value.get("name")}}
    if isinstance(value, dict) and value.get("type") in ("allowed_tools", "mcp", "custom"):
        raise InvalidRequest(f"'tool_choice' of type {value['type']!r} is not supported", param="tool_choice")
    return value


def _tools(body, functions: list[dict]) -> dict:
    chat_body = {"tools": functions, "tool_choice": _tool_choice(body.get("tool_choice")),
                 "parallel_tool_calls": body.get("parallel_tool_calls")}
    try:
        request = parse_tool_request(chat_body)
    except InvalidRequest as e:
        param = (e.param or "").replace(".function.", ".").replace(".function", "")
        raise InvalidRequest(str(e).replace(".function.", ".").replace(".function", ""), param=param) from None
    if request is None:
        return {}
    return {"tools": request.tools, "tool_choice": request.tool_choice,
            "parallel_tool_calls": request.parallel_tool_calls}


def text_format(body):
    """`text.format` -> (the constraint, the format to echo). `{"type": "json_schema", "name",
    "schema", "strict"}` is flat in the Responses API."""
    text = body.get("text")
    if text is None:
        return None, {"type": "text"}
    if not isinstance(text, dict):
        raise InvalidRequest("'text' must be an object with a 'format'", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None, {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMATS:
        raise InvalidRequest(f"'text.format.type' must be one of {', '.join(FORMATS)}", param="text.format")
    if fmt["type"] == "text":
        return None, fmt
    if fmt["type"] == "json_object":
        return json_object(), fmt
    name, strict, schema = fmt.get("name"), fmt.get("strict"), fmt.get("schema")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("'text.format.name' is required and must be a string", param="text.format.name")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("'text.format.strict' must be true or false", param="text.format.strict")
    if not isinstance(schema, dict):
        raise InvalidRequest("'text.format.schema' must be a JSON schema object", param="text.format.schema")
    try:
        return json_schema(schema, strict), fmt
    except UnsupportedSchema as e:
        raise InvalidRequest(f"'text.format.schema' cannot be enforced: {e.feature}", param="text.format.schema",
                             code="unsupported_schema") from None


def _refused(body) -> None:
    for name, what in REFUSED.items():
        if body.get(name) not in (None, False):
            raise InvalidRequest(f"'{name}': {what} are not supported by this server", param=name)


def parse_responses(body: dict) -> ResponsesRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    _refused(body)
    if "input" not in body:
        raise InvalidRequest("'input' is required", param="input")
    images: dict[str, Image] = {}
    items = input_items(body.get("input"), images)
    instructions = _string(body, "instructions")
    previous = _string(body, "previous_response_id")
    truncation = body.get("truncation") or "disabled"
    if truncation not in TRUNCATIONS:
        raise InvalidRequest("'truncation' must be 'auto' or 'disabled'", param="truncation")
    constraint, fmt = text_format(body)
    functions, namespaces = _function_tools(body.get("tools"))
    tools = _tools(body, functions)
    max_tokens = integer(body, "max_output_tokens", minimum=1)
    temperature = number(body, "temperature", 0, 2)
    top_p = number(body, "top_p", 0, 1, lo_open=True)
    spec_fields = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                       seed=integer(body, "seed", minimum=0, maximum=2**64 - 1), keep_alive=keep_alive(body),
                       cache_prompt=flag(body, "cache_prompt", default=True), kv=kv_fields(body),
                       constraint=constraint, **tools)
    store = flag(body, "store", default=True)
    echo = {"instructions": instructions, "max_output_tokens": max_tokens, "metadata": _metadata(body) or {},
            "parallel_tool_calls": tools.get("parallel_tool_calls", flag(body, "parallel_tool_calls", default=True)
                                             if body.get("parallel_tool_calls") is not None else True),
            "previous_response_id": previous, "store": store, "temperature": temperature,
            "text": {"format": fmt}, "tool_choice": body.get("tool_choice") or "auto",
            "tools": [_echo_tool(t, namespaces) for t in tools.get("tools", ())], "top_p": top_p,
            "truncation": truncation,
            "user": _string(body, "user")}
    return ResponsesRequest(model=model, input=items, instructions=instructions, previous_response_id=previous,
                            store=store, stream=flag(body, "stream", default=False), truncation=truncation,
                            namespaces=namespaces, spec_fields=spec_fields, echo=echo, images=images)


def _echo_tool(tool: dict, namespaces: dict[str, str]) -> dict:
    function = tool["function"]
    echoed = {"type": "function", "name": function["name"], "description": function.get("description"),
              "parameters": function["parameters"], "strict": function.get("strict", False)}
    return {**echoed, "namespace": namespaces[function["name"]]} if function["name"] in namespaces else echoed

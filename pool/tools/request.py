"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request -> a validated ToolRequest.
Errors are InvalidRequest naming the field, as OpenAI's API names it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")     # OpenAI's rule for a function name
CHOICES = ("auto", "none", "required")
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolRequest:
    """tools: OpenAI function-tool dicts (a missing `parameters` filled in as an empty object schema);
    tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}."""
    tools: tuple[dict, ...]
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def shown(self) -> bool:
        """The model sees the tools and its answer is parsed for calls (not with tool_choice "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced_name(self) -> str | None:
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    @property
    def forces_call(self) -> bool:
        """The answer must be a call ("required" or a named function): constrained decoding's job."""
        return self.shown and (self.tool_choice == "required" or self.forced_name is not None)


def parse_tool_request(body: dict) -> ToolRequest | None:
    """None when the body gives no tools (an empty list included)."""
    tools = _tools(body.get("tools"))
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise InvalidRequest("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    choice = _tool_choice(body.get("tool_choice"), tools)
    if not tools:
        return None
    return ToolRequest(tools=tools, tool_choice=choice, parallel_tool_calls=parallel)


def _tools(value) -> tuple[dict, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be a list of function tools", param="tools")
    seen, clean = set(), []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where} must be an object", param=where)
        if tool.get("type") != "function":
            raise InvalidRequest(f"{where}.type must be 'function' (the only tool type this server runs)",
                             param=f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequest(f"{where}.function must be an object", param=f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidRequest(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'",
                             param=f"{where}.function.name")
        if name in seen:
            raise InvalidRequest(f"{where}.function.name: '{name}' is given twice", param=f"{where}.function.name")
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidRequest(f"{where}.function.description must be a string",
                             param=f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = dict(NO_PARAMETERS)
        elif not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise InvalidRequest(f"{where}.function.parameters must be a JSON schema of type 'object'",
                             param=f"{where}.function.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest(f"{where}.function.strict must be true or false", param=f"{where}.function.strict")
        clean.append({"type": "function", "function": {**function, "parameters": parameters}})
    return tuple(clean)


def _tool_choice(value, tools: tuple[dict, ...]):
    if value is None:
        return "auto"
    names = {t["function"]["name"] for t in tools}
    if isinstance(value, str):
        if value not in CHOICES:
            raise InvalidRequest(f"'tool_choice' must be one of {', '.join(CHOICES)} or a named function; "
                             f"got '{value}'", param="tool_choice")
        if value == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs 'tools'", param="tool_choice")
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest("'tool_choice' must name a function: {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}", param="tool_choice")
        if name not in names:
            raise InvalidRequest(f"'tool_choice' names '{name}', which is not in 'tools'", param="tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise InvalidRequest("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}", param="tool_choice")

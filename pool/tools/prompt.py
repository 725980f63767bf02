"""Chat messages (with OpenAI tool-call history) -> what the chat template renders.

Native format: the tools go to the template (`tools=`), assistant `tool_calls` keep their shape with
arguments decoded to dicts (HF templates expect dicts) and `role: "tool"` messages stay.
Fallback format: a system message of ours describes the tools and the call format; assistant calls
become assistant text in that format and tool results a user message of <tool_response> blocks."""

from __future__ import annotations

import json

from ..errors import InvalidRequest
from .formats import ToolFormat, fallback_call_text
from .request import ToolRequest

RESPONSE_START, RESPONSE_END = "<tool_response>", "</tool_response>"


def prepare_messages(messages: list[dict], tool_request: ToolRequest | None,
                     fmt: ToolFormat) -> tuple[list[dict], list[dict] | None]:
    """(messages for the template, tools for its `tools=` or None). The input is not changed."""
    shown = tool_request is not None and tool_request.shown
    if fmt.native:
        return _native_history(messages), (list(tool_request.tools) if shown else None)
    history = _fallback_history(messages)
    if shown:
        history = _with_instructions(history, fallback_instructions(tool_request), fmt.system_role)
    return history, None


def fallback_instructions(tool_request: ToolRequest) -> str:
    """The system text that shows a model without tool support the tools and how to call them."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tool_request.tools)
    example = fallback_call_text("<function name>", {"<argument>": "<value>"})
    lines = ["# Tools", "",
             "You may call functions to help with the user's request. The functions are described by "
             "JSON schemas, one per line, inside <tools></tools>:",
             "<tools>", listing, "</tools>", "",
             "To call a function, answer with a JSON object holding its name and its arguments inside "
             "<tool_call></tool_call> tags, exactly like this:", example]
    if tool_request.parallel_tool_calls:
        lines.append("To call several functions, write one <tool_call></tool_call> block for each.")
    else:
        lines.append("Call at most one function per answer.")
    if tool_request.forced_name:
        lines.append(f"You must call the function '{tool_request.forced_name}' now.")
    elif tool_request.tool_choice == "required":
        lines.append("You must call at least one function now.")
    lines.append(f"Function results come back in a user message inside {RESPONSE_START}{RESPONSE_END} tags.")
    return "\n".join(lines)


def _with_instructions(messages: list[dict], text: str, system_role: bool) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        merged = f"{first['content']}\n\n{text}" if first["content"] else text
        return [{**first, "content": merged}, *messages[1:]]
    if system_role:
        return [{"role": "system", "content": text}, *messages]
    # A template without a system role (Gemma's raises on one): the first user turn carries it
    for i, m in enumerate(messages):
        if m["role"] == "user":
            return [*messages[:i], {**m, "content": f"{text}\n\n{m['content']}"}, *messages[i + 1:]]
    return [{"role": "user", "content": text}, *messages]


def _native_history(messages: list[dict]) -> list[dict]:
    names: dict[str, str] = {}      # tool_call_id -> function name, for templates that show it
    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = _calls(m, i)
            names.update((c["id"], c["function"]["name"]) for c in calls if c.get("id"))
            out.append({**m, "content": _text(m, i), "tool_calls": calls})
        elif role == "tool":
            message = {**m, "content": _text(m, i)}
            name = names.get(m.get("tool_call_id"))
            if name and not m.get("name"):
                message["name"] = name
            out.append(message)
        else:
            out.append(m)
    return out


def _fallback_history(messages: list[dict]) -> list[dict]:
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            blocks = [fallback_call_text(c["function"]["name"], c["function"]["arguments"]) for c in _calls(m, i)]
            out.append({"role": "assistant", "content": "\n".join(filter(None, [_text(m, i), *blocks]))})
        elif role == "tool":
            block = f"{RESPONSE_START}\n{_text(m, i)}\n{RESPONSE_END}"
            if out and out[-1].get("_tool_results"):   # consecutive results: one user turn
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{block}"}
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(m)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]


def _text(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise InvalidRequest(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
    return content


def _calls(message: dict, i: int) -> list[dict]:
    """An assistant message's `tool_calls`, checked, with arguments as dicts."""
    calls = message["tool_calls"]
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where} must be a list", param=where)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{where}[{j}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                             f"\"arguments\"}}}}", param=f"{where}[{j}]")
        arguments = function.get("arguments")
        if arguments is None or arguments == "":
            arguments = {}
        elif isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"{where}[{j}].function.arguments must be a JSON object (as a string)",
                             param=f"{where}[{j}].function.arguments")
        out.append({**call, "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out

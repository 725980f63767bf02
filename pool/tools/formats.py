"""Which tool-call format a model gets: its own, when mlx-lm knows a parser for it and its chat
template renders `tools`, else the server's fallback format (described in a system message of our
own and parsed with mlx-lm's json_tools parser)."""

from __future__ import annotations

import importlib
import json
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable

FALLBACK_PARSER = "json_tools"     # mlx_lm/tool_parsers/json_tools.py: <tool_call>{json}</tool_call>

_PROBE_TOOL = {"type": "function", "function": {
    "name": "omlx_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}
_PROBE_SYSTEM = "omlx probe system text"


@dataclass(frozen=True)
class ToolFormat:
    """How calls look in a model's output: text between `start` and `end` (end "" = to the end of
    the answer), turned into {"name", "arguments"} dict(s) by an mlx-lm tool parser: `parse`, or
    the module `mlx_lm.tool_parsers.<parser_name>` (imported at the first call)."""
    native: bool
    parser_name: str
    start: str
    end: str
    parse: Callable[[str, Any], Any] | None = field(default=None, compare=False, repr=False)
    system_role: bool = True   # the chat template renders a system message (else we use the first user turn)

    def parse_call(self, text: str, tools: Any) -> Any:
        parse = self.parse or importlib.import_module(f"mlx_lm.tool_parsers.{self.parser_name}").parse_tool_call
        return parse(text, tools)

    @property
    def writes_fallback_calls(self) -> bool:
        """Calls in this format are written as the fallback's (what the tool-call constraint produces)."""
        return (self.parser_name, self.start, self.end) == (FALLBACK_PARSER, FALLBACK.start, FALLBACK.end)


def parser_format(name: str, *, native: bool = True) -> ToolFormat:
    """The format of mlx-lm's parser module `mlx_lm.tool_parsers.<name>` (its markers and parser)."""
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolFormat(native=native, parser_name=name, start=module.tool_call_start,
                      end=module.tool_call_end, parse=module.parse_tool_call)


# json_tools' own markers (a test checks they are): known without importing mlx-lm, so the routes
# that validate a request's tool history import no MLX
FALLBACK = ToolFormat(native=False, parser_name=FALLBACK_PARSER, start="<tool_call>", end="</tool_call>")

_cache: "weakref.WeakKeyDictionary[Any, ToolFormat]" = weakref.WeakKeyDictionary()


def tool_format(tokenizer) -> ToolFormat:
    """The format for a loaded mlx-lm TokenizerWrapper (remembered per tokenizer: it renders the
    template twice to find out)."""
    try:
        return _cache[tokenizer]
    except (KeyError, TypeError):
        pass
    fmt = _detect(tokenizer)
    try:
        _cache[tokenizer] = fmt
    except TypeError:
        pass
    return fmt


def _detect(tokenizer) -> ToolFormat:
    templated = bool(getattr(tokenizer, "has_chat_template", False))
    system_role = not templated or _renders_system(tokenizer)
    if templated and getattr(tokenizer, "has_tool_calling", False) and _renders_tools(tokenizer):
        parser = tokenizer.tool_parser
        name = (getattr(tokenizer, "init_kwargs", None) or {}).get("tool_parser_type") \
            or parser.__module__.rsplit(".", 1)[-1]
        return ToolFormat(native=True, parser_name=name, start=tokenizer.tool_call_start,
                          end=tokenizer.tool_call_end or "", parse=parser, system_role=system_role)
    return replace(FALLBACK, system_role=system_role)


def _render(tokenizer, messages, **kw) -> str:
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
    except Exception:  # noqa: BLE001 - a template that raises on the probe does not support it
        return ""
    return text if isinstance(text, str) else ""


def _renders_tools(tokenizer) -> bool:
    # mlx-lm may know a parser from the vocabulary alone; the template must also show the tools
    text = _render(tokenizer, [{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL])
    return _PROBE_TOOL["function"]["name"] in text


def _renders_system(tokenizer) -> bool:
    text = _render(tokenizer, [{"role": "system", "content": _PROBE_SYSTEM}, {"role": "user", "content": "hi"}])
    return _PROBE_SYSTEM in text


def fallback_call_text(name: str, arguments: dict) -> str:
    """One call in the fallback format, exactly as the fallback system message shows it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{FALLBACK.start}\n{body}\n{FALLBACK.end}"


def request_format(fmt: ToolFormat, tool_request) -> ToolFormat:
    """The format one request uses. A forced call (tool_choice "required" or a named function) is
    constrained to the fallback's syntax, so a model whose own syntax differs is prompted and parsed
    in the fallback format for that request; otherwise the model's format."""
    if tool_request is not None and tool_request.forces_call and not fmt.writes_fallback_calls:
        return replace(FALLBACK, system_role=fmt.system_role)
    return fmt

"""Tool calling over plain data: which format a model writes calls in (`tool_format`), the request's
tools (`parse_tool_request`), the messages its chat template renders (`prepare_messages`) and the
calls in its answer (`split_tool_calls`, `ToolStream`). Parsing is mlx-lm's own."""

from .calls import Delta, ToolCall, ToolStream, finish_reason, split_tool_calls
from .formats import FALLBACK, ToolFormat, fallback_call_text, request_format, tool_format
from .prompt import fallback_instructions, prepare_messages
from .request import ToolRequest, parse_tool_request

__all__ = ["FALLBACK", "Delta", "ToolCall", "ToolFormat", "ToolRequest", "ToolStream", "fallback_call_text",
           "fallback_instructions", "finish_reason", "parse_tool_request", "prepare_messages",
           "request_format", "split_tool_calls", "tool_format"]

"""Request bodies of OpenAI's chat and completion routes -> the serving door's CompletionSpec. Errors
name the field. The documented limits on counts and lengths (OMLX_MAX_MESSAGES, OMLX_MAX_TOOLS,
OMLX_MAX_STOP_LENGTH) are checked here, before any model is touched."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ...conf import get_settings
from ...errors import InvalidRequest
from ...serving.images import Image, ImageBudget, parts
from ...serving.specs import CompletionSpec
from ...tools.formats import FALLBACK
from ...tools.prompt import prepare_messages
from ...tools.request import parse_tool_request
from ..fields import check_count, flag, image_budget, integer, keep_alive, kv_fields, number, stop_strings
from .structured import parse_response_format

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_CHOICES = 8              # `n`: each choice holds its own copy of the prompt's KV
MAX_TOP_LOGPROBS = 20        # chat's `top_logprobs` (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions' `logprobs` (OpenAI's limit)
MAX_LOGIT_BIAS = 300         # entries in `logit_bias` (OpenAI's limit)
MAX_STOP = 4                 # stop strings (OpenAI's limit)
DETAILS = ("auto", "low", "high")   # an image_url's `detail`: accepted; the model's processor sizes images
_TOKEN_ID = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class CompletionRequest:
    """What the serving door needs (`spec`), and how the route frames the answer."""
    spec: CompletionSpec
    stream: bool = False
    include_usage: bool = False


def _content(message: dict, i: int, images: ImageBudget) -> str | list[dict]:
    """A message's content: a string, or text and image parts (images.parts)."""
    content = message.get("content")
    where = f"messages[{i}].content"
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str | Image] = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif kind == "image_url" and message.get("role") == "user":
                pieces.append(_image(part, f"{where}[{j}]", images))
            else:
                raise InvalidRequest(f"{where}[{j}]: only text parts" + (", and image_url parts in user messages,"
                                     if kind == "image_url" else " and image_url parts") + " are supported",
                                     param=f"{where}[{j}]")
        return parts(pieces)
    raise InvalidRequest(f"{where} must be a string or a list of text and image_url parts", param=where)


def _image(part: dict, where: str, images: ImageBudget) -> Image:
    """`{"type": "image_url", "image_url": {"url", "detail"}}` (or the URL as a plain string)."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if isinstance(value, dict) and value.get("detail", "auto") not in DETAILS:
        raise InvalidRequest(f"{where}.image_url.detail must be one of {', '.join(DETAILS)}",
                             param=f"{where}.image_url.detail")
    return images.url(url, f"{where}.image_url.url" if isinstance(value, dict) else f"{where}.image_url")


def _messages(body) -> list[dict]:
    messages = body.get("messages")
    images = image_budget()
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    check_count(messages, "messages", get_settings().max_messages)
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}",
                             param=f"messages[{i}].role")
        message = {"role": "system" if role == "developer" else role, "content": _content(m, i, images)}
        if role == "assistant" and m.get("tool_calls") is not None:
            message["tool_calls"] = _history_tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        if role == "tool" and m.get("tool_call_id") is not None:
            if not isinstance(m["tool_call_id"], str):
                raise InvalidRequest(f"messages[{i}].tool_call_id must be a string",
                                     param=f"messages[{i}].tool_call_id")
            message["tool_call_id"] = m["tool_call_id"]
        clean.append(message)
    return clean


def _chat_messages(body) -> list[dict]:
    messages = _messages(body)
    if any("tool_calls" in m or m["role"] == "tool" for m in messages):
        prepare_messages(messages, None, FALLBACK)   # tool history it cannot render: a 400 before any load
    return messages


def _history_tool_calls(calls, where: str) -> list[dict]:
    """An assistant turn's earlier calls, in OpenAI's shape: [{"id", "type": "function",
    "function": {"name", "arguments": a JSON string}}]."""
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where} must be a list", param=where)
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments", ""), str) or not isinstance(call.get("id", ""), str):
            raise InvalidRequest(f"{where}[{j}] must be {{\"id\", \"type\": \"function\", \"function\": "
                             f"{{\"name\", \"arguments\"}}}} with string values", param=f"{where}[{j}]")
    return calls


def _prompt(body) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("'prompt' must be a non-empty string", param="prompt")
    return prompt


def _positive(body, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"'{name}' must be a finite number > 0", param=name)
    return float(value)


def _chat_tools(body) -> dict:
    """`tools`, `tool_choice`, `parallel_tool_calls` (checked by pool.tools) and `response_format`."""
    check_count(body.get("tools"), "tools", get_settings().max_tools)
    tools = parse_tool_request(body)
    fields = {"tools": tools.tools, "tool_choice": tools.tool_choice,
              "parallel_tool_calls": tools.parallel_tool_calls} if tools is not None else {}
    return {**fields, "constraint": _response_format(body)}


def _logprobs(body, *, chat: bool) -> int | None:
    """How many top tokens each token's logprobs carry, or None when the request asked for none.
    Chat: `logprobs` true/false and `top_logprobs` 0..20; completions: `logprobs` 0..5."""
    if not chat:
        return integer(body, "logprobs", minimum=0, maximum=MAX_COMPLETION_LOGPROBS)
    wanted = body.get("logprobs") is not None and flag(body, "logprobs", default=False)
    top = integer(body, "top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def _logit_bias(body) -> tuple[tuple[int, float], ...]:
    """{"token id": bias -100..100} -> ((id, bias), ...), by token id."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} token ids",
                         param="logit_bias")
    out = []
    for key, bias in value.items():
        if not _TOKEN_ID.fullmatch(key):
            raise InvalidRequest(f"'logit_bias' keys must be token ids (\"1234\"); got {key!r}", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise InvalidRequest(f"'logit_bias' values must be numbers from -100 to 100; got {bias!r} for {key}",
                             param="logit_bias")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def _response_format(body):
    """The constraint `response_format` asks for, or None (structured.py)."""
    value = body.get("response_format")
    return parse_response_format(value) if value is not None else None


def parse_completion(body: dict, *, chat: bool) -> CompletionRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    n = integer(body, "n", minimum=1, maximum=MAX_CHOICES)
    stream = flag(body, "stream", default=False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    max_tokens = integer(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", minimum=1)
    spec = CompletionSpec(
        model=model,
        messages=_chat_messages(body) if chat else None,
        prompt=None if chat else _prompt(body),
        max_tokens=max_tokens,
        temperature=number(body, "temperature", 0, 2),
        top_p=number(body, "top_p", 0, 1, lo_open=True),
        stop=stop_strings(body.get("stop"), name="stop", where="'stop':", max_count=MAX_STOP),
        seed=integer(body, "seed", minimum=0, maximum=2**64 - 1),   # MLX's generator takes a uint64
        keep_alive=keep_alive(body),
        cache_prompt=flag(body, "cache_prompt", default=True),
        kv=kv_fields(body),
        n=n or 1,
        logprobs=_logprobs(body, chat=chat),
        logit_bias=_logit_bias(body),
        presence_penalty=number(body, "presence_penalty", -2, 2) or 0.0,
        frequency_penalty=number(body, "frequency_penalty", -2, 2) or 0.0,
        repetition_penalty=_positive(body, "repetition_penalty"),
        **(_chat_tools(body) if chat else {}),
    )
    return CompletionRequest(spec=spec, stream=stream, include_usage=flag(options, "include_usage", default=False))

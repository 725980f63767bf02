"""Request bodies of the OpenAI routes -> plain, validated values. Errors name the field."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from ..conf import parse_duration
from ..errors import BadRequest
from ..policy import kv
from ..serving import CompletionSpec
from ..strict_json import loads_strict

ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(frozen=True)
class CompletionRequest:
    """What the serving door needs (`spec`), and how the route frames the answer."""
    spec: CompletionSpec
    stream: bool = False
    include_usage: bool = False


def json_body(request) -> dict:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadRequest(f"The body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 2**20} MiB.") from None
    try:
        body = loads_strict(raw or b"")
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"The body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    return body


def _number(body, name, lo, hi, *, lo_open=False):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{name}' must be a number", param=name)
    if value < lo or value > hi or (lo_open and value == lo):
        raise BadRequest(f"'{name}' must be {'>' if lo_open else '>='} {lo} and <= {hi}; got {value}", param=name)
    return float(value)


def _int(body, name, *, minimum, maximum=2**63 - 1):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if not minimum <= value <= maximum:
        raise BadRequest(f"'{name}' must be between {minimum} and {maximum}", param=name)
    return value


def _flag(body, name: str, *, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", param=name)
    return value


def _stop(body) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and len(value) <= 4 and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise BadRequest("'stop' must be a string or a list of at most 4 strings", param="stop")


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"messages[{i}].content: only text parts are supported",
                                 param=f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts",
                     param=f"messages[{i}].content")


def _messages(body) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}",
                             param=f"messages[{i}].role")
        clean.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return clean


def _prompt(body) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string", param="prompt")
    return prompt


def _keep_alive(body) -> float | None:
    value = body.get("keep_alive")
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise BadRequest("'keep_alive' must be seconds or a duration like \"5m\" (0 = unload after this "
                         "request, -1 = keep loaded)", param="keep_alive") from None
    return -1.0 if seconds < 0 else seconds


def _kv_fields(body) -> dict:
    """The KV limits the body gives (their combination with the model's defaults is checked later)."""
    given = {name: body[name] for name in kv.FIELDS if body.get(name) is not None}
    for name, value in given.items():
        problem = kv.field_problem(name, value)
        if problem:
            raise BadRequest(f"'{name}' {problem}", param=name)
    return given


def parse_completion(body: dict, *, chat: bool) -> CompletionRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string", param="model")
    n = body.get("n", 1)
    if isinstance(n, bool) or n != 1:
        raise BadRequest("only n=1 is supported", param="n")
    stream = _flag(body, "stream", default=False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    max_tokens = _int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", minimum=1)
    spec = CompletionSpec(
        model=model,
        messages=_messages(body) if chat else None,
        prompt=None if chat else _prompt(body),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1, lo_open=True),
        stop=_stop(body),
        seed=_int(body, "seed", minimum=0, maximum=2**64 - 1),   # MLX's generator takes a uint64
        keep_alive=_keep_alive(body),
        cache_prompt=_flag(body, "cache_prompt", default=True),
        kv=_kv_fields(body),
    )
    return CompletionRequest(spec=spec, stream=stream, include_usage=_flag(options, "include_usage", default=False))

"""The fuzz tests' verdict on one answer (tests/api/test_fuzz.py; tested in test_fuzz_verdict.py): a 200 or a
4xx in the route's error envelope (OpenAI's, or Anthropic's on /v1/messages*), as strict JSON, and an event
stream that ends and carries no internal error."""

from __future__ import annotations

from pool.strict_json import loads_strict

OPENAI, ANTHROPIC = "openai", "anthropic"


def envelope_problem(style: str, body) -> str | None:
    """Why a 4xx body is not the route's error envelope, or None."""
    if style == ANTHROPIC:
        ok = (isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict)
              and isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str))
    else:
        error = body.get("error") if isinstance(body, dict) else None
        ok = (isinstance(error, dict) and isinstance(error.get("message"), str)
              and {"type", "param", "code"} <= set(error))
    return None if ok else f"not the {style} error envelope: {str(body)[:300]}"


def sse_problem(style: str, text: str) -> str | None:
    """Why an event stream is broken: a data line that is not strict JSON, an internal error, or no end."""
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    for item in data:
        if item == "[DONE]":
            continue
        try:
            event = loads_strict(item)
        except ValueError as e:
            return f"a data line is not strict JSON ({e}): {item[:200]}"
        error = event.get("error") if isinstance(event, dict) else None
        if isinstance(error, dict) and (error.get("code") == "internal_error" or error.get("type") == "api_error"):
            return f"the stream ended with an internal error: {item[:300]}"
    ended = data and (data[-1] == "[DONE]" if style == OPENAI
                      else ('"message_stop"' in data[-1] or '"error"' in data[-1]))
    return None if ended else f"the stream did not end: {text[-300:]!r}"


def answer_problem(style: str, status: int, content_type: str, raw: bytes) -> str | None:
    """Why an answer breaks the rules (a 200 or a 4xx in the route's envelope, strict JSON), or None."""
    if not (status == 200 or 400 <= status < 500):
        return f"status {status}: {raw[:400]!r}"
    text = raw.decode("utf-8", errors="replace")
    if content_type.startswith("text/event-stream"):
        return sse_problem(style, text) if status == 200 else f"an event stream with status {status}"
    try:
        body = loads_strict(text)
    except ValueError as e:
        return f"status {status} with a body that is not strict JSON ({e}): {text[:300]}"
    return envelope_problem(style, body) if status >= 400 else None

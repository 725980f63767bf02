"""The fuzz tests' verdict on one answer (tests/api/test_fuzz.py; tested in test_fuzz_verdict.py): a 200 or a
4xx in the route's error envelope (OpenAI's, Anthropic's on /v1/messages*, Ollama's on /api/*), as strict
JSON, and a stream (SSE, or Ollama's NDJSON) that ends and carries no internal error."""

from __future__ import annotations

from pool.strict_json import loads_strict

OPENAI, ANTHROPIC, OLLAMA, RESPONSES = "openai", "anthropic", "ollama", "responses"


def envelope_problem(style: str, body) -> str | None:
    """Why a 4xx body is not the route's error envelope, or None."""
    if style == OLLAMA:
        ok = isinstance(body, dict) and list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    elif style == ANTHROPIC:
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
        if style == RESPONSES and isinstance(event, dict) and event.get("code") == "internal_error":
            return f"the stream ended with an internal error: {item[:300]}"
    last = data[-1] if data else ""
    ended = {OPENAI: last == "[DONE]", ANTHROPIC: '"message_stop"' in last or '"error"' in last,
             RESPONSES: any(f'"type": "response.{end}"' in last for end in ("completed", "incomplete", "failed"))}
    return None if data and ended[style] else f"the stream did not end: {text[-300:]!r}"


def ndjson_problem(text: str) -> str | None:
    """Why an Ollama NDJSON stream is broken: a line that is not a strict JSON object, an internal error,
    or no last line with `done: true` or an `error`."""
    lines = [line for line in text.split("\n") if line]
    for line in lines:
        try:
            item = loads_strict(line)
        except ValueError as e:
            return f"a line is not strict JSON ({e}): {line[:200]}"
        if not isinstance(item, dict):
            return f"a line is not an object: {line[:200]}"
        if "internal" in str(item.get("error", "")).lower():
            return f"the stream ended with an internal error: {line[:300]}"
    last = loads_strict(lines[-1]) if lines else {}
    return None if last.get("done") is True or "error" in last else f"the stream did not end: {text[-300:]!r}"


def answer_problem(style: str, status: int, content_type: str, raw: bytes) -> str | None:
    """Why an answer breaks the rules (a 200 or a 4xx in the route's envelope, strict JSON), or None."""
    if not (status == 200 or 400 <= status < 500):
        return f"status {status}: {raw[:400]!r}"
    text = raw.decode("utf-8", errors="replace")
    if content_type.startswith("application/x-ndjson"):
        return ndjson_problem(text) if status == 200 else f"an NDJSON stream with status {status}"
    if content_type.startswith("text/event-stream"):
        return sse_problem(style, text) if status == 200 else f"an event stream with status {status}"
    try:
        body = loads_strict(text)
    except ValueError as e:
        return f"status {status} with a body that is not strict JSON ({e}): {text[:300]}"
    return envelope_problem(style, body) if status >= 400 else None

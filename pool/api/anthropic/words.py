"""How Anthropic's Messages API words the core's errors, and its error envelope: {"type": "error",
"error": {"type", "message"}}. An error after a stream began is an `error` event."""

from __future__ import annotations

import json

from ...errors import ContextLengthExceeded, PoolError, WrongKind


def message(error: PoolError) -> str:
    if isinstance(error, ContextLengthExceeded):
        return context_message(error)
    if isinstance(error, WrongKind):
        return (f"'{error.model}' is {error.noun}: /v1/messages needs {error.wanted_noun} (available: "
                f"{', '.join(error.alternatives) or 'none'}).")
    return error.message


def context_message(e: ContextLengthExceeded) -> str:
    """Anthropic's wording (Claude Code reads the numbers of the second and retries with less)."""
    if e.part == e.CHARACTERS:
        return (f"prompt is too long: {e.characters} characters > {e.max_characters} maximum (this model's "
                f"maximum context length is {e.context} tokens, and no prompt of more than {e.max_characters} "
                f"characters ({e.chars_per_token} per token, OMLX_PROMPT_CHARS_PER_TOKEN) can fit it)")
    if e.part == e.PROMPT:
        return f"prompt is too long: {e.prompt_tokens} tokens > {e.context - 1} maximum"
    return (f"input length and `max_tokens` exceed context limit: {e.prompt_tokens} + {e.max_tokens} > "
            f"{e.context}, decrease input length or `max_tokens` and try again")


def envelope(error: PoolError, status: int, kind: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message(error)}}


def stream_error(error: PoolError, status: int, kind: str) -> bytes:
    return f"event: error\ndata: {json.dumps(envelope(error, status, kind))}\n\n".encode()

"""How OpenAI's API words the core's errors, and its error envelope: {"error": {"message", "type",
"param", "code", ...facts}}. An error after a stream began is a `data:` line with the same body."""

from __future__ import annotations

import json

from ...errors import ContextLengthExceeded, PoolError, WrongKind

# The routes that serve each kind of model (pool/catalog/kinds.py), for a request that names the wrong kind.
ROUTES = {"chat": "/v1/chat/completions and /v1/completions", "embeddings": "/v1/embeddings"}


def message(error: PoolError) -> str:
    if isinstance(error, ContextLengthExceeded):
        return context_message(error)
    if isinstance(error, WrongKind):
        serves = ROUTES.get(error.kind, "other routes")
        needs = ROUTES.get(error.wanted, "this route")
        return (f"'{error.model}' is {error.noun}: it serves {serves}, not {needs}, which needs "
                f"{error.wanted_noun} (available: {', '.join(error.alternatives) or 'none'}).")
    return error.message


def context_message(e: ContextLengthExceeded) -> str:
    """OpenAI's wording of context_length_exceeded (clients and proxies match on it)."""
    head = f"This model's maximum context length is {e.context} tokens. However, "
    if e.part == e.CHARACTERS:
        return (f"'{e.prompt_param}' holds {e.characters} characters; this model's maximum context length is "
                f"{e.context} tokens, and no prompt of more than {e.max_characters} characters "
                f"({e.chars_per_token} per token, OMLX_PROMPT_CHARS_PER_TOKEN) can fit it. Please reduce the "
                f"length of the {e.prompt_param}.")
    if e.part == e.PROMPT:
        return (f"{head}your {e.prompt_param} resulted in {e.prompt_tokens} tokens. "
                f"Please reduce the length of the {e.prompt_param}.")
    return (f"{head}you requested {e.prompt_tokens + e.max_tokens} tokens ({e.prompt_tokens} in the "
            f"{e.prompt_param}, {e.max_tokens} in the completion). Please reduce the length of the "
            f"{e.prompt_param} or completion.")


def envelope(error: PoolError, status: int, kind: str) -> dict:
    return {"error": {"message": message(error), "type": kind, "param": error.param, "code": error.code,
                      **error.facts}}


def stream_error(error: PoolError, status: int, kind: str) -> bytes:
    """OpenAI's clients read an error in a stream from a data line; the stream then ends with [DONE]."""
    return f"data: {json.dumps(envelope(error, status, kind))}\n\n".encode()

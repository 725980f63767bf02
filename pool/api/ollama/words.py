"""How Ollama's API words the core's errors, and its error envelope: {"error": "..."} (Ollama's
docs/api/errors.mdx). An error after an NDJSON stream began is one more line of the same shape."""

from __future__ import annotations

import json

from ...errors import ModelNotFound, PoolError, WrongKind

# The routes that serve each kind of model (pool/catalog/kinds.py), for a request that names the wrong kind.
ROUTES = {"chat": "/api/chat and /api/generate", "embeddings": "/api/embed and /api/embeddings"}


def message(error: PoolError) -> str:
    if isinstance(error, ModelNotFound):
        # Ollama's words (`model "x" not found`), which clients match on; no pull: see /api/pull's answer
        return f'model "{error.name}" not found (available: {", ".join(error.available) or "none"})'
    if isinstance(error, WrongKind):
        serves = ROUTES.get(error.kind, "other routes")
        needs = ROUTES.get(error.wanted, "this route")
        return (f'"{error.model}" is {error.noun}: it serves {serves}, not {needs}, which needs '
                f"{error.wanted_noun} (available: {', '.join(error.alternatives) or 'none'})")
    return error.message


def envelope(error: PoolError, status: int, kind: str) -> dict:
    return {"error": message(error)}


def stream_error(error: PoolError, status: int, kind: str) -> bytes:
    """Ollama's clients read an error in a stream from an NDJSON line with an `error` field."""
    return (json.dumps(envelope(error, status, kind)) + "\n").encode()

"""The API dialects this server speaks, registered in one place: how each frames an error (its
envelope, and the event that ends a stream that has begun), which status codes it answers with
instead of the usual ones, and the paths whose errors are in its words. The error table
(errors.py) says which status and which of the dialect's error types each core error gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import PoolError
from .anthropic import words as anthropic_words
from .ollama import words as ollama_words
from .openai import words as openai_words


@dataclass(frozen=True)
class Dialect:
    name: str
    envelope: Callable[[PoolError, int, str], dict]          # (error, status, its type) -> the body
    stream_error: Callable[[PoolError, int, str], bytes]     # an error after the stream began
    stream_end: bytes = b""                                  # what ends a stream after that error
    paths: tuple[str, ...] = ()                              # whose errors (404s, CSRF, shutdown) it words
    statuses: dict[int, int] = field(default_factory=dict)   # status -> the one this dialect answers

    def status(self, status: int) -> int:
        return self.statuses.get(status, status)


OPENAI = Dialect("openai", openai_words.envelope, openai_words.stream_error, stream_end=b"data: [DONE]\n\n")
# Anthropic answers 529 (overloaded) where OpenAI-style servers answer 503.
ANTHROPIC = Dialect("anthropic", anthropic_words.envelope, anthropic_words.stream_error,
                    paths=("/v1/messages",), statuses={503: 529})

# Ollama's native API: {"error": "..."}, and an NDJSON line of that shape inside a stream.
OLLAMA = Dialect("ollama", ollama_words.envelope, ollama_words.stream_error,
                 paths=("/api/version", "/api/tags", "/api/ps", "/api/show", "/api/chat", "/api/generate",
                        "/api/embed", "/api/embeddings", "/api/pull", "/api/push", "/api/create", "/api/copy",
                        "/api/delete"))

DIALECTS = (ANTHROPIC, OLLAMA, OPENAI)   # the first whose paths match wins; OpenAI's words everything else


def for_path(path: str) -> Dialect:
    return next((d for d in DIALECTS if path.startswith(d.paths)), OPENAI)

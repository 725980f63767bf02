"""What a request asks of a model, as the routes hand it to the router: plain, validated values.
(Light on purpose: the routes import this, and nothing that loads MLX.)"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

# The prompt cache scope of the request being served (its API key's: pool/api/route.py sets it); the
# router gives it to every CompletionSpec (`scoped`), so no route can forget it.
REQUEST_CACHE_SCOPE: ContextVar[str | None] = ContextVar("omlx_cache_scope", default=None)


@dataclass(frozen=True)
class CompletionSpec:
    """A parsed request: chat `messages` or a completion `prompt`. None = the model's default."""
    model: str
    messages: list[dict] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    keep_alive: float | None = None
    cache_prompt: bool = True
    kv: dict = field(default_factory=dict)     # max_kv_size, kv_bits, ...: the request's own, if given
    n: int = 1                                 # choices from the one prompt
    logprobs: int | None = None                # None: off; k: each token's logprob and the top k
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    constraint: Any = None                     # a serving.constraints.Constraint: constrained decoding
    tools: tuple[dict, ...] = ()               # OpenAI function tools, for the chat template
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    context_limit: int | None = None           # the context this request may use (Ollama's num_ctx), <= the model's
    cache_scope: str | None = None             # whose cached prompt prefixes it may reuse: its API key's name
                                               # (pool/keys), or None: shared (a sharing key, no keys)

    @property
    def prompt_param(self) -> str:
        return "messages" if self.messages is not None else "prompt"


def scoped(spec: CompletionSpec) -> CompletionSpec:
    """The spec with the serving request's cache scope, unless it names one."""
    scope = REQUEST_CACHE_SCOPE.get()
    return spec if scope is None or spec.cache_scope is not None else replace(spec, cache_scope=scope)


MAX_INPUTS = 2048          # inputs in one request, as OpenAI's /v1/embeddings


@dataclass(frozen=True)
class EmbeddingSpec:
    """A parsed request: each input a text or a list of token ids (a text's own, no special tokens)."""
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    dimensions: int | None = None
    keep_alive: float | None = None
    truncate: bool = False          # an input over the model's limit is cut to it (Ollama's default), not a 400

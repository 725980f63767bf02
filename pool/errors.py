"""The core's errors: what went wrong, as values. None knows an HTTP status or an API's words.

Each carries a plain-English `message` (API-neutral), a machine `code`, the request field it concerns
(`param`) where one does, and its facts as attributes. pool/api/errors.py maps each class to a status
and each dialect's error type, in one table; a dialect words the errors whose sentence clients read
(pool/api/openai/words.py, pool/api/anthropic/words.py)."""

from __future__ import annotations

from typing import Any

from .policy.vocabulary import Rejection


class PoolError(Exception):
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, **facts: Any):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.facts = facts          # shown in OpenAI's envelope beside the message (running, blockers, ...)


class InvalidRequest(PoolError):
    """The request cannot be served as asked; the client must change it."""


class ContextLengthExceeded(InvalidRequest):
    """The prompt, or the prompt and the max_tokens asked for, cannot fit the model's context.
    `part` is PROMPT (the prompt alone fills it), COMPLETION (max_tokens does not fit beside it) or
    CHARACTERS (refused by its size before it was tokenised: `characters` > `max_characters`)."""
    code = "context_length_exceeded"
    PROMPT, COMPLETION, CHARACTERS = "prompt", "completion", "characters"

    def __init__(self, *, part: str, context: int, prompt_param: str, prompt_tokens: int | None = None,
                 max_tokens: int | None = None, characters: int | None = None, max_characters: int | None = None,
                 chars_per_token: int | None = None):
        self.part, self.context, self.prompt_param = part, context, prompt_param
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.characters, self.max_characters, self.chars_per_token = characters, max_characters, chars_per_token
        if part == self.CHARACTERS:
            message = (f"The prompt holds {characters} characters; no prompt of more than {max_characters} "
                       f"characters can fit this model's context of {context} tokens.")
            facts: dict[str, Any] = {"context_length": context, "prompt_characters": characters}
        elif part == self.PROMPT:
            message = f"The prompt is {prompt_tokens} tokens; this model's context is {context} tokens."
            facts = {"context_length": context, "prompt_tokens": prompt_tokens}
        else:
            message = (f"The prompt ({prompt_tokens} tokens) and max_tokens ({max_tokens}) exceed this model's "
                       f"context of {context} tokens.")
            facts = {"context_length": context, "prompt_tokens": prompt_tokens}
        super().__init__(message, param="max_tokens" if part == self.COMPLETION else prompt_param, **facts)


class InvalidImage(InvalidRequest):
    """An image in the request cannot be read, breaks a limit (OMLX_MAX_IMAGES and the other image
    settings) or comes from a place the server does not fetch; `param` is the image's field, as its
    dialect names it. `code`: invalid_image, too_many_images, image_too_large, image_url_refused,
    image_fetch_failed."""
    code = "invalid_image"


class ModelCannotSeeImages(InvalidRequest):
    """The messages carry images and the model has no `vision` capability (pool/catalog/kinds.py)."""
    code = "model_not_vision"

    def __init__(self, *, model: str):
        self.model = model
        super().__init__(f"The model '{model}' takes text only; it cannot see images (send a vision model, or "
                         "leave the images out).", param="messages")


class WrongKind(InvalidRequest):
    """A request for one kind of model (pool/catalog/kinds.py) names a model of another kind."""
    code = "model_kind_mismatch"

    def __init__(self, *, model: str, kind: str, noun: str, wanted: str, wanted_noun: str, alternatives: list[str]):
        self.model, self.kind, self.noun, self.alternatives = model, kind, noun, alternatives
        self.wanted, self.wanted_noun = wanted, wanted_noun
        super().__init__(f"'{model}' is {noun}; this request needs {wanted_noun} (available: "
                         f"{', '.join(alternatives) or 'none'}).", param="model")


class ModelNotFound(PoolError):
    code = "model_not_found"

    def __init__(self, name: str, available: list[str]):
        self.name, self.available = name, available
        super().__init__(f"The model '{name}' does not exist. Available models: {', '.join(available) or 'none'}",
                         param="model")


class ModelUnavailable(PoolError):
    """The model failed to load; not retried until models are re-discovered."""
    code = "model_unavailable"


class ModelBusy(PoolError):
    """An operator's unload or load cannot happen now (the model serves requests, or is loading)."""
    code = "model_busy"


class LoadAborted(PoolError):
    code = "load_aborted"


class InsufficientMemory(PoolError):
    """The model cannot be loaded beside the ones that must stay (pinned, busy)."""
    code = "insufficient_memory"


class ModelTooLarge(InsufficientMemory):
    code = "model_too_large"


class Busy(PoolError):
    """Not now, perhaps shortly: memory pressure, a full queue, an aborted request, the server
    starting or stopping. `retry_after` is the seconds a client should wait."""
    code = "memory_pressure"

    def __init__(self, message: str, *, retry_after: float = 5, **kw: Any):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ModelQueueFull(Busy):
    """The model runs its OMLX_MAX_CONCURRENT requests and OMLX_QUEUE_PER_MODEL more wait."""
    code = Rejection.MODEL_QUEUE_FULL


class ServerNotReady(Busy):
    """The runtime could not start (its database, say); every route says so until it can."""
    code = "server_not_ready"


class DatabaseBusy(Busy):
    """Another process held the database's write lock past OMLX_DB_BUSY_TIMEOUT; nothing was changed."""
    code = "database_busy"


class HostUnavailable(Busy):
    """The fleet host a request went to stopped answering: before its answer began (after one retry
    on another host), or in the middle of it."""
    code = "host_unavailable"


class EngineFailure(PoolError):
    code = "engine_error"


class StorageUnavailable(PoolError):
    """A change the client asked for cannot be stored: the data folder is full or read-only. Nothing
    was changed (code `storage_full` or `storage_read_only`)."""
    code = "insufficient_storage"

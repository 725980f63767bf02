"""Domain errors. Each knows its HTTP status and OpenAI error code; pool/api/errors.py renders
them, in one place, as OpenAI's envelope."""

from __future__ import annotations

from .policy.vocabulary import Rejection


class PoolError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, **extra):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}
        self.extra = extra


class BadRequest(PoolError):
    status, type = 400, "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    """The prompt, or the prompt and the max_tokens asked for, cannot fit the model's context. The
    message is OpenAI's wording; `anthropic_message` is Anthropic's, for the Messages routes."""
    code = "context_length_exceeded"

    def __init__(self, message: str, *, anthropic_message: str, **kw):
        super().__init__(message, **kw)
        self.anthropic_message = anthropic_message


class Unauthorized(PoolError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(PoolError):
    status, type, code = 403, "permission_error", "forbidden"


class ModelNotFound(PoolError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class NotFound(PoolError):
    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(PoolError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class ModelUnavailable(PoolError):
    """The model failed to load; not retried until models are re-discovered."""
    status, type, code = 409, "invalid_request_error", "model_unavailable"


class ModelBusy(PoolError):
    status, type, code = 409, "invalid_request_error", "model_busy"


class LoadAborted(PoolError):
    status, type, code = 409, "invalid_request_error", "load_aborted"


class InsufficientMemory(PoolError):
    status, type, code = 507, "server_error", "insufficient_memory"


class ModelTooLarge(InsufficientMemory):
    code = "model_too_large"


class ServiceUnavailable(PoolError):
    """Admission paused by memory pressure, or a request aborted by the enforcer."""
    status, type, code = 503, "server_error", "memory_pressure"

    def __init__(self, message: str, *, retry_after: int = 5, **kw):
        super().__init__(message, headers={"Retry-After": str(retry_after)}, **kw)


class ModelQueueFull(ServiceUnavailable):
    """The model runs its OMLX_MAX_CONCURRENT requests and OMLX_QUEUE_PER_MODEL more wait."""
    code = Rejection.MODEL_QUEUE_FULL


class EngineFailure(PoolError):
    status, type, code = 500, "server_error", "engine_error"


class ServerNotReady(ServiceUnavailable):
    """The runtime could not start (its database, say); every route says so until it can."""
    code = "server_not_ready"


class DatabaseBusy(ServiceUnavailable):
    """Another process held the database's write lock past OMLX_DB_BUSY_TIMEOUT; nothing was changed."""
    code = "database_busy"


class StorageUnavailable(PoolError):
    """A change the client asked for cannot be stored: the data folder is full or read-only. Nothing
    was changed (code `storage_full` or `storage_read_only`)."""
    status, type, code = 507, "server_error", "insufficient_storage"

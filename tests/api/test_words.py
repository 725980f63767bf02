"""How each dialect words and frames the core's errors: the error table (status, each dialect's type),
the envelopes, the stream's error events, and the sentences clients read (a context refusal, a model
of the wrong kind)."""

from __future__ import annotations

import json

import pytest

from pool.api.anthropic import words as anthropic
from pool.api.dialects import ANTHROPIC, OPENAI, for_path
from pool.api.errors import (
    ERRORS,
    Forbidden,
    MethodNotAllowed,
    RequestTooLarge,
    RouteNotFound,
    Unauthorized,
    envelope,
    error_response,
    status_of,
    stream_error,
)
from pool.api.openai import words as openai
from pool.errors import (
    Busy,
    ContextLengthExceeded,
    EngineFailure,
    InsufficientMemory,
    InvalidRequest,
    LoadAborted,
    ModelBusy,
    ModelNotFound,
    ModelQueueFull,
    ModelTooLarge,
    ModelUnavailable,
    PoolError,
    ServerNotReady,
    StorageUnavailable,
    WrongKind,
)


def prompt_refused(param: str = "messages") -> ContextLengthExceeded:
    return ContextLengthExceeded(part="prompt", context=256, prompt_param=param, prompt_tokens=600)


def completion_refused() -> ContextLengthExceeded:
    return ContextLengthExceeded(part="completion", context=256, prompt_param="messages", prompt_tokens=600,
                                 max_tokens=400)


def size_refused() -> ContextLengthExceeded:
    return ContextLengthExceeded(part="characters", context=8192, prompt_param="messages", characters=10_000_000,
                                 max_characters=131072, chars_per_token=16)


ROWS = [  # error, status (OpenAI's routes), OpenAI's type, status (Anthropic's), Anthropic's type
    (InvalidRequest("x"), 400, "invalid_request_error", 400, "invalid_request_error"),
    (prompt_refused(), 400, "invalid_request_error", 400, "invalid_request_error"),
    (WrongKind(model="m", kind="embeddings", noun="an embedding model", wanted="chat", wanted_noun="a chat model",
               alternatives=[]),
     400, "invalid_request_error", 400, "invalid_request_error"),
    (Unauthorized("x"), 401, "authentication_error", 401, "authentication_error"),
    (Forbidden("x"), 403, "permission_error", 403, "permission_error"),
    (ModelNotFound("x", []), 404, "invalid_request_error", 404, "not_found_error"),
    (RouteNotFound("x"), 404, "invalid_request_error", 404, "not_found_error"),
    (MethodNotAllowed("x"), 405, "invalid_request_error", 405, "invalid_request_error"),
    (ModelUnavailable("x"), 409, "invalid_request_error", 409, "invalid_request_error"),
    (ModelBusy("x"), 409, "invalid_request_error", 409, "invalid_request_error"),
    (LoadAborted("x"), 409, "invalid_request_error", 409, "invalid_request_error"),
    (RequestTooLarge("x"), 413, "invalid_request_error", 413, "request_too_large"),
    (EngineFailure("x"), 500, "server_error", 500, "api_error"),
    (PoolError("x"), 500, "server_error", 500, "api_error"),
    (Busy("x"), 503, "server_error", 529, "overloaded_error"),
    (ModelQueueFull("x", retry_after=2), 503, "server_error", 529, "overloaded_error"),
    (ServerNotReady("x"), 503, "server_error", 529, "overloaded_error"),
    (InsufficientMemory("x"), 507, "server_error", 507, "api_error"),
    (ModelTooLarge("x"), 507, "server_error", 507, "api_error"),
    (StorageUnavailable("x"), 507, "server_error", 507, "api_error"),
]


@pytest.mark.parametrize("error, status, kind, a_status, a_kind", ROWS, ids=[type(r[0]).__name__ for r in ROWS])
def test_the_error_table(error, status, kind, a_status, a_kind):
    assert (status_of(error, OPENAI), envelope(error, OPENAI)["error"]["type"]) == (status, kind)
    assert (status_of(error, ANTHROPIC), envelope(error, ANTHROPIC)["error"]["type"]) == (a_status, a_kind)
    assert envelope(error, OPENAI)["error"]["code"] == error.code


def test_every_core_error_has_a_row():
    import pool.errors

    core = {v for v in vars(pool.errors).values() if isinstance(v, type) and issubclass(v, PoolError)}
    # each a subclass of a row's class
    assert core - set(ERRORS) <= {ContextLengthExceeded, WrongKind, ModelTooLarge, ModelQueueFull, ServerNotReady,
                                  pool.errors.DatabaseBusy, pool.errors.HostUnavailable, pool.errors.InvalidImage,
                                  pool.errors.ModelCannotSeeImages}


def test_responses_carry_retry_after_for_busy_and_no_retry_for_the_hopeless():
    busy = error_response(Busy("x", retry_after=2.2), ANTHROPIC)
    assert (busy.status_code, busy["Retry-After"]) == (529, "3")
    too_large = error_response(ModelTooLarge("x"))
    assert too_large["x-should-retry"] == "false" and "Retry-After" not in too_large
    body = json.loads(error_response(ModelQueueFull("x", retry_after=2, running=1, queued=4)).content)
    assert body["error"]["running"] == 1 and body["error"]["queued"] == 4     # facts beside the message


def test_a_stream_ends_with_the_dialects_error_event_whatever_failed():
    openai_end = stream_error(Busy("busy"), OPENAI)
    assert openai_end.startswith(b'data: {"error"') and openai_end.endswith(b"data: [DONE]\n\n")
    assert stream_error(Busy("busy"), ANTHROPIC).startswith(b'event: error\ndata: {"type": "error"')
    unexpected = stream_error(ValueError("a bug"), ANTHROPIC)
    assert b"overloaded_error" not in unexpected and b"api_error" in unexpected and b"a bug" not in unexpected


def test_errors_are_worded_by_path():
    assert [for_path(p) for p in ("/v1/messages", "/v1/messages/x", "/v1/models", "/api/pool")] == \
        [ANTHROPIC, ANTHROPIC, OPENAI, OPENAI]


@pytest.mark.parametrize("error, expected", [
    (prompt_refused(), "This model's maximum context length is 256 tokens. However, your messages resulted in 600 "
                       "tokens. Please reduce the length of the messages."),
    (prompt_refused("prompt"), "This model's maximum context length is 256 tokens. However, your prompt resulted "
                               "in 600 tokens. Please reduce the length of the prompt."),
    (completion_refused(), "This model's maximum context length is 256 tokens. However, you requested 1000 tokens "
                           "(600 in the messages, 400 in the completion). Please reduce the length of the messages "
                           "or completion."),
])
def test_openai_words_a_context_refusal_as_openai_does(error, expected):
    assert openai.message(error) == expected


@pytest.mark.parametrize("error, expected", [
    (prompt_refused(), "prompt is too long: 600 tokens > 255 maximum"),
    (completion_refused(), "input length and `max_tokens` exceed context limit: 600 + 400 > 256, decrease input "
                           "length or `max_tokens` and try again"),
])
def test_anthropic_words_a_context_refusal_as_anthropic_does(error, expected):
    assert anthropic.message(error) == expected


def test_a_size_refusal_names_the_limit_and_the_setting_in_both_dialects():
    said = openai.message(size_refused()), anthropic.message(size_refused())
    for text in said:
        assert "10000000" in text and "131072" in text and "8192" in text and "OMLX_PROMPT_CHARS_PER_TOKEN" in text
    assert said[0].startswith("'messages' holds 10000000 characters") and said[1].startswith("prompt is too long")


def test_a_model_of_the_wrong_kind_is_named_with_the_routes_it_serves():
    embedding = WrongKind(model="minilm", kind="embeddings", noun="an embedding model", wanted="chat",
                          wanted_noun="a chat model", alternatives=["smol"])
    chat = WrongKind(model="smol", kind="chat", noun="a chat model", wanted="embeddings",
                     wanted_noun="an embedding model", alternatives=["minilm"])
    assert openai.message(embedding).startswith("'minilm' is an embedding model: it serves /v1/embeddings")
    assert openai.message(chat).endswith("not /v1/embeddings, which needs an embedding model (available: minilm).")
    assert "/v1/messages needs a chat model (available: smol)" in anthropic.message(embedding)

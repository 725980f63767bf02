"""A stream that has begun ends the same way in every dialect whatever fails: the dialect's error
event (OpenAI's `data:` error and `[DONE]`, Anthropic's `error` event), never a torn stream, and the
model's lease is released."""

from __future__ import annotations

import json

import pytest

from pool.errors import Busy
from pool.serving.completion import Completion

TINY = "tiny"


@pytest.fixture(scope="module")
def server(module_asgi_server, make_model):
    return module_asgi_server({TINY: make_model("tiny-20", 20)})


def failing_after_one_chunk(error: BaseException):
    real = Completion.chunks

    async def chunks(self):
        async for chunk in real(self):
            yield chunk
            raise error
    return chunks


def lines(server, path: str, body: dict) -> list[str]:
    with server.stream_request("POST", path, json=body, headers=server.headers, timeout=60) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


@pytest.mark.parametrize("error, kind", [(RuntimeError("a bug"), "server_error"),
                                         (Busy("aborted", code="memory_pressure"), "server_error")])
def test_an_openai_stream_ends_with_an_error_chunk_and_done(server, monkeypatch, error, kind):
    monkeypatch.setattr(Completion, "chunks", failing_after_one_chunk(error))
    got = lines(server, "/v1/chat/completions", {"model": TINY, "stream": True, "max_tokens": 20,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert got[-1] == "data: [DONE]"
    body = json.loads(got[-2].removeprefix("data: "))
    assert body["error"]["type"] == kind and "a bug" not in got[-2]
    assert server.model(TINY)["active_requests"] == 0


@pytest.mark.parametrize("error, kind", [(RuntimeError("a bug"), "api_error"),
                                         (Busy("aborted", code="memory_pressure"), "overloaded_error")])
def test_an_anthropic_stream_ends_with_an_error_event(server, monkeypatch, error, kind):
    monkeypatch.setattr(Completion, "chunks", failing_after_one_chunk(error))
    got = lines(server, "/v1/messages", {"model": TINY, "stream": True, "max_tokens": 20,
                                         "messages": [{"role": "user", "content": "hi"}]})
    assert got[-2] == "event: error"
    body = json.loads(got[-1].removeprefix("data: "))
    assert body == {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}}
    assert "a bug" not in got[-1] and "event: message_start" in got
    assert server.model(TINY)["active_requests"] == 0

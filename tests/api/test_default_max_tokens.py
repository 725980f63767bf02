"""A client that names no output limit (Codex, aider) gets the room its prompt leaves in the model's
context, not a fixed 512 tokens (OMLX_DEFAULT_MAX_TOKENS `context`, its default); a number there, or
the model's own `max_tokens` setting, is the limit instead. A tiny random-weight llama (fast) with a
560-token context (the old default of 512 beside this prompt ended short of it) and its EOS banned, so
only a limit ends an answer."""

from __future__ import annotations

import pytest

from tests.api.test_limits import EOS_BANNED, _ctx_model

CTX = "ctx560"
STORY = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def models(tmp_path_factory, make_model):
    return {CTX: _ctx_model(tmp_path_factory.mktemp("default-max-tokens") / CTX, make_model("tiny-llama", None), 560)}


def _chat(server) -> dict:
    reply = server.post("/v1/chat/completions", {"model": CTX, "messages": STORY, "logit_bias": EOS_BANNED,
                                                 "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_without_a_limit_the_answer_runs_to_the_context(module_asgi_server, models):
    server = module_asgi_server(models, OMLX_DEFAULT_MAX_TOKENS="context")
    answer = _chat(server)
    usage = answer["usage"]
    assert answer["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 560, usage


def test_a_number_sets_the_default(module_asgi_server, models):
    server = module_asgi_server(models, OMLX_DEFAULT_MAX_TOKENS="40")
    assert _chat(server)["usage"]["completion_tokens"] == 40

"""Named API keys through a real server and the official SDKs (issue 23): made, listed, revoked and
rotated with `manage.py keys`; a model-limited key gets 403 on other models and sees only its own;
a rate-limited key gets 429 with Retry-After in each dialect's envelope; /metrics counts by key name;
a fleet's hop carries the key's name, believed only with the fleet key."""

from __future__ import annotations

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conftest import DEMO
from tests.keys.helpers import BOOT, FLEET, bearer, keys, made, status

MINILM = "all-MiniLM-L6-v2"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir, minilm_dir):
    return module_server({DEMO: demo_model_dir, MINILM: minilm_dir}, OMLX_API_KEY=BOOT, OMLX_FLEET_KEY=FLEET)


@pytest.fixture(scope="module")
def limited(server) -> str:
    return made(server, "limited", "--models", DEMO)


def oa(server, key: str) -> openai.OpenAI:
    return server.openai(api_key=key)


def an(server, key: str) -> anthropic.Anthropic:
    return server.anthropic(api_key=key)


def test_a_key_made_with_the_command_is_served_listed_without_its_secret_and_rotated(server):
    plain = made(server, "alice", "--rate", "600/min")
    reply = oa(server, plain).chat.completions.create(model=DEMO, messages=HI, max_tokens=2)
    assert reply.choices[0].message.content is not None
    listing = keys(server, "list")
    assert "alice" in listing and plain[:12] in listing and plain not in listing and "600/min" in listing
    rotated = keys(server, "rotate", "alice")
    assert rotated.startswith("omlx-") and rotated != plain
    server.wait_for(lambda: status(server, plain) == 401)                  # the old secret goes
    assert status(server, rotated) == 200
    assert status(server, BOOT) == 200                                     # OMLX_API_KEY stays the bootstrap key
    assert status(server, "omlx-made-up") == 401 and server.fetch("GET", "/v1/models", timeout=10).status_code == 401


def test_a_revoked_key_is_refused(server):
    plain = made(server, "short-lived")
    assert keys(server, "revoke", "short-lived") == "short-lived: revoked"
    server.wait_for(lambda: status(server, plain) == 401)
    with pytest.raises(openai.AuthenticationError):
        oa(server, plain).models.list()
    assert status(server, plain, "/api/tags") == 401 and "revoked" in keys(server, "list")


def test_a_named_key_is_a_clients_not_an_operators(server, limited):
    refused = server.fetch("GET", "/api/pool", headers=bearer(limited), timeout=10)
    assert refused.status_code == 403 and "is a client's" in refused.json()["error"]["message"]
    assert status(server, limited, "/metrics") == 403
    assert status(server, BOOT, "/api/pool") == 200


def test_a_model_limited_key_gets_403_on_other_models_in_each_dialect(server, limited):
    with pytest.raises(openai.PermissionDeniedError) as e:
        oa(server, limited).embeddings.create(model=MINILM, input="x")
    assert e.value.status_code == 403 and e.value.body["code"] == "model_not_allowed"
    assert DEMO in e.value.body["message"]
    with pytest.raises(openai.PermissionDeniedError):
        oa(server, limited).chat.completions.create(model=MINILM, messages=HI, max_tokens=2)
    with pytest.raises(anthropic.PermissionDeniedError) as a:
        an(server, limited).messages.create(model=MINILM, messages=HI, max_tokens=2)
    assert a.value.body["error"]["type"] == "permission_error"
    with ollama.Client(host=server.url, headers=bearer(limited)) as client, pytest.raises(ollama.ResponseError) as o:
        client.embed(model=MINILM, input="x")
    assert o.value.status_code == 403 and "may not use" in o.value.error
    with pytest.raises(openai.PermissionDeniedError):
        oa(server, limited).models.retrieve(MINILM)
    assert oa(server, limited).chat.completions.create(model=DEMO, messages=HI, max_tokens=2).choices
    assert oa(server, BOOT).embeddings.create(model=MINILM, input="x").data       # the bootstrap key: every model


def test_a_model_limited_key_sees_only_its_models(server, limited):
    assert [m.id for m in oa(server, limited).models.list()] == [DEMO]
    assert {m.id for m in oa(server, BOOT).models.list()} == {DEMO, MINILM}
    with ollama.Client(host=server.url, headers=bearer(limited)) as client:
        assert [m.model for m in client.list().models] == [f"{DEMO}:latest"]
    with pytest.raises(openai.NotFoundError) as e:
        oa(server, limited).chat.completions.create(model="no-such-model", messages=HI, max_tokens=2)
    assert MINILM not in e.value.body["message"] and DEMO in e.value.body["message"]


def test_a_rate_limited_key_gets_429_with_retry_after_in_each_dialect(server):
    slow = made(server, "slow", "--rate", "1/min")         # made() used its one request of the minute
    with pytest.raises(openai.RateLimitError) as e:
        oa(server, slow).models.list()
    assert e.value.body["code"] == "rate_limit_exceeded" and e.value.body["type"] == "requests"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    with pytest.raises(anthropic.RateLimitError) as a:
        an(server, slow).messages.create(model=DEMO, messages=HI, max_tokens=2)
    assert a.value.status_code == 429 and a.value.body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(a.value.response.headers["retry-after"]) <= 60
    with ollama.Client(host=server.url, headers=bearer(slow)) as client, pytest.raises(ollama.ResponseError) as o:
        client.chat(model=DEMO, messages=HI)
    assert o.value.status_code == 429 and "1 requests a minute" in o.value.error
    raw = server.fetch("GET", "/api/tags", headers=bearer(slow), timeout=10)
    assert raw.status_code == 429 and list(raw.json()) == ["error"] and 1 <= int(raw.headers["retry-after"]) <= 60
    assert status(server, BOOT) == 200                                     # other keys are not held up


def test_metrics_count_requests_by_key_name(server, limited):
    oa(server, limited).models.list()
    text = server.fetch("GET", "/metrics", headers=bearer(BOOT), timeout=10).text
    assert 'key_requests_total{key="limited",status="200"}' in text
    assert 'key_requests_total{key="limited",status="403"}' in text
    assert 'key_requests_total{key="bootstrap",status="200"}' in text


HOP = {"x-omlx-forwarded": "another-host", "x-omlx-fleet-key": FLEET}


def test_a_hop_carries_the_keys_name_believed_only_with_the_fleet_key(server, limited):
    body = {"model": MINILM, "messages": HI, "max_tokens": 2}
    refused = server.fetch("POST", "/v1/chat/completions", json=body, timeout=60,
                           headers={**HOP, "x-omlx-key-name": "limited"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    served = server.fetch("POST", "/v1/chat/completions", json={**body, "model": DEMO}, timeout=60,
                          headers={**HOP, "x-omlx-key-name": "limited"})
    assert served.status_code == 200, served.text
    unknown = server.fetch("POST", "/v1/chat/completions", json={**body, "model": DEMO}, timeout=60,
                           headers={**HOP, "x-omlx-key-name": "known-where-it-entered"})
    assert unknown.status_code == 200                  # the host it entered checked it (a database of its own)
    forged = server.fetch("POST", "/v1/chat/completions", json=body, timeout=60, headers={
        "x-omlx-forwarded": "x", "x-omlx-fleet-key": "wrong", "x-omlx-key-name": "bootstrap"})
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "forbidden"
    alone = server.fetch("POST", "/v1/chat/completions", json=body, timeout=60,   # without the fleet's headers
                         headers={**bearer(limited), "x-omlx-key-name": "bootstrap"})
    assert alone.status_code == 403 and alone.json()["error"]["code"] == "model_not_allowed"


def test_the_hop_sends_the_name_and_never_a_clients(server):
    from pool.fleet.proxy import hop_headers

    sent = hop_headers(httpx.Headers({"authorization": "Bearer x", "x-omlx-key-name": "bootstrap"}),
                       origin="h1", fleet_key="k", key_name="alice")
    assert sent["x-omlx-key-name"] == "alice" and "authorization" not in sent
    assert "x-omlx-key-name" not in hop_headers(httpx.Headers({"x-omlx-key-name": "bootstrap"}), origin="h1",
                                                fleet_key="k")

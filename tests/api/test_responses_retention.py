"""Stored responses' retention on a real server: OMLX_RESPONSES_MAX keeps the newest, a response past
OMLX_RESPONSES_DAYS is a 400 as previous_response_id (never a silent fresh start), and
OMLX_RESPONSES_DAYS=0 stores nothing."""

import time

import httpx
import openai
import pytest

from tests.conftest import DEMO

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder


def create(client, **kw):
    return client.responses.create(model=DEMO, input="Say hi.", max_output_tokens=3, **kw)


def test_max_rows_keeps_the_newest(start_server):
    client = start_server(OMLX_RESPONSES_MAX=2).openai()
    first, second, third = create(client), create(client), create(client)
    assert client.responses.retrieve(third.id).id == third.id
    client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_expired_previous_response_is_a_400(start_server):
    server = start_server(OMLX_RESPONSES_DAYS=2 / 86400)      # two seconds
    reply = create(server.openai())
    time.sleep(2.5)
    answer = httpx.post(server.url + "/v1/responses", json={"model": DEMO, "input": "hi",
                                                            "previous_response_id": reply.id}, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "previous_response_expired" and error["param"] == "previous_response_id"
    assert httpx.get(server.url + f"/v1/responses/{reply.id}").status_code == 404     # and it is gone


def test_days_zero_stores_nothing(start_server):
    client = start_server(OMLX_RESPONSES_DAYS=0).openai()
    reply = create(client)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)

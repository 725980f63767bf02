"""One API key's share of a model (OMLX_KEY_SHARE 0.5) through a real server: with two slots and two
queue places, a key that runs both slots and holds its one place of the queue is refused a third
request (503 model_queue_full, naming the share) while another key's request still queues, and is
served first when one of the first key's streams ends."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import httpx
import openai
import pytest

from tests.conftest import DEMO
from tests.keys.helpers import BOOT, bearer, made

EOS_BANNED = {"2": -100}   # the demo tokenizer's EOS: a stream runs until it is closed


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir}, OMLX_API_KEY=BOOT, OMLX_MAX_CONCURRENT="2",
                         OMLX_QUEUE_PER_MODEL="2", OMLX_KEY_SHARE="0.5")


def _in_thread(server, name: str, key: str, done: list) -> threading.Thread:
    def run():
        reply = server.fetch("POST", "/v1/chat/completions", headers=bearer(key), timeout=120,
                             json={"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        done.append((name, reply.status_code))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _stream(stack: ExitStack, server, key: str):
    body = {"model": DEMO, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 4000,
            "stream": True, "logit_bias": EOS_BANNED}
    stream = stack.enter_context(httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                                              headers=bearer(key), timeout=120))
    assert stream.status_code == 200
    lines = stream.iter_lines()
    for _ in range(3):             # a token: the stream runs
        next(lines)
    return lines                   # kept: a line iterator collected closes its stream


def test_a_key_holding_its_share_is_refused_while_another_key_queues_and_goes_first(server):
    flood, other = made(server, "flood"), made(server, "other")
    server.chat(DEMO, max_tokens=1)                    # loaded before the slots are taken
    done: list = []
    with ExitStack() as first, ExitStack() as second:
        streams = [_stream(first, server, flood), _stream(second, server, flood)]   # both slots: its share is one
        queued = [_in_thread(server, "flood", flood, done)]
        server.wait_for(lambda: server.model(DEMO)["queued"] == 1)
        with pytest.raises(openai.APIStatusError) as refused:
            server.openai(api_key=flood, max_retries=0).chat.completions.create(
                model=DEMO, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "model_queue_full"
        assert "its share of the queue (OMLX_KEY_SHARE)" in refused.value.body["message"]
        queued.append(_in_thread(server, "other", other, done))   # queued last: the queue's other place
        server.wait_for(lambda: server.model(DEMO)["queued"] == 2)
        first.close()                                  # one slot frees: flood still runs its share
        queued[1].join(120)
        assert done == [("other", 200)]
    queued[0].join(120)
    del streams
    assert done == [("other", 200), ("flood", 200)]

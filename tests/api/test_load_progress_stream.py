"""A streamed request that waits on a load past the keep-alive interval: progress comments before
the stream's first chunk, read through by the SDKs; a load that fails meanwhile ends the stream with
an error event that says how far it got. The weight fill is held at half-way by the test (through the
engine's LoadProgress), so the comments are seen whatever the machine's speed."""

from __future__ import annotations

import re
import threading

import pytest

from pool.engines import generator
from tests.conftest import DEMO

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def held_load(monkeypatch):
    """The demo's weight fill stops half-way until `release` is set (or fails when `fail` is)."""
    real = generator.fill_weights
    release, fail = threading.Event(), threading.Event()

    def held(model, group_bytes, progress):
        from mlx.utils import tree_flatten

        total = sum(w.nbytes for _, w in tree_flatten(model.parameters()))
        progress.begin(total)
        progress.advance(total // 2)
        assert release.wait(60), "the test never released the load"
        if fail.is_set():
            raise OSError("the disk went away")
        return real(model, group_bytes, progress)

    monkeypatch.setattr(generator, "fill_weights", held)
    yield release, fail
    release.set()


@pytest.fixture
def server(start_asgi_server):
    return start_asgi_server(OMLX_SSE_KEEPALIVE="0.05")


def _lines_releasing_at_progress(response, release) -> list[str]:
    """Every line of the stream; the held load goes on once a comment says it is half-way (before
    the weights begin to fill, the comments say 0%)."""
    lines = []
    for line in response.iter_lines():
        if line:
            lines.append(line)
        if line.startswith(": loading") and " 50% " in line:
            release.set()
    return lines


def test_a_stream_that_waits_on_a_load_gets_progress_comments(server, held_load):
    release, _ = held_load
    body = {"model": DEMO, "messages": HI, "max_tokens": 3, "stream": True}
    with server.stream_request("POST", "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = _lines_releasing_at_progress(r, release)
    comments = [line for line in lines if line.startswith(": loading")]
    assert lines[0] == comments[0], lines[:3]             # the stream begins with one
    assert all(re.fullmatch(rf": loading {DEMO} \d+% \(\S+ \w?B of \S+ \w?B\)(, ~\d+ s left)?", c)
               for c in comments), comments
    assert any(" 50% " in c for c in comments)
    data = [line for line in lines if line.startswith("data: ")]
    assert '"role": "assistant"' in data[0] and data[-1] == "data: [DONE]"


def test_the_sdks_read_through_the_comments(server, held_load):
    release, _ = held_load
    stream = server.openai().chat.completions.create(model=DEMO, messages=HI, max_tokens=3, stream=True)
    release.set()
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_a_load_that_fails_during_the_wait_says_how_far_it_got(server, held_load):
    release, fail = held_load
    fail.set()
    body = {"model": DEMO, "max_tokens": 3, "stream": True, "messages": HI}
    with server.stream_request("POST", "/v1/messages", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = _lines_releasing_at_progress(r, release)
    assert lines[0].startswith(f": loading {DEMO} ")
    error = next(line for line in lines if line.startswith("data: ") and '"error"' in line)
    assert "failed to load" in error and f"loading {DEMO} 50%" in error and "when the wait ended" in error, error


def test_the_responses_stream_gets_them_too(server, held_load):
    release, _ = held_load
    body = {"model": DEMO, "input": "hi", "max_output_tokens": 3, "stream": True, "store": False}
    with server.stream_request("POST", "/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = _lines_releasing_at_progress(r, release)
    assert lines[0].startswith(f": loading {DEMO} "), lines[:3]
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete"), events

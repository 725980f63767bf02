"""The requests a host's fleet record carries (Traces.published): the in-flight ones that reached a
model and the newest finished ones, row for row as the websocket's `requests` message gives them,
never a body; and a request's start, end or cancel calls every listener, the fleet member's too."""

from types import SimpleNamespace

from pool.policy.vocabulary import Change
from pool.traces.registry import PUBLISHED, Traces


def traces(*, on_change=None) -> Traces:
    made = Traces(SimpleNamespace(traces=True, trace_rows=1000, trace_days=1.0), on_change=on_change)
    made.writer = SimpleNamespace(submit=lambda row: True)     # no thread, no database
    return made


def served(registry: Traces, model: str = "m", *, body: bytes | None = None):
    trace = registry.begin(route="/v1/chat/completions", dialect="openai", key=None)
    trace.model, trace.host = model, "alpha"
    if body is not None:
        trace.body_cap = 100
    return trace


def settled(rows: list[dict]) -> list[dict]:
    """The rows without what moves between two reads: an in-flight trace's duration."""
    return [{k: v for k, v in row.items() if k != "duration_ms"} for row in rows]


def test_the_record_carries_the_in_flight_and_the_newest_finished_without_bodies():
    registry = traces()
    finished = []
    for _ in range(PUBLISHED + 5):
        trace = served(registry, body=b"a secret prompt")
        trace.response_text.append("a secret answer")
        registry.end(trace, status=200, request_body=b"a secret prompt")
        finished.append(trace.id)
    running = served(registry)
    registry.begin(route="/v1/models", dialect="openai", key=None)      # never reaches a model

    published = registry.published()
    message = registry.message()
    assert [t["id"] for t in published["in_flight"]] == [running.id]
    assert settled(published["in_flight"]) == settled(message["in_flight"])
    assert [t["id"] for t in published["recent"]] == finished[::-1][:PUBLISHED]      # newest first
    assert published["recent"] == message["recent"][:PUBLISHED]
    assert all("body" not in t and t["host"] == "alpha" and t["phase"] == "done" for t in published["recent"])
    assert "secret" not in repr(published)
    assert len(registry.published(recent=3)["recent"]) == 3


def test_nothing_is_published_with_traces_off():
    registry = Traces(SimpleNamespace(traces=False, trace_rows=10, trace_days=1.0))
    assert registry.begin(route="/v1/completions", dialect="openai", key=None) is None
    assert registry.published() == {"in_flight": [], "recent": []}


def test_a_start_an_end_and_a_cancel_call_every_listener():
    calls: list[str] = []
    registry = traces(on_change=lambda: calls.append("page"))
    registry.watch(lambda: calls.append("fleet"))
    trace = served(registry)
    registry.on_pool_change(SimpleNamespace(kind=Change.REQUEST_START, model="m"))
    assert calls == ["page", "fleet"]
    assert registry.cancel(trace.id) and calls[2:] == ["page", "fleet"]
    registry.end(trace, status=503)
    registry.end(trace, status=503)                    # ended already: no change
    assert calls[4:] == ["page", "fleet"]

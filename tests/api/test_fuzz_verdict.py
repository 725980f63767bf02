"""The fuzz tests' verdict on one answer (tests/api/fuzz_verdict.py) as a table of answers, and the strict
JSON it rests on (pool/strict_json.py): what loads_strict refuses, and snapshots encoded without non-finite
numbers so that browsers can parse them. The fuzzing itself is in test_fuzz.py."""

from __future__ import annotations

import pytest

from pool.strict_json import dumps_finite, loads_strict
from tests.api.fuzz_verdict import ANTHROPIC, OLLAMA, OPENAI, RESPONSES, answer_problem


@pytest.mark.parametrize("style, status, content_type, raw, problem", [
    (OPENAI, 200, "application/json", b'{"id": 1}', None),
    (OPENAI, 400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}', None),
    (ANTHROPIC, 404, "application/json", b'{"type": "error", "error": {"type": "not_found_error", "message": "m"}}',
     None),
    (OPENAI, 500, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": "x"}}',
     "status 500"),
    (OPENAI, 400, "application/json", b'{"type": "error", "error": {"type": "x", "message": "m"}}', "openai error"),
    (ANTHROPIC, 400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}',
     "anthropic error"),
    (OPENAI, 200, "application/json", b'{"keep_alive": NaN}', "not strict JSON"),
    (OPENAI, 400, "text/html", b"<h1>Bad Request</h1>", "not strict JSON"),
    (OPENAI, 200, "text/event-stream", b'data: {"a": 1}\n\ndata: [DONE]\n\n', None),
    (OPENAI, 200, "text/event-stream", b'data: {"a": 1}\n\n', "did not end"),
    (OPENAI, 200, "text/event-stream",
     b'data: {"error": {"code": "internal_error"}}\n\ndata: [DONE]\n\n', "internal error"),
    (ANTHROPIC, 200, "text/event-stream", b'event: message_stop\ndata: {"type": "message_stop"}\n\n', None),
    (OLLAMA, 404, "application/json", b'{"error": "model \\"x\\" not found"}', None),
    (OLLAMA, 400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}',
     "ollama error"),
    (OLLAMA, 400, "application/json", b'{"error": ""}', "ollama error"),
    (OLLAMA, 200, "application/x-ndjson", b'{"response": "a", "done": false}\n{"done": true}\n', None),
    (OLLAMA, 200, "application/x-ndjson", b'{"response": "a", "done": false}\n', "did not end"),
    (OLLAMA, 200, "application/x-ndjson", b'{"response": "a"}\n{"error": "an internal error"}\n', "internal error"),
    (OLLAMA, 200, "application/x-ndjson", b'{"done": true}\nNaN\n', "not strict JSON"),
    (OLLAMA, 400, "application/x-ndjson", b'{"error": "x"}\n', "NDJSON stream with status 400"),
    (RESPONSES, 200, "text/event-stream",
     b'event: response.completed\ndata: {"type": "response.completed", "sequence_number": 9}\n\n', None),
    (RESPONSES, 200, "text/event-stream",
     b'event: response.failed\ndata: {"type": "response.failed", "sequence_number": 3}\n\n', None),
    (RESPONSES, 200, "text/event-stream",
     b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta"}\n\n', "did not end"),
    (RESPONSES, 200, "text/event-stream", b'event: error\ndata: {"type": "error", "code": "internal_error"}\n\n'
     b'event: response.failed\ndata: {"type": "response.failed"}\n\n', "internal error"),
    (RESPONSES, 400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}',
     None),
])
def test_answer_problem(style, status, content_type, raw, problem):
    found = answer_problem(style, status, content_type, raw)
    assert (found is None) if problem is None else (problem in (found or "")), found


@pytest.mark.parametrize("text, refused", [
    ('{"a": "\\ud83d\\ude00"}', None),                     # an escaped pair: one emoji
    ('"\\\\ud800"', None),                                    # an escaped backslash, then text
    ('{"a": -1e308, "b": 100000000000000000000000000000}', None),
    ('{"a": "\\ud800"}', "lone surrogate"),
    ('{"\\udfff": 1}', "lone surrogate"),
    ("NaN", "not a JSON number"),
    ("1e400", "out of range"),
    ("9" * 400, "out of range"),
    ("[" * 100_000, "nested too deeply"),
])
def test_loads_strict(text, refused):
    if refused is None:
        loads_strict(text)
    else:
        with pytest.raises(ValueError, match=refused):
            loads_strict(text)


@pytest.mark.parametrize("value, text", [
    ({"a": 1.5, "b": [1, "x", None]}, '{"a": 1.5, "b": [1, "x", null]}'),
    ({"keep_alive": float("nan")}, '{"keep_alive": null}'),
    ([float("inf"), {"b": (float("-inf"), 2.0)}], '[null, {"b": [null, 2.0]}]'),
])
def test_snapshots_are_encoded_without_non_finite_numbers(value, text):
    assert dumps_finite(value) == text
    loads_strict(text)                     # what a browser's JSON.parse takes

"""Decision tables for pool.policy.limits: the context a request gets, what it may generate in it,
the size bound checked before tokenising, and the count and length limits."""

from __future__ import annotations

import pytest

from pool.policy.limits import (
    COMPLETION,
    PROMPT,
    ContextFit,
    context_length,
    fit_context,
    max_prompt_chars,
    prompt_chars,
    stop_problem,
    too_many,
)


@pytest.mark.parametrize("model_context, fallback, expected", [
    (8192, 32768, 8192),
    (None, 32768, 32768),
    (0, 4096, 4096),
    (-5, 4096, 4096),
    (True, 4096, 4096),          # a JSON true is not a length
    ("8192", 4096, 4096),        # nor a string
])
def test_context_length(model_context, fallback, expected):
    assert context_length(model_context, fallback) == expected


@pytest.mark.parametrize("prompt_tokens, requested, default, context, expected", [
    # the prompt alone fills the context: nothing can be generated
    (256, None, 512, 256, ContextFit(refused=PROMPT)),
    (600, 10, 512, 256, ContextFit(refused=PROMPT)),
    (255, None, 512, 256, ContextFit(1)),                 # room for one token
    # a requested max_tokens that fits is kept; one that does not is refused
    (100, 156, 512, 256, ContextFit(156)),
    (100, 157, 512, 256, ContextFit(refused=COMPLETION)),
    (10, 400, 512, 256, ContextFit(refused=COMPLETION)),
    (10, 1099511627776, 512, 8192, ContextFit(refused=COMPLETION)),
    # a default is lowered to what fits: generation ends at the context with "length"
    (100, None, 512, 256, ContextFit(156)),
    (100, None, 50, 256, ContextFit(50)),
    (10, None, 512, 8192, ContextFit(512)),
])
def test_fit_context(prompt_tokens, requested, default, context, expected):
    assert fit_context(prompt_tokens=prompt_tokens, requested=requested, default=default, context=context) == expected


def test_max_prompt_chars():
    assert max_prompt_chars(8192, 16) == 131072


@pytest.mark.parametrize("messages, prompt, expected", [
    (None, "hello", 5),
    (None, None, 0),
    ([{"role": "user", "content": "abc"}, {"role": "assistant", "content": "de"}], None, 5),
    ([{"role": "user", "content": None}], None, 0),
    ([{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]}], None, 8),
    ([{"role": "assistant", "content": "x", "tool_calls": ["not a call"]}], None, 1),
])
def test_prompt_chars(messages, prompt, expected):
    assert prompt_chars(messages, prompt) == expected


@pytest.mark.parametrize("count, limit, problem", [(3, 3, False), (4, 3, True), (0, 0, False)])
def test_too_many(count, limit, problem):
    said = too_many(count, limit)
    assert (said is not None) == problem
    if problem:
        assert str(limit) in said and str(count) in said


@pytest.mark.parametrize("stops, max_count, max_chars, problem", [
    ((), 4, 256, None),
    (("a", "b", "c", "d"), 4, 256, None),
    (("a", "b", "c", "d", "e"), 4, 256, "at most 4 stop strings"),
    (("x" * 256,), 4, 256, None),
    (("ok", "x" * 257), 4, 256, "number 1 has 257"),
    (tuple("abcdefgh"), None, 256, None),        # no count limit (Anthropic's stop_sequences)
])
def test_stop_problem(stops, max_count, max_chars, problem):
    said = stop_problem(stops, max_count=max_count, max_chars=max_chars)
    assert (said is None) if problem is None else (problem in said)

"""Checkpoints for caches that cannot be cut back (pool/engines/checkpoints.py): where a prompt's KV is
copied, how a prompt is cut for mlx-lm's insert_segments, and the chat boundaries the template gives."""

from __future__ import annotations

import pytest

from pool.engines.checkpoints import chat_marks, generation_tail, next_stop, positions, segments


@pytest.mark.parametrize(
    "marks, cached, length, expected",
    [
        ((), 0, 100, (99,)),
        ((100, 300), 0, 500, (100, 300, 499)),
        ((100, 300), 130, 500, (300, 499)),
        ((100, 300), 260, 500, (499,)),
        ((30, 300), 0, 500, (300, 499)),
        ((100, 499, 500, 650), 0, 500, (100, 499)),
        ((100,), 499, 500, ()),
        ((0, -3), 0, 1, ()),
    ],
    ids=["the-repeat-point", "the-chats-marks", "a-cached-prefix-passes-them", "a-mark-a-short-answer-past-the-cache",
         "a-short-system-prompt", "none-at-or-past-the-end", "all-but-the-last-token-cached", "a-one-token-prompt"],
)
def test_positions(marks, cached, length, expected):
    assert positions(marks, cached, length) == expected


@pytest.mark.parametrize(
    "start, at, expected",
    [
        (0, (), [[0, 1, 2, 3, 4, 5]]),
        (0, (2, 5), [[0, 1], [2, 3, 4], [5]]),
        (10, (12, 15), [[0, 1], [2, 3, 4], [5]]),
        (10, (5, 12, 99), [[0, 1], [2, 3, 4, 5]]),
        (0, (0, 6), [[0, 1, 2, 3, 4, 5]]),
    ],
    ids=["whole", "cut-at-each", "positions-are-the-prompts", "outside-ignored", "no-empty-pieces"],
)
def test_segments(start, at, expected):
    assert segments(list(range(6)), start, at) == expected


@pytest.mark.parametrize(
    "fed, at, chunk, expected",
    [(0, (), 512, 512), (0, (100,), 512, 100), (100, (100, 700), 512, 512), (300, (100, 700), 512, 400)],
    ids=["a-chunk", "stops-at-a-mark", "past-one-mark", "to-the-next"],
)
def test_next_stop(fed, at, chunk, expected):
    assert next_stop(fed, at, chunk) == expected


class Template:
    """A ChatML-like template over whitespace tokens, with a `<think>` opened for the answer and
    dropped from history, as Qwen3.5's does."""

    has_chat_template = True

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, tools=None):
        out = ["<tools>"] if tools else []
        for m in messages:
            out += [f"<{m['role']}>", *m["content"].split(), "<end>"]
        if add_generation_prompt:
            out += ["<assistant>", "<think>", "<nl>"]
        return out


def test_chat_marks_find_the_system_prompts_end_the_last_turns_end_and_the_generation_tail():
    t = Template()
    assert generation_tail(t) == 2         # "<think> <nl>" are not in the next turn's rendering of the answer
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now"}]
    prompt = t.apply_chat_template(chat, add_generation_prompt=True)
    assert prompt[:5] == ["<system>", "be", "brief", "<end>", "<user>"]
    assert prompt[8:11] == ["<assistant>", "hello", "<end>"] and prompt[-3:] == ["<assistant>", "<think>", "<nl>"]
    # the system prompt and the next message's role (every next chat with it shares that much, as
    # mlx_lm.server finds it); the turns before the last question; the generation prompt but its tail
    assert chat_marks(t, chat, None, prompt, generation_tail(t)) == (5, 11, len(prompt) - 2)
    lone = chat[1:2]
    assert chat_marks(t, lone, None, t.apply_chat_template(lone, add_generation_prompt=True), 2) == (5,)
    with_tools = t.apply_chat_template(chat, add_generation_prompt=True, tools=[{"name": "f"}])
    assert chat_marks(t, chat, [{"name": "f"}], with_tools, 2) == (6, 12, len(with_tools) - 2)


def test_a_template_that_refuses_a_partial_chat_leaves_only_the_other_marks():
    class Strict(Template):
        def apply_chat_template(self, messages, **kw):
            if messages[-1]["role"] != "user" and not kw.get("add_generation_prompt") and len(messages) > 2:
                raise ValueError("the last message must be the user's")
            return super().apply_chat_template(messages, **kw)

    t = Strict()
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now"}]
    prompt = t.apply_chat_template(chat, add_generation_prompt=True)
    assert chat_marks(t, chat, None, prompt, 2) == (5, len(prompt) - 2)

"""Checkpoints: copies of a prompt's KV at exact positions, for a model whose cache cannot be cut
back to a shorter prefix (an ArraysCache's recurrent state, a RotatingKVCache once it has wrapped,
a CacheList holding either).

A plain KVCache entry serves any prompt that shares part of it: the prompt cache trims a copy to
the shared prefix. A recurrent state holds no tokens to trim, so such a model's entries serve only
prompts that extend them exactly. So while a prompt is read, its KV is copied at the positions the
next prompts are likely to share (serving marks the chat's boundaries: the end of the system prompt,
of the earlier turns, where the next turn's rendering parts from this one) and at the prompt but
its last token (a plain repeat: the generator feeds the last token itself to get the first logits).
The copies go into the prompt cache like any entry: counted in its bytes, dropped by its cap and by
memory pressure, spilled to disk."""

from __future__ import annotations

from .disk_cache import common_prefix

# A mark is kept only where it saves a later prompt at least this many tokens of reading over the
# prefix the cache already holds: each kept mark cuts the prompt's reading into one forward pass more,
# which on a GPU costs about what reading this many tokens does (a later turn's mark at the end of the
# earlier turns lies a short answer past the entry it started from).
MARK_GAIN = 64


def positions(marks: tuple[int, ...], cached: int, length: int) -> tuple[int, ...]:
    """The positions of a `length`-token prompt whose first `cached` tokens came from the prompt
    cache at which to keep a copy: the marks at least MARK_GAIN past the cached prefix, and `length` - 1."""
    kept = {m for m in marks if cached + MARK_GAIN <= m < length - 1}
    if length - 1 > cached:
        kept.add(length - 1)
    return tuple(sorted(kept))


def segments(tokens: list[int], start: int, at: tuple[int, ...]) -> list[list[int]]:
    """`tokens` (a prompt's tokens from position `start` on) cut at each position of `at`."""
    cuts = [p - start for p in at if start < p < start + len(tokens)]
    pieces, begin = [], 0
    for cut in cuts:
        pieces.append(tokens[begin:cut])
        begin = cut
    pieces.append(tokens[begin:])
    return [p for p in pieces if p]


def next_stop(fed: int, at: tuple[int, ...], chunk: int) -> int:
    """How many tokens to read next from position `fed`: a chunk, cut short at the next position of `at`."""
    ahead = [p - fed for p in at if p > fed]
    return min([chunk, *ahead])


def chat_marks(tokenizer, messages: list[dict], tools: list[dict] | None, prompt: list[int],
               tail: int) -> tuple[int, ...]:
    """Where a chat's prompt meets the prompts the same chat sends next: the end of its system
    prompt (a new chat with the same one shares it), the end of the turns before its last user
    message (a client that edits or regenerates that message shares those), and `tail` tokens
    before its end, where the next turn's rendering of the answer parts from the generation prompt
    (`generation_tail`). The first two are found by rendering those messages alone and comparing
    tokens, as mlx_lm.server finds the system prompt's end."""
    if not getattr(tokenizer, "has_chat_template", False) or not messages:
        return ()
    extra = {"tools": list(tools)} if tools else {}
    systems = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")), len(messages))
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
    renders = [messages[:systems] + [{"role": "user", "content": ""}] if 0 < systems < len(messages) else None,
               messages[:last_user] if systems < last_user else None]
    marks = {len(prompt) - tail}
    for render in renders:
        if render is None:
            continue
        try:
            tokens = tokenizer.apply_chat_template(render, add_generation_prompt=False, tokenize=True, **extra)
        except Exception:  # noqa: BLE001 - a template may refuse a partial chat: no mark there
            continue
        marks.add(common_prefix(tokens, prompt))
    return tuple(sorted(m for m in marks if 0 < m < len(prompt) - 1))


def generation_tail(tokenizer) -> int:
    """How many of a generation prompt's last tokens the next turn's rendering of the answer does not
    share (a template that opens a `<think>` block for the answer, and drops it from history): from
    a one-message chat rendered both ways, once per tokenizer."""
    ask = [{"role": "user", "content": "x"}]
    try:
        asked = tokenizer.apply_chat_template(ask, add_generation_prompt=True, tokenize=True)
        answered = tokenizer.apply_chat_template(ask + [{"role": "assistant", "content": "."}],
                                                 add_generation_prompt=False, tokenize=True)
    except Exception:  # noqa: BLE001 - no template, or one that refuses the pair: the prompt's end serves
        return 0
    return len(asked) - common_prefix(answered, asked)

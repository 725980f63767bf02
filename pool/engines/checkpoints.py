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


def positions(marks: tuple[int, ...], cached: int, length: int) -> tuple[int, ...]:
    """The positions of a `length`-token prompt whose first `cached` tokens came from the prompt
    cache at which to keep a copy: the marks past the cached prefix, and `length` - 1."""
    kept = {m for m in marks if cached < m < length - 1}
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

"""Stop strings: which one ended a choice (`Chunk.stop_sequence`, for Anthropic's `stop_sequence`),
from a table and through `Request.advance` with the demo model's real detokenizer."""

import asyncio

import pytest
from mlx_lm.utils import load_tokenizer

from pool.engines.generation_request import Request
from pool.engines.protocol import SamplingParams
from pool.engines.stops import find_stop, stop_found


@pytest.mark.parametrize("text, stops, found", [
    ("The capital is Paris.", ("Paris",), "Paris"),
    ("The capital is Paris.", ("London", "Paris"), "Paris"),
    ("The capital is Paris.", ("is", "Paris"), "is"),            # the earliest in the text wins
    ("The capital is Paris.", ("Par", "Paris"), "Par"),          # same place: the first listed
    ("The capital is Paris.", ("Paris", "Par"), "Paris"),
    ("The capital is Paris.", ("", "Paris"), "Paris"),
])
def test_the_stop_string_that_ended_the_text(text, stops, found):
    at = find_stop(text, stops)
    assert stop_found(text, stops, at) == found and text[at:].startswith(found)


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    return load_tokenizer(demo_model_dir)


def run(tokenizer, text: str, stops: tuple[str, ...], eos_after: bool = False):
    """Feed `text`'s tokens one by one (then EOS, if asked) as the engine thread does; the chunks."""
    loop = asyncio.new_event_loop()     # the request's reader would be on it; nothing runs here
    loop.close()
    req = Request([1, 2, 3], SamplingParams(stop=stops), loop)
    req.detokenizer = tokenizer.detokenizer
    req.detokenizer.reset()
    chunks, tokens = [], tokenizer.encode(text)
    for i, token in enumerate(tokens):
        last = i == len(tokens) - 1
        chunk, stopped = req.advance(token, "length" if last and not eos_after else None)
        if chunk is not None:
            chunks.append(chunk)
        if stopped or (chunk is not None and chunk.finish_reason):
            return chunks
    chunk, _ = req.advance(tokenizer.eos_token_id, "stop")
    return chunks + [chunk]


def test_the_last_chunk_names_the_stop_string_that_ended_it(tokenizer):
    chunks = run(tokenizer, "The capital of France is Paris. It is big.", ("Paris", "big"))
    last = chunks[-1]
    assert last.finish_reason == "stop" and last.stop_sequence == "Paris"
    assert "".join(c.text for c in chunks) == "The capital of France is "
    assert all(c.stop_sequence is None for c in chunks[:-1])


@pytest.mark.parametrize("eos_after, reason", [(True, "stop"), (False, "length")])
def test_an_end_without_a_stop_string_names_none(tokenizer, eos_after, reason):
    chunks = run(tokenizer, "The capital of France is Paris.", ("London",), eos_after=eos_after)
    assert chunks[-1].finish_reason == reason and chunks[-1].stop_sequence is None
    assert "".join(c.text for c in chunks) == "The capital of France is Paris."

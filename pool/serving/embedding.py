"""Embeddings on this host: the model through the door (door.py: kind, queue, gate, lease, slot),
each input tokenized on a worker thread and checked against the model's limits, then every input of
the request encoded on the engine's thread. The vectors come back as plain float32 values: the
routes read them without numpy."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from ..catalog.kinds import EMBEDDINGS
from ..errors import InvalidRequest
from ..traces.trace import current as current_trace
from .door import Door
from .specs import EmbeddingSpec


@dataclass(frozen=True)
class Embeddings:
    model_id: str
    vectors: Any               # (inputs, dimensions) float32 array, in the order of the inputs
    prompt_tokens: int         # tokens the model read, special tokens included

    def __len__(self) -> int:
        return len(self.vectors)

    def floats(self, index: int) -> list[float]:
        return self.vectors[index].tolist()

    def little_endian_bytes(self, index: int) -> bytes:
        """The vector's float32 values as little-endian bytes (OpenAI's base64 encoding)."""
        return self.vectors[index].astype("<f4").tobytes()


def check_dimensions(requested: int | None, native: int, model_id: str) -> None:
    """Only the model's own size: a vector of a model not trained to be shortened (Matryoshka), cut
    and renormalised, loses what its dropped components held."""
    if requested is not None and requested != native:
        raise InvalidRequest(f"'{model_id}' makes {native}-dimensional vectors and was not trained to be shortened; "
                         f"'dimensions' must be {native} or left out (got {requested}).", param="dimensions")


def check_tokens(tokens: Sequence[Sequence[int]], *, max_tokens: int, vocab_size: int, model_id: str) -> None:
    """Every input fits the model (OpenAI answers a 400 rather than truncate), every id is in its vocabulary."""
    for i, ids in enumerate(tokens):
        if len(ids) > max_tokens:
            raise InvalidRequest(f"Input {i} is {len(ids)} tokens long; '{model_id}' reads at most {max_tokens} "
                             "tokens per input, special tokens included. Shorten or split it.",
                             param="input", code="context_length_exceeded")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"Input {i} has token id {bad}, outside the vocabulary of '{model_id}' "
                             f"(0 to {vocab_size - 1}).", param="input")


def truncated(ids: Sequence[int], max_tokens: int) -> list[int]:
    """An input cut to the model's limit; its last token (the closing special token) kept."""
    ids = list(ids)
    return ids if len(ids) <= max_tokens else ids[:max_tokens - 1] + ids[-1:]


async def embed(door: Door, model_id: str, spec: EmbeddingSpec) -> Embeddings:
    async with door.acquire(model_id, EMBEDDINGS, keep_alive=spec.keep_alive) as lease:
        entry, engine = lease.entry, lease.engine
        info = engine.model_info
        check_dimensions(spec.dimensions, info["dimensions"], entry.id)
        try:
            tokens = await asyncio.to_thread(engine.tokenize, spec.inputs)
        except Exception as e:  # noqa: BLE001 - input the tokenizer rejects is the client's to fix
            raise InvalidRequest(f"The model's tokenizer rejected the input: {e}", param="input") from None
        if spec.truncate:
            tokens = [truncated(ids, info["max_tokens"]) for ids in tokens]
        check_tokens(tokens, max_tokens=info["max_tokens"], vocab_size=info["vocab_size"], model_id=entry.id)
        vectors = await engine.embed(tokens)
    count = sum(len(t) for t in tokens)
    if (trace := current_trace.get()) is not None:
        trace.prompt_tokens = trace.prefill_total = trace.prefill_done = count
    return Embeddings(entry.id, vectors, count)

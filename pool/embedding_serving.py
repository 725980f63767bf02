"""The serving door for embeddings, beside pool/serving.py's for completions, with the same steps:
refuse at once when the model's queue is full, pass the admission gate, lease the model (loading it,
evicting others, if needed), take one of its concurrency slots, tokenize on a worker thread, check
the limits, and encode every input of the request on the engine's thread."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .discovery import EMBEDDINGS
from .engines.types import EngineError, RequestAborted
from .errors import BadRequest, EngineFailure, ModelQueueFull, ServiceUnavailable
from .policy.vocabulary import Rejection
from .serving import Serving

MAX_INPUTS = 2048          # inputs in one request, as OpenAI's /v1/embeddings


@dataclass(frozen=True)
class EmbeddingSpec:
    """A parsed request: each input a text or a list of token ids (a text's own, no special tokens)."""
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    dimensions: int | None = None
    keep_alive: float | None = None


@dataclass(frozen=True)
class Embeddings:
    model_id: str
    vectors: np.ndarray        # (inputs, dimensions) float32, in the order of the inputs
    prompt_tokens: int         # tokens the model read, special tokens included


def check_dimensions(requested: int | None, native: int, model_id: str) -> None:
    """Only the model's own size: a vector of a model not trained to be shortened (Matryoshka), cut
    and renormalised, loses what its dropped components held."""
    if requested is not None and requested != native:
        raise BadRequest(f"'{model_id}' makes {native}-dimensional vectors and was not trained to be shortened; "
                         f"'dimensions' must be {native} or left out (got {requested}).", param="dimensions")


def check_tokens(tokens: Sequence[Sequence[int]], *, max_tokens: int, vocab_size: int, model_id: str) -> None:
    """Every input fits the model (OpenAI answers a 400 rather than truncate), every id is in its vocabulary."""
    for i, ids in enumerate(tokens):
        if len(ids) > max_tokens:
            raise BadRequest(f"Input {i} is {len(ids)} tokens long; '{model_id}' reads at most {max_tokens} "
                             "tokens per input, special tokens included. Shorten or split it.",
                             param="input", code="context_length_exceeded")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise BadRequest(f"Input {i} has token id {bad}, outside the vocabulary of '{model_id}' "
                             f"(0 to {vocab_size - 1}).", param="input")


async def embed(serving: Serving, spec: EmbeddingSpec) -> Embeddings:
    pool, admission = serving.pool, serving.admission
    entry = pool.resolve(spec.model)
    pool.require_kind(entry, EMBEDDINGS)
    _refuse_if_queue_full(serving, entry.id)
    await admission.admit()
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(pool.lease(entry.id, keep_alive=spec.keep_alive, kind=EMBEDDINGS))
        try:   # after the lease, as open_completion does: a queued request must keep the model loaded
            await stack.enter_async_context(pool.slots.hold(entry.id))
        except ModelQueueFull:
            admission.on_reject(Rejection.MODEL_QUEUE_FULL)
            raise
        if entry.engine is not engine:
            raise ServiceUnavailable(f"The model '{entry.id}' was unloaded while the request waited "
                                     "for a slot; retry.", code="model_unloaded")
        info = engine.model_info
        check_dimensions(spec.dimensions, info["dimensions"], entry.id)
        try:
            tokens = await asyncio.to_thread(engine.tokenize, spec.inputs)
        except Exception as e:  # noqa: BLE001 - input the tokenizer rejects is the client's to fix
            raise BadRequest(f"The model's tokenizer rejected the input: {e}", param="input") from None
        check_tokens(tokens, max_tokens=info["max_tokens"], vocab_size=info["vocab_size"], model_id=entry.id)
        try:
            vectors = await engine.embed(tokens)
        except RequestAborted as e:
            raise ServiceUnavailable(f"The request was aborted: {e}", code=e.code) from None
        except EngineError as e:
            raise EngineFailure(f"The engine failed: {e}") from None
    return Embeddings(entry.id, vectors, sum(len(t) for t in tokens))


def _refuse_if_queue_full(serving: Serving, model_id: str) -> None:
    try:
        serving.pool.slots.check(model_id)
    except ModelQueueFull:
        serving.admission.on_reject(Rejection.MODEL_QUEUE_FULL)
        raise

"""What a request's logits pass through (its logits processors), and what it reads back from them
(logprobs). Both run on the engine thread, and only for requests that asked: the others' decode
steps do none of this."""

from __future__ import annotations

import functools
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_repetition_penalty, make_sampler
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, _byte_decoder

from .grammar import make_processor
from .protocol import SamplingParams, TokenLogprob

REPETITION_CONTEXT = 20     # tokens the repetition penalty looks back over (mlx-lm's default)


@functools.lru_cache(maxsize=64)
def sampler(temperature: float, top_p: float) -> Callable:
    """mlx-lm's sampler for these settings, one object for all requests with them (it keeps no
    state): a batch whose requests share one samples in one call, where distinct ones cost a call
    and a concatenate per request and step (mlx-lm's GenerationBatch; greedy was shared already)."""
    return make_sampler(temp=temperature, top_p=top_p if top_p < 1.0 else 0.0)


def logits_processors(params: SamplingParams, tokenizer) -> list[Callable]:
    """A fresh list of mlx-lm logits processors for one request (or one choice of it): logit bias,
    the penalties, then the constraint's, which must see the others' output to mask it."""
    if not params.processed:
        return []
    processors = make_logits_processors(logit_bias=dict(params.logit_bias) or None)
    if params.presence_penalty or params.frequency_penalty:
        # OpenAI's penalties count the completion so far; mlx-lm's count the last tokens, prompt included
        processors.append(over_completion(make_logits_processors(
            presence_penalty=params.presence_penalty or None, presence_context_size=params.max_tokens,
            frequency_penalty=params.frequency_penalty or None, frequency_context_size=params.max_tokens)))
    if params.repetition_penalty is not None:
        processors.append(make_repetition_penalty(params.repetition_penalty, REPETITION_CONTEXT))
    if params.constraint is not None:
        processors.append(make_processor(params.constraint.grammar, tokenizer))
    return processors


def over_completion(processors: list[Callable]) -> Callable:
    """Processors that see only the generated tokens. Both generators hand processors the prompt
    and the tokens so far, the whole prompt at the first call, so that call gives its length."""
    prompt_length: int | None = None

    def processor(tokens, logits):
        nonlocal prompt_length
        if prompt_length is None:
            prompt_length = len(tokens)
        completion = tokens[prompt_length:]
        for p in processors:
            logits = p(completion, logits)
        return logits
    return processor


class TokenText:
    """Each token's text and UTF-8 bytes as OpenAI's logprobs show them: a token alone may be part
    of a character, so its bytes are the truth and its text their lenient decoding."""

    def __init__(self, tokenizer):
        self._detokenizer = tokenizer.detokenizer
        self._tokenizer = tokenizer
        self._known: dict[int, tuple[str, tuple[int, ...]]] = {}

    def __call__(self, token: int) -> tuple[str, tuple[int, ...]]:
        known = self._known.get(token)
        if known is None:
            raw = self._bytes(token)
            known = self._known[token] = (raw.decode("utf-8", "replace"), tuple(raw))
        return known

    def _bytes(self, token: int) -> bytes:
        detok, tokenmap = self._detokenizer, getattr(self._detokenizer, "tokenmap", None)
        if tokenmap is None or token >= len(tokenmap):
            return self._tokenizer.decode([token]).encode("utf-8")
        piece = tokenmap[token]
        if isinstance(detok, BPEStreamingDetokenizer):    # GPT-2's bytes-as-characters
            decoder = _byte_decoder()
            return b"".join(bytes([decoder[c]]) if c in decoder else c.encode("utf-8") for c in piece)
        if isinstance(detok, SPMStreamingDetokenizer):
            return piece.replace(SPMStreamingDetokenizer._sep, b" ")
        return self._tokenizer.decode([token]).encode("utf-8")


def token_logprob(logprobs: Any, token: int, top: int, text: TokenText) -> TokenLogprob:
    """The chosen token's log-probability and the `top` most likely tokens, from the step's
    logprobs vector (log-softmax of the processed logits, before temperature)."""
    chosen, ranked = logprobs[token], []
    if top > 0:
        ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
        values = logprobs[ids]
        mx.eval(chosen, ids, values)
        ranked = sorted(zip(ids.tolist(), values.tolist()), key=lambda pair: -pair[1])
    name, raw = text(token)
    return TokenLogprob(name, chosen.item(), raw, tuple(_top(text, i, value) for i, value in ranked))


def _top(text: TokenText, token: int, logprob: float) -> tuple[str, float, tuple[int, ...]]:
    name, raw = text(token)
    return name, logprob, raw

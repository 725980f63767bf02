"""Warm-up: the shapes a language model will serve most, run once right after its load, so its first
requests do not pay for kernel compilation (measured on an H200: a 4-bit model's first round of 8
streams took 56 s, a warm one a few hundred ms).

Each shape is one job on the engine's own thread, run only while no request or command waits (the
worker's idle jobs): a request that arrives meanwhile goes first and waits at most for the one shape
in progress, which compiles what the request would have compiled itself. Other models' threads never
wait for it. A shape is a throwaway lane (lanes.py), the very path requests take: one prompt alone
(mlx-lm's single-sequence path, its prompt read in two chunks of a lone request's prefill step), then
batches of short prompts (the BatchGenerator's padded prefill and its decode at that batch size)."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.sample_utils import make_sampler

from .lanes import BatchLane
from .protocol import KVConfig, LoadOptions

log = logging.getLogger(__name__)

SHORT_PROMPT = 48         # tokens of each prompt of a batch shape
DECODE_TOKENS = 4         # tokens each shape generates: the decode kernels at its batch size
FIRST_TOKEN_ID = 100      # prompts are ids from here: ordinary tokens in any vocabulary


def warm_jobs(state: Callable[[], tuple[Any, list[list[int]], int, bool]], options: LoadOptions, *,
              model_id: str = "") -> list[Callable[[], None]]:
    """The jobs for the shapes `options` names, most used first. `state()` gives (model, stop tokens,
    prefill step, whether its caches can be cut back) when a job runs, so no job holds the model while
    it waits."""
    batches, prompt_tokens = options.warm_batches, options.warm_prompt
    shapes = ([(1, prompt_tokens + SHORT_PROMPT)] if prompt_tokens else []) + [(b, SHORT_PROMPT) for b in batches]
    if not shapes:
        return []
    clock = {"started": 0.0}

    def first() -> None:
        clock["started"] = time.perf_counter()

    def last() -> None:
        log.info("%s warmed %d shapes in %.1f s", model_id, len(shapes), time.perf_counter() - clock["started"])
    return [first] + [functools.partial(run_shape, state, batch, tokens) for batch, tokens in shapes] + [last]


def run_shape(state: Callable[[], tuple[Any, list[list[int]], int, bool]], batch: int, tokens: int) -> None:
    """`batch` prompts of `tokens` tokens each in a lane of their own, arriving as traffic does: one
    first (the single-sequence path), the others a step later (the handover into the batch, whose
    prefill runs beside a request decoding), each generating a token more than the one before, so
    the batch shrinks one by one back to the single path. The first run on an H200 left 16.7 s of
    kernels to the first 8 requests when every prompt entered at once and all ended together."""
    model, stop_tokens, prefill_step, trimmable = state()
    if model is None:
        return
    lane = BatchLane(model, KVConfig(), stop_tokens, trimmable=trimmable)    # the path its requests take
    try:
        lane.set_prefill_step(prefill_step)
        # greedy alone (the default), sampled in batches: both samplers' kernels get compiled
        sampler = make_sampler(temp=0.0 if batch == 1 else 0.7)
        for i in range(batch):
            prompt = [FIRST_TOKEN_ID + (i * 31 + j * 7) % 900 for j in range(tokens - i % 3)]
            lane.insert(prompt, cache=None, all_tokens=[], max_tokens=DECODE_TOKENS + i, sampler=sampler)
            if i == 0 and batch > 1:
                for _ in range(2):
                    lane.step()
        while not lane.empty:
            lane.step()
    except Exception:        # a warm-up that fails leaves the model serving, only colder
        log.exception("warming a shape (batch %d, %d tokens) failed", batch, tokens)
    finally:
        lane.close()
        del lane, model
        mx.synchronize(generation_stream)
